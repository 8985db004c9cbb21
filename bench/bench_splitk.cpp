// Decode attention of ONE sequence on T threads: the one-layer cache of bench_attention.cpp with
// KVCache::set_executor(kvpack::thread_executor(T), T), so its KV heads and, within each head,
// T chunks of the context (split-K, kernels/split_k.hpp) run on T threads; the time is one
// token's latency. With T = 1 no executor is set (the serial kernel). Rows sit beside the
// llama.cpp peer's (bench/peers/), which splits one sequence over a ggml threadpool of T threads.
//
// Names: decode-seq/<config>/<backend>/<shape>/<ctx>/workers:<T>; counters as
// set_decode_counters with the probe at T threads. thread_executor starts T - 1 std::threads per
// attend (tens of µs, included: an engine's pool would not pay it).
#include "bench_common.hpp"

namespace kvpack_bench {
namespace {

template <class Cfg, class Be>
void decode_split(benchmark::State& st, BenchShape s, std::int64_t ctx, int workers, std::string prefix) {
  using Cache = typename Cfg::template cache<typename Be::tag>;
  std::string err;
  Cache* c = Fixtures::instance().get<Cache>(prefix, 0, [&] { return build_cache<Cache>(s, ctx, 1, err); });
  if (c == nullptr) {
    st.SkipWithError(("cache build failed: " + err).c_str());
    return;
  }
  c->set_executor(workers > 1 ? kvpack::thread_executor(workers) : kvpack::Executor{}, workers);
  const std::vector<float> q = make_queries(s, 1);
  std::vector<float> out(q.size());
  if (auto r = c->attend(0, q, out); !r || !all_finite(out)) {
    st.SkipWithError(r ? "attend produced non-finite output" : r.error().message.c_str());
    return;
  }
  for (auto _ : st) {
    auto r = c->attend(0, q, out);
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_decode_counters(st, static_cast<double>(c->memory_bytes()), workers);
}

}  // namespace

/// The split-K configurations: issue 17's targets plus one eviction case (block-sparse: skipped
/// blocks weigh nothing in the split) and per-channel keys (fp32 Q·K path).
using SplitConfigs = TypeList<cfg_fp16, cfg_int8, cfg_int4_g32, cfg_int4_g64, cfg_k8v4, cfg_kivi4, cfg_int4_bs1k>;
/// The build's best backend only (the scalar kernel's figures are in bench_attention.cpp's rows).
template <class... Bs>
struct last_backend;
template <class B>
struct last_backend<TypeList<B>> {
  using type = TypeList<B>;
};
template <class B, class... Bs>
struct last_backend<TypeList<B, Bs...>> : last_backend<TypeList<Bs...>> {};

void register_splitk_benchmarks() {
  for (const std::int64_t ctx : decode_contexts())
    for (const BenchShape& s : kShapes)
      for (int workers : thread_counts())
        for_each_type(SplitConfigs{}, [&]<class Cfg>() {
          for_each_type(typename last_backend<Backends>::type{}, [&]<class Be>() {
            const std::string name = std::string("decode-seq/") + Cfg::name + "/" + Be::name + "/" + s.name + "/" +
                                     std::to_string(ctx) + "/workers:" + std::to_string(workers);
            benchmark::RegisterBenchmark(name.c_str(), decode_split<Cfg, Be>, s, ctx, workers, name)
                ->UseRealTime()
                ->MinTime(0.15)
                ->Unit(benchmark::kMicrosecond);
          });
        });
}

}  // namespace kvpack_bench
