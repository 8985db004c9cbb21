// Entry point of kvpack_bench: measures the bandwidth probe once per thread count (before any
// case, so no case pays for it), records it and the build in the JSON context, registers the
// cases (memory, append/prefill, decode attention, split-K decode of one sequence, batched decode on the page pool, the llama.cpp peer) and runs Google Benchmark.
#include <string>

#include "bench_common.hpp"

#ifndef KVPACK_BENCH_BUILD_FLAGS
#define KVPACK_BENCH_BUILD_FLAGS "unknown"
#endif

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (int t : kvpack_bench::thread_counts()) {
    const auto& p = kvpack_bench::read_bandwidth(t);
    benchmark::AddCustomContext("probe_gbps_threads_" + std::to_string(t), std::to_string(p.gbps));
  }
  benchmark::AddCustomContext("probe_buffer_bytes", std::to_string(kvpack_bench::read_bandwidth(1).buffer_bytes));
  benchmark::AddCustomContext("kvpack_bench_build_flags", KVPACK_BENCH_BUILD_FLAGS);
  kvpack_bench::register_memory_benchmarks();
  kvpack_bench::register_append_benchmarks();
  kvpack_bench::register_attention_benchmarks();
  kvpack_bench::register_splitk_benchmarks();
  kvpack_bench::register_pool_benchmarks();
#if defined(KVPACK_BENCH_HAS_LLAMACPP)
  kvpack_bench::register_llamacpp_benchmarks();
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
