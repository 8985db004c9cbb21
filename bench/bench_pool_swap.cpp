// Swapping a pool sequence out and back (PagedCache::swap_out / swap_in, pool/pool_swap.hpp):
// one iteration moves every page of a 2048-token INT4-g32 sequence of the SmolLM2-135M shape (30
// layers, 3 KV heads, head_dim 64: 32 pages of 64 tokens per (layer, head), 2880 pages of
// 5120 bytes, 14.1 MiB) out of the arena and back in. Targets: HostSwapTarget (process memory),
// StoreSwapTarget over an OffloadStore with a host tier (records sealed with
// XChaCha20-Poly1305 in RAM) and with an encrypted file tier (write-through to the page cache
// of a temporary file). `memcpy` copies the same bytes twice (out and back): the floor.
// bytes_per_second counts the page payload moved both ways (2 x 14.1 MiB per iteration).
// Run: ./bench_offload --benchmark_filter=pool_swap --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "kvpack/offload.hpp"
#include "kvpack/pool/paged_cache.hpp"
#include "support/reference.hpp"

namespace {

using SwapPool = kvpack::PagedCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>, kvpack::Blocks<64>>;
const kvpack::ModelShape kSwapShape{.layers = 30, .q_heads = 9, .kv_heads = 3, .head_dim = 64, .max_tokens = 4096};
constexpr int kSwapTokens = 2048;

// A pool holding one kSwapTokens-token sequence (random K/V, every page full).
struct SwapSetup {
  SwapPool pool = SwapPool::create({.shape = kSwapShape, .byte_budget = std::size_t{64} << 20, .max_sequences = 2}).value();
  kvpack::SeqId id = pool.create_sequence().value();
  SwapSetup() {
    const std::size_t row = static_cast<std::size_t>(kSwapShape.kv_heads) * kSwapShape.head_dim;
    const auto k = kvtest::normal(kSwapTokens * row, 1), v = kvtest::normal(kSwapTokens * row, 2);
    for (int l = 0; l < kSwapShape.layers; ++l)
      if (!pool.append(id, l, k, v, kvtest::iota_positions(0, kSwapTokens))) std::abort();
  }
  [[nodiscard]] std::size_t bytes() const { return pool.stats().pages_used * pool.block_layout().bytes; }
};

void report(benchmark::State& state, std::size_t bytes, std::size_t pages) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(2 * bytes));
  state.counters["pages"] = static_cast<double>(pages);
  state.counters["MiB_each_way"] = static_cast<double>(bytes) / (1 << 20);
}

void round_trip(benchmark::State& state, SwapSetup& s, kvpack::PageSwapTarget& target) {
  const std::size_t bytes = s.bytes(), pages = s.pool.stats().pages_used;
  for (auto _ : state) {
    if (!s.pool.swap_out(s.id, target) || !s.pool.swap_in(s.id)) {
      state.SkipWithError("swap failed");
      return;
    }
  }
  report(state, bytes, pages);
}

void pool_swap_host(benchmark::State& state) {
  SwapSetup s;
  kvpack::HostSwapTarget target;
  round_trip(state, s, target);
}

void pool_swap_store(benchmark::State& state, bool file) {
  SwapSetup s;
  kvpack::offload::StoreConfig c;
  c.layout = kvpack::offload::swap_layout_for(s.pool);
  c.resident_budget_bytes = 0;
  c.background = false;
  if (file) c.file = kvpack::offload::FileTier{};
  else c.host = kvpack::offload::HostTier{};
  auto store = kvpack::offload::OffloadStore::create(c).value();
  kvpack::offload::StoreSwapTarget target(*store);
  round_trip(state, s, target);
}

void pool_swap_memcpy(benchmark::State& state) {
  SwapSetup s;
  const std::size_t bytes = s.bytes(), pages = s.pool.stats().pages_used;
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    std::memcpy(src.data(), dst.data(), bytes);
    benchmark::DoNotOptimize(src.data());
  }
  report(state, bytes, pages);
}

}  // namespace

BENCHMARK(pool_swap_memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(pool_swap_host)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(pool_swap_store, sealed_host_tier, false)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(pool_swap_store, encrypted_file_tier, true)->UseRealTime()->Unit(benchmark::kMillisecond);
