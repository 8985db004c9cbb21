// Decode attention: one query token over a one-layer cache of `ctx` tokens, per configuration
// (codec), backend, model shape, context length and thread count, beside the plain fp32/fp16
// baseline of an engine without kvpack. Counters: see set_decode_counters (bench_common.hpp).
//
// Names: decode/<config>/<backend>/<shape>/<ctx>; baselines: decode/plain-fp32|plain-fp16/baseline/...
// Threads: kvpack caches are single-threaded, so with T threads each benchmark thread owns its own
// one-layer cache (T layers decoded concurrently, the way an engine would split layers or
// sequences across cores); time per iteration is wall time / (iterations of all threads).
// Context lengths: KVPACK_BENCH_CONTEXTS (default 1024,4096,32768; add 131072 where memory allows).
#include "bench_common.hpp"

namespace kvpack_bench {
namespace {

// Minimum measuring time per case, seconds. Cases slower than this run one iteration.
constexpr double kDecodeMinTime = 0.15;

template <class Cfg, class Be>
void decode_kvpack(benchmark::State& st, BenchShape s, std::int64_t ctx) {
  using Cache = typename Cfg::template cache<typename Be::tag>;
  const std::string prefix =
      std::string("decode/") + Cfg::name + "/" + Be::name + "/" + s.name + "/" + std::to_string(ctx);
  std::string err;
  Cache* c = Fixtures::instance().get<Cache>(prefix, st.thread_index(),
                                             [&] { return build_cache<Cache>(s, ctx, /*last_chunk=*/1, err); });
  if (c == nullptr) {
    st.SkipWithError(("cache build failed: " + err).c_str());
    return;
  }
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
  set_decode_counters(st, static_cast<double>(c->memory_bytes()));
}

template <class T>
void decode_plain(benchmark::State& st, BenchShape s, std::int64_t ctx) {
  const std::string prefix = std::string("decode/plain-") + (sizeof(T) == 4 ? "fp32" : "fp16") + "/" + s.name +
                             "/" + std::to_string(ctx);
  auto* c = Fixtures::instance().get<PlainCache<T>>(prefix, st.thread_index(),
                                                    [&] { return PlainCache<T>::build(s, ctx); });
  const std::vector<float> q = make_queries(s, 1);
  std::vector<float> out(q.size());
  for (auto _ : st) {
    c->attend(q.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  if (!all_finite(out)) st.SkipWithError("baseline produced non-finite output");
  set_decode_counters(st, static_cast<double>(c->bytes()));
}

void finish(benchmark::internal::Benchmark* b) {
  for (int t : thread_counts()) b->Threads(t);
  b->UseRealTime()->MinTime(kDecodeMinTime)->Unit(benchmark::kMicrosecond);
}

}  // namespace

void register_attention_benchmarks() {
  for (const std::int64_t ctx : env_ints("KVPACK_BENCH_CONTEXTS", {1024, 4096, 32768})) {
    for (const BenchShape& s : kShapes) {
      const std::string tail = std::string("/") + s.name + "/" + std::to_string(ctx);
      finish(benchmark::RegisterBenchmark(("decode/plain-fp32/baseline" + tail).c_str(), decode_plain<float>, s, ctx));
      finish(benchmark::RegisterBenchmark(("decode/plain-fp16/baseline" + tail).c_str(), decode_plain<std::uint16_t>,
                                          s, ctx));
      for_each_type(Configs{}, [&]<class Cfg>() {
        for_each_type(Backends{}, [&]<class Be>() {
          const std::string name = std::string("decode/") + Cfg::name + "/" + Be::name + tail;
          finish(benchmark::RegisterBenchmark(name.c_str(), decode_kvpack<Cfg, Be>, s, ctx));
        });
      });
    }
  }
}

}  // namespace kvpack_bench
