// Append (quantize + store) throughput and prefill attention, per configuration and backend.
//
// append/<config>/<backend>/<shape>/<n>: appending n tokens per call (n = 1: one decode step;
//   n = 512: a prefill chunk) of fp32 K and V to a one-layer cache; when the cache reaches 4096
//   tokens it is emptied with timing paused by KVCache::clear(), which keeps the block
//   allocations, zeroed, as an engine reusing its cache for the next request does (the memcpy
//   baseline's destination is touched before timing too, so neither side times page faults of
//   fresh memory). The timed call includes kvpack's NaN/Inf check, the copy of the latest chunk,
//   the residual/pending bookkeeping, the quantization itself and the zeroed blocks' first writes.
//   Counters: tok/s (tokens appended per second, all threads) and GB/s of fp32 K+V input.
// append/memcpy-fp32/baseline/<shape>/<n>: the same n tokens of fp32 K and V copied with memcpy
//   into a 4096-token destination at the same offsets (what storing the input unchecked and
//   uncompressed costs); render_table.py gives each append case as a multiple of it (issue 17:
//   append >= 0.5x memcpy of the fp32 input).
// prefill/<config>/<backend>/<shape>/4096: causal attention of a 512-token chunk (queries at
//   positions 3584..4095) over a one-layer cache of 4096 tokens; baseline prefill/plain-fp16.
//   Counters: tok/s (query tokens per second) and kv_bytes. Prefill is compute-bound (each key is
//   scored against 512 queries), so no bandwidth roofline is given.
//   Shapes: KVPACK_BENCH_PREFILL_SHAPES = "smollm2-135m" (default) or "all" (the scalar kernel
//   takes about 512 decode steps per chunk: ~5-10 s per 8B-class case on a 2-core machine).
// Threads as in decode: each benchmark thread owns its own cache.
#include <cstring>

#include "bench_common.hpp"

namespace kvpack_bench {
namespace {

constexpr std::int64_t kAppendCapacity = 4096;
constexpr double kAppendMinTime = 0.1;
constexpr std::int64_t kPrefillContext = 4096;
constexpr int kPrefillChunk = 512;

/// Input of the append cases: kAppendCapacity tokens of K/V and their positions, built once.
struct AppendInput {
  std::vector<float> k, v;
  std::vector<std::int32_t> positions;
};

/// Counters of the append cases: tokens per second and GB/s of fp32 K+V input.
void set_append_counters(benchmark::State& st, std::int64_t n, std::size_t row) {
  const double toks = static_cast<double>(st.iterations()) * static_cast<double>(n);
  using C = benchmark::Counter;
  st.counters["tok/s"] = C(toks, C::kIsRate);
  st.counters["GB/s"] = C(toks * static_cast<double>(row) * 2 * sizeof(float) / 1e9, C::kIsRate);
}

/// The input of the append cases of shape s, per benchmark thread (built on first use).
AppendInput* append_input(const BenchShape& s, int thread) {
  return Fixtures::instance().get<AppendInput>(std::string("append-input/") + s.name, thread, [&] {
    auto a = std::make_unique<AppendInput>();
    fill_kv(s, 0, kAppendCapacity, a->k, a->v);
    a->positions = iota_positions(0, kAppendCapacity);
    return a;
  });
}

template <class Cfg, class Be>
void append_case(benchmark::State& st, BenchShape s, std::int64_t n) {
  using Cache = typename Cfg::template cache<typename Be::tag>;
  auto* in = append_input(s, st.thread_index());
  auto made = Cache::create(kvpack::ModelShape{.layers = 1, .q_heads = s.q_heads, .kv_heads = s.kv_heads,
                                               .head_dim = s.head_dim, .max_tokens = kAppendCapacity});
  if (!made) {
    st.SkipWithError(made.error().message.c_str());
    return;
  }
  Cache cache = std::move(made).value();
  const std::size_t row = static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.head_dim);
  const std::span<const float> k(in->k), v(in->v);
  const std::span<const std::int32_t> pos(in->positions);
  bool ok = true;
  for (auto _ : st) {
    std::int64_t t = cache.tokens(0);
    if (t + n > kAppendCapacity) {
      st.PauseTiming();
      cache.clear();
      st.ResumeTiming();
      t = 0;
    }
    const auto off = static_cast<std::size_t>(t) * row;
    const auto len = static_cast<std::size_t>(n) * row;
    auto r = cache.append(0, k.subspan(off, len), v.subspan(off, len), pos.subspan(static_cast<std::size_t>(t),
                                                                                   static_cast<std::size_t>(n)));
    ok = ok && static_cast<bool>(r);
    benchmark::ClobberMemory();
  }
  if (!ok) {
    st.SkipWithError("append failed");
    return;
  }
  set_append_counters(st, n, row);
}

/// The append roofline: memcpy of the n tokens of K and V an append case stores, same offsets.
void append_memcpy(benchmark::State& st, BenchShape s, std::int64_t n) {
  auto* in = append_input(s, st.thread_index());
  const std::size_t row = static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.head_dim);
  std::vector<float> dk(in->k.size(), 1.f), dv(in->v.size(), 1.f);  // touched: no page faults timed
  std::int64_t t = 0;
  for (auto _ : st) {
    if (t + n > kAppendCapacity) t = 0;
    const auto off = static_cast<std::size_t>(t) * row, len = static_cast<std::size_t>(n) * row;
    std::memcpy(dk.data() + off, in->k.data() + off, len * sizeof(float));
    std::memcpy(dv.data() + off, in->v.data() + off, len * sizeof(float));
    benchmark::ClobberMemory();
    t += n;
  }
  set_append_counters(st, n, row);
}

