// Batched decode on the page pool against separate single-sequence caches: 16 sequences of 4096
// tokens (KVPACK_BENCH_POOL_SEQS, KVPACK_BENCH_POOL_CONTEXT), one layer, one query token each.
//  * pool-batch/<config>/<shape>/<seqs>x<ctx>/workers:W   PagedCache::attend_batch over W workspaces
//    (W = 1: no executor; W > 1: thread_executor(W))
//  * pool-separate/<config>/<shape>/<seqs>x<ctx>/workers:W   16 KVCache<...>::attend calls, one per
//    sequence, in W tasks on the same executor
// Time per iteration covers all sequences; per-token time = time / seqs. Counters: tok/s (decoded
// tokens of one layer per second, all sequences), kv_bytes (KV bytes read per iteration).
//  * pool-append/int4-g32/<shape>/<n>   PagedCache::append of n tokens (1: a decode step, 512: a
//    prefill chunk) to one sequence's layer, as append/int4-g32/... does for KVCache (bench_append.cpp);
//    every 4096 tokens the sequence is freed and a new one created, timing paused. Counters: tok/s,
//    GB/s of fp32 K+V input.
#include "bench_common.hpp"
#include "kvpack/pool/paged_cache.hpp"

namespace kvpack_bench {
namespace {

using Pool = kvpack::PagedCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>>;
using Single = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>>;

int pool_seqs() { return env_ints("KVPACK_BENCH_POOL_SEQS", {16}).front(); }
std::int64_t pool_context() { return env_ints("KVPACK_BENCH_POOL_CONTEXT", {4096}).front(); }

kvpack::ModelShape shape_of(const BenchShape& s, std::int64_t ctx) {
  return {.layers = 1, .q_heads = s.q_heads, .kv_heads = s.kv_heads, .head_dim = s.head_dim, .max_tokens = ctx};
}

// Sequence i holds the bench's K/V stream from token i * 7 on (different contents per sequence).
template <class Append>
bool fill(const BenchShape& s, std::int64_t ctx, int i, Append&& append) {
  std::vector<float> k, v;
  for (std::int64_t t = 0; t < ctx;) {
    const std::int64_t n = t < ctx - 1 ? std::min<std::int64_t>(512, ctx - 1 - t) : 1;  // last token alone: decode
    fill_kv(s, t + i * 7, n, k, v);
    if (!append(k, v, iota_positions(t, n))) return false;
    t += n;
  }
  return true;
}

kvpack::Executor executor_for(int workers) { return workers > 1 ? kvpack::thread_executor(workers) : kvpack::Executor{}; }

void pool_batch(benchmark::State& st, BenchShape s, int workers) {
  const int N = pool_seqs();
  const std::int64_t ctx = pool_context();
  auto made = Pool::create({.shape = shape_of(s, ctx), .byte_budget = std::size_t{1} << 30, .max_sequences = N});
  if (!made) return st.SkipWithError(made.error().message.c_str());
  Pool pool = std::move(made).value();
  std::vector<kvpack::SeqId> ids;
  for (int i = 0; i < N; ++i) {
    ids.push_back(pool.create_sequence().value());
    if (!fill(s, ctx, i, [&](const auto& k, const auto& v, const auto& p) { return bool(pool.append(ids.back(), 0, k, v, p)); }))
      return st.SkipWithError("append failed");
  }
  std::vector<float> q;
  for (int i = 0; i < N; ++i) {
    const auto qi = make_queries(s, 1);
    q.insert(q.end(), qi.begin(), qi.end());
  }
  std::vector<float> out(q.size());
  std::vector<kvpack::Workspace> ws(static_cast<std::size_t>(workers));
  const kvpack::Executor ex = executor_for(workers);
  if (auto r = pool.attend_batch(0, ids, q, out, ex, ws); !r) return st.SkipWithError(r.error().message.c_str());
  for (auto _ : st) {
    auto r = pool.attend_batch(0, ids, q, out, ex, ws);
    benchmark::DoNotOptimize(r);
    benchmark::ClobberMemory();
  }
  using C = benchmark::Counter;
  st.counters["tok/s"] = C(static_cast<double>(st.iterations()) * N, C::kIsRate);
  st.counters["kv_bytes"] = static_cast<double>(pool.stats().bytes_used);
}

void pool_separate(benchmark::State& st, BenchShape s, int workers) {
  const int N = pool_seqs();
  const std::int64_t ctx = pool_context();
  std::vector<Single> caches;
  for (int i = 0; i < N; ++i) {
    auto made = Single::create(shape_of(s, ctx));
    if (!made) return st.SkipWithError(made.error().message.c_str());
    caches.push_back(std::move(made).value());
    if (!fill(s, ctx, i, [&](const auto& k, const auto& v, const auto& p) { return bool(caches.back().append(0, k, v, p)); }))
      return st.SkipWithError("append failed");
  }
  const auto q = make_queries(s, 1);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(N), std::vector<float>(q.size()));
  const kvpack::Executor ex = executor_for(workers);
  auto step = [&](int w) {
    for (int i = w; i < N; i += workers) {
      auto r = caches[static_cast<std::size_t>(i)].attend(0, q, out[static_cast<std::size_t>(i)]);
      benchmark::DoNotOptimize(r);
    }
  };
  for (auto _ : st) {
    if (ex) ex(workers, step);
    else step(0);
    benchmark::ClobberMemory();
  }
  using C = benchmark::Counter;
  st.counters["tok/s"] = C(static_cast<double>(st.iterations()) * N, C::kIsRate);
  std::size_t bytes = 0;
  for (const auto& c : caches) bytes += c.memory_bytes();
  st.counters["kv_bytes"] = static_cast<double>(bytes);
}

void pool_append(benchmark::State& st, BenchShape s, std::int64_t n) {
  constexpr std::int64_t kCap = 4096;
  // An arena of 32 MiB (an 8B-class sequence of 4096 int4-g32 tokens takes 5.2 MiB of pages),
  // touched by the warm-up fill below: the timed appends reuse pages as a running server does,
  // instead of faulting in a fresh part of a large arena at every new sequence.
  auto made = Pool::create({.shape = shape_of(s, kCap), .byte_budget = std::size_t{32} << 20, .max_sequences = 2});
  if (!made) return st.SkipWithError(made.error().message.c_str());
  Pool pool = std::move(made).value();
  std::vector<float> k, v;
  fill_kv(s, 0, kCap, k, v);
  const std::vector<std::int32_t> pos = iota_positions(0, kCap);
  const std::size_t row = static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.head_dim);
  kvpack::SeqId id = pool.create_sequence().value();
  bool ok = true;
  for (int warm = 0; warm < 8 && ok; ++warm) {  // touch the arena's pages (32 MiB / 5.2 MiB per fill)
    for (std::int64_t t0 = 0; t0 < kCap && ok; t0 += 512)
      ok = bool(pool.append(id, 0, std::span<const float>(k).subspan(static_cast<std::size_t>(t0) * row, 512 * row),
                            std::span<const float>(v).subspan(static_cast<std::size_t>(t0) * row, 512 * row),
                            std::span<const std::int32_t>(pos).subspan(static_cast<std::size_t>(t0), 512)));
    ok = ok && pool.free_sequence(id);
    id = pool.create_sequence().value();
  }
  std::int64_t t = 0;
  for (auto _ : st) {
    if (t + n > kCap) {
      st.PauseTiming();
      ok = ok && pool.free_sequence(id);
      id = pool.create_sequence().value();
      t = 0;
      st.ResumeTiming();
    }
    const auto off = static_cast<std::size_t>(t) * row, len = static_cast<std::size_t>(n) * row;
    ok = ok && pool.append(id, 0, std::span<const float>(k).subspan(off, len), std::span<const float>(v).subspan(off, len),
                           std::span<const std::int32_t>(pos).subspan(static_cast<std::size_t>(t), static_cast<std::size_t>(n)));
    benchmark::ClobberMemory();
    t += n;
  }
  if (!ok) return st.SkipWithError("append failed");
  using C = benchmark::Counter;
  const double toks = static_cast<double>(st.iterations()) * static_cast<double>(n);
  st.counters["tok/s"] = C(toks, C::kIsRate);
  st.counters["GB/s"] = C(toks * static_cast<double>(row) * 2 * sizeof(float) / 1e9, C::kIsRate);
}

}  // namespace

void register_pool_benchmarks() {
  for (const BenchShape& s : kShapes)
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{512}}) {
      const std::string name = "pool-append/int4-g32/" + std::string(s.name) + "/" + std::to_string(n);
      benchmark::RegisterBenchmark(name.c_str(), pool_append, s, n)->UseRealTime()->MinTime(0.1)->Unit(benchmark::kMicrosecond);
    }
  const std::string size = std::to_string(pool_seqs()) + "x" + std::to_string(pool_context());
  for (const BenchShape& s : kShapes)
    for (int workers : thread_counts())
      for (const auto& [kind, fn] : {std::pair{"pool-batch", &pool_batch}, std::pair{"pool-separate", &pool_separate}}) {
        const std::string name = std::string(kind) + "/int4-g32/" + s.name + "/" + size + "/workers:" + std::to_string(workers);
        benchmark::RegisterBenchmark(name.c_str(), fn, s, workers)->UseRealTime()->MinTime(0.2)->Unit(benchmark::kMicrosecond);
      }
}

}  // namespace kvpack_bench
