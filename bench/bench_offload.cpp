// Offload costs: sealing/opening records (encryption GB/s) and fetch latency of one block from
// the host and file tiers. Block = CASES C11's INT4 block (64 tokens, head_dim 128, group 32,
// fp16 scale + zero-point: 10496 bytes); 1 MiB payloads show the cipher's peak.
// decode_offload: one decode step (append + attend on every layer) of an INT4-g32 KVCache holding
// a 2048-token context, fully resident vs Offload<DeviceTier, FileTier, Prefetch<N>> with a
// resident budget of 25 % of its block bytes (encrypted file tier, background worker).
// Run: ./bench_offload --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"

#include "kvpack/offload.hpp"
#include "support/offload_fixtures.hpp"

namespace ko = kvpack::offload;

namespace {

ko::RecordLayout layout_of(std::size_t payload) {
  auto l = ko::testing::c11_layout();
  l.max_payload_bytes = static_cast<uint32_t>(payload);
  return l;
}

void seal(benchmark::State& state, ko::Aead aead) {
  const auto n = static_cast<std::size_t>(state.range(0));
  if (aead == ko::Aead::aes256gcm && !ko::aes256gcm_available()) {
    state.SkipWithError("AES-256-GCM not available on this CPU");
    return;
  }
  auto cipher = ko::RecordCipher::create(aead, ko::SecretBytes::random(32).value()).value();
  const auto layout = layout_of(n);
  const auto payload = ko::testing::random_payload(n, 1);
  std::vector<std::byte> rec(ko::record_bytes(n));
  ko::BlockId id{{}, {0, 0, 0}, 1};
  for (auto _ : state) {
    ++id.version;
    if (!ko::seal_record(cipher, layout, id, 64, payload, rec)) state.SkipWithError("seal failed");
    benchmark::DoNotOptimize(rec.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}

void open(benchmark::State& state, ko::Aead aead) {
  const auto n = static_cast<std::size_t>(state.range(0));
  if (aead == ko::Aead::aes256gcm && !ko::aes256gcm_available()) {
    state.SkipWithError("AES-256-GCM not available on this CPU");
    return;
  }
  auto cipher = ko::RecordCipher::create(aead, ko::SecretBytes::random(32).value()).value();
  const auto layout = layout_of(n);
  const auto payload = ko::testing::random_payload(n, 1);
  std::vector<std::byte> rec(ko::record_bytes(n)), out(n);
  const ko::BlockId id{{}, {0, 0, 0}, 1};
  if (!ko::seal_record(cipher, layout, id, 64, payload, rec)) state.SkipWithError("seal failed");
  for (auto _ : state) {
    if (!ko::open_record(cipher, layout, id, rec, out)) state.SkipWithError("open failed");
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}

// Fetch latency: a block with a valid record is dropped from the hot tier (no I/O) and acquired
// again (read + verify + decrypt + publish). File: the page cache serves the reads.
void fetch(benchmark::State& state, bool file) {
  ko::testing::TempDir dir;
  ko::StoreConfig c;
  c.layout = ko::testing::c11_layout();
  c.resident_budget_bytes = UINT64_MAX;
  c.background = false;
  if (file)
    c.file = ko::FileTier{.directory = dir.path()};
  else
    c.host = ko::HostTier{};
  auto store = ko::OffloadStore::create(c).value();
  constexpr int kBlocks = 64;
  for (int b = 0; b < kBlocks; ++b) {
    if (!store->put({0, 0, b}, 64, ko::testing::random_payload(ko::testing::kC11PayloadBytes, static_cast<uint64_t>(b))) ||
        !store->offload({0, 0, b}))
      state.SkipWithError("setup failed");
  }
  int b = 0;
  for (auto _ : state) {
    const ko::BlockKey k{0, 0, b};
    b = (b + 1) % kBlocks;
    state.PauseTiming();
    (void)store->offload(k);  // clean: drops the hot copy only
    state.ResumeTiming();
    auto h = store->acquire(k);
    if (!h) state.SkipWithError("fetch failed");
    benchmark::DoNotOptimize(h->bytes().data());
  }
  const auto m = store->metrics();
  state.counters["p50_us"] = m.fetch_p50_us;
  state.counters["p99_us"] = m.fetch_p99_us;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(ko::testing::kC11PayloadBytes));
  state.SetLabel(std::string(ko::to_string(store->aead())));
}

// Write-behind cost of one dirty block: seal + write (+ wipe of the hot copy).
void offload_write(benchmark::State& state, bool file) {
  ko::testing::TempDir dir;
  ko::StoreConfig c;
  c.layout = ko::testing::c11_layout();
  c.background = false;
  if (file)
    c.file = ko::FileTier{.directory = dir.path()};
  else
    c.host = ko::HostTier{};
  auto store = ko::OffloadStore::create(c).value();
  const auto payload = ko::testing::random_payload(ko::testing::kC11PayloadBytes, 9);
  int b = 0;
  for (auto _ : state) {
    const ko::BlockKey k{0, 0, b};
    b = (b + 1) % 256;
    state.PauseTiming();
    if (!store->put(k, 64, payload)) state.SkipWithError("put failed");
    state.ResumeTiming();
    if (!store->offload(k)) state.SkipWithError("offload failed");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(ko::testing::kC11PayloadBytes));
}

// ---- decode with offload vs fully resident --------------------------------------------------

constexpr int kDecLayers = 8, kDecQHeads = 9, kDecKvHeads = 3, kDecHeadDim = 64;  // SmolLM2-135M heads
constexpr std::int64_t kDecCtx = 2048;
constexpr int kDecSteps = 64;  // decode steps timed (fixed, the cache grows by one token per step)

using DecKeys = kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>;
using DecValues = kvpack::Values<kvpack::Int4<kvpack::Group<32>>>;
using DecResident = kvpack::KVCache<DecKeys, DecValues>;
template <int N>
using DecOffload = kvpack::KVCache<DecKeys, DecValues, ko::Offload<ko::DeviceTier, ko::FileTier, ko::Prefetch<N>>>;

kvpack::ModelShape dec_shape() {
  kvpack::ModelShape s;
  s.layers = kDecLayers;
  s.q_heads = kDecQHeads;
  s.kv_heads = kDecKvHeads;
  s.head_dim = kDecHeadDim;
  s.max_tokens = kDecCtx + 4096;
  return s;
}

template <class Cache>
void decode(benchmark::State& state, double budget_fraction) {
  ko::testing::TempDir dir;
  const kvpack::ModelShape shape = dec_shape();
  typename Cache::offload_options o{};
  if constexpr (Cache::offloads) {
    const std::size_t block = kvpack::make_block_layout<typename Cache::key_codec, typename Cache::value_codec, false>(
                                  Cache::block_tokens, kDecHeadDim, Cache::slot_positions)
                                  .bytes;
    const std::size_t total = std::size_t{kDecLayers} * kDecKvHeads *
                              static_cast<std::size_t>((kDecCtx + Cache::block_tokens - 1) / Cache::block_tokens) * block;
    o.resident_budget_bytes = static_cast<uint64_t>(budget_fraction * static_cast<double>(total));
    o.file.directory = dir.path();
  }
  auto made = Cache::create(shape, o);
  if (!made) {
    state.SkipWithError(made.error().message.c_str());
    return;
  }
  Cache c = std::move(made).value();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const std::size_t kv_row = std::size_t{kDecKvHeads} * kDecHeadDim, q_row = std::size_t{kDecQHeads} * kDecHeadDim;
  std::vector<float> k(kv_row * 256), v(k.size()), q(q_row), out(q_row);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (float& x : q) x = nd(rng);
  std::vector<std::int32_t> pos(256);
  for (std::int64_t t = 0; t < kDecCtx; t += 256)  // prefill in 256-token chunks
    for (int l = 0; l < kDecLayers; ++l) {
      for (int i = 0; i < 256; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(t + i);
      if (!c.append(l, k, v, pos)) state.SkipWithError("prefill failed");
    }
  if constexpr (Cache::offloads) {
    if (!c.offload().flush()) state.SkipWithError("flush failed");
  }
  const auto m0 = [&] {
    if constexpr (Cache::offloads) return c.offload().metrics();
    else return 0;
  }();
  std::int64_t t = kDecCtx;
  for (auto _ : state) {
    for (int l = 0; l < kDecLayers; ++l) {
      const std::int32_t p = static_cast<std::int32_t>(t);
      if (!c.append(l, std::span(k).first(kv_row), std::span(v).first(kv_row), std::span(&p, 1)) || !c.attend(l, q, out))
        state.SkipWithError("decode failed");
      benchmark::DoNotOptimize(out.data());
    }
    ++t;
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);  // wall time (UseRealTime)
  if constexpr (Cache::offloads) {
    const auto m = c.offload().metrics();
    state.counters["budget_MiB"] = static_cast<double>(m.budget_bytes) / (1 << 20);
    state.counters["fetch/tok"] = static_cast<double>(m.store.fetches - m0.store.fetches) / static_cast<double>(state.iterations());
    state.counters["p50_us"] = m.store.fetch_p50_us;
    state.counters["p99_us"] = m.store.fetch_p99_us;
    const double hits = static_cast<double>(m.store.prefetch_hits - m0.store.prefetch_hits);
    const double misses = static_cast<double>(m.store.prefetch_misses - m0.store.prefetch_misses);
    state.counters["hit_%"] = hits + misses > 0 ? 100.0 * hits / (hits + misses) : 0.0;
    const double hid = static_cast<double>(m.store.prefetch_hidden_ns - m0.store.prefetch_hidden_ns);
    const double wait = static_cast<double>(m.store.acquire_wait_ns - m0.store.acquire_wait_ns);
    state.counters["hidden_%"] = hid + wait > 0 ? 100.0 * hid / (hid + wait) : 0.0;
    state.counters["wait_us/tok"] = wait / 1000.0 / static_cast<double>(state.iterations());
    state.SetLabel(std::string(ko::to_string(c.offload().store()->aead())));
  } else {
    (void)m0;
  }
}

void decode_resident(benchmark::State& s, double f) { decode<DecResident>(s, f); }
void decode_file_prefetch2(benchmark::State& s, double f) { decode<DecOffload<2>>(s, f); }
void decode_file_no_prefetch(benchmark::State& s, double f) { decode<DecOffload<0>>(s, f); }

}  // namespace

BENCHMARK_CAPTURE(decode_resident, resident, 1.0)->Iterations(kDecSteps)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode_file_prefetch2, budget_25pct, 0.25)->Iterations(kDecSteps)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode_file_no_prefetch, budget_25pct, 0.25)->Iterations(kDecSteps)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode_file_prefetch2, budget_100pct, 1.0)->Iterations(kDecSteps)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(seal, xchacha20poly1305, ko::Aead::xchacha20poly1305)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(seal, aes256gcm, ko::Aead::aes256gcm)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(seal, mac_only, ko::Aead::none)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(open, xchacha20poly1305, ko::Aead::xchacha20poly1305)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(open, aes256gcm, ko::Aead::aes256gcm)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(open, mac_only, ko::Aead::none)->Arg(10496)->Arg(1 << 20);
BENCHMARK_CAPTURE(fetch, host, false);
BENCHMARK_CAPTURE(fetch, file, true);
BENCHMARK_CAPTURE(offload_write, host, false);
BENCHMARK_CAPTURE(offload_write, file, true);