void set_prefill_counters(benchmark::State& st, double kv_bytes) {
  using C = benchmark::Counter;
  st.counters["kv_bytes"] = C(kv_bytes, C::kAvgThreads);
  st.counters["tok/s"] = C(static_cast<double>(st.iterations()) * kPrefillChunk, C::kIsRate);
}

template <class Cfg, class Be>
void prefill_kvpack(benchmark::State& st, BenchShape s) {
  using Cache = typename Cfg::template cache<typename Be::tag>;
  const std::string prefix = std::string("prefill/") + Cfg::name + "/" + Be::name + "/" + s.name;
  std::string err;
  Cache* c = Fixtures::instance().get<Cache>(
      prefix, st.thread_index(), [&] { return build_cache<Cache>(s, kPrefillContext, kPrefillChunk, err); });
  if (c == nullptr) {
    st.SkipWithError(("cache build failed: " + err).c_str());
    return;
  }
  const std::vector<float> q = make_queries(s, kPrefillChunk);
  std::vector<float> out(q.size());
  for (auto _ : st) {
    auto r = c->attend(0, q, out);
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  if (!all_finite(out)) {
    st.SkipWithError("attend produced non-finite output");
    return;
  }
  set_prefill_counters(st, static_cast<double>(c->memory_bytes()));
}

void prefill_plain_fp16(benchmark::State& st, BenchShape s) {
  const std::string prefix = std::string("prefill/plain-fp16/") + s.name;
  auto* c = Fixtures::instance().get<PlainCache<std::uint16_t>>(
      prefix, st.thread_index(), [&] { return PlainCache<std::uint16_t>::build(s, kPrefillContext); });
  const std::vector<float> q = make_queries(s, kPrefillChunk);
  std::vector<float> out(q.size());
  for (auto _ : st) {
    c->attend(q.data(), out.data(), kPrefillChunk);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  if (!all_finite(out)) {
    st.SkipWithError("baseline produced non-finite output");
    return;
  }
  set_prefill_counters(st, static_cast<double>(c->bytes()));
}

// min_time > 0: Google Benchmark grows the iteration count until min_time; 0: one iteration.
void finish(benchmark::internal::Benchmark* b, double min_time) {
  for (int t : thread_counts()) b->Threads(t);
  if (min_time > 0) b->MinTime(min_time);
  else b->Iterations(1);
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

void register_append_benchmarks() {
  for (const BenchShape& s : kShapes)
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{512}}) {
      const std::string base = std::string("append/memcpy-fp32/baseline/") + s.name + "/" + std::to_string(n);
      finish(benchmark::RegisterBenchmark(base.c_str(), append_memcpy, s, n), kAppendMinTime);
      for_each_type(Configs{}, [&]<class Cfg>() {
        for_each_type(Backends{}, [&]<class Be>() {
          const std::string name =
              std::string("append/") + Cfg::name + "/" + Be::name + "/" + s.name + "/" + std::to_string(n);
          finish(benchmark::RegisterBenchmark(name.c_str(), append_case<Cfg, Be>, s, n), kAppendMinTime);
        });
      });
    }

  const char* which = std::getenv("KVPACK_BENCH_PREFILL_SHAPES");
  const std::string shapes = which != nullptr && *which != '\0' ? which : kSmolLM2.name;
  for (const BenchShape& s : kShapes) {
    if (shapes != "all" && shapes.find(s.name) == std::string::npos) continue;
    const std::string tail = std::string("/") + s.name + "/" + std::to_string(kPrefillContext);
    // One iteration per thread: a case takes about a second with the scalar kernel.
    finish(benchmark::RegisterBenchmark(("prefill/plain-fp16/baseline" + tail).c_str(), prefill_plain_fp16, s), 0.0);
    for_each_type(Configs{}, [&]<class Cfg>() {
      for_each_type(Backends{}, [&]<class Be>() {
        const std::string name = std::string("prefill/") + Cfg::name + "/" + Be::name + tail;
        finish(benchmark::RegisterBenchmark(name.c_str(), prefill_kvpack<Cfg, Be>, s), 0.0);
      });
    });
  }
}

}  // namespace kvpack_bench
