// Memory per configuration: bytes per token per layer, checked against the analytic bits per value.
//
// memory/<config>/<backend>/<shape>/4096: builds a one-layer cache of 4096 tokens and splits
// memory_bytes() into
//   * payload   codes + scales/zero-points of the quantized tokens; must equal
//               quantized_tokens x kv_heads x head_dim x (key_bits_per_value + value_bits_per_value) / 8
//               exactly, or the case fails (SkipWithError);
//   * overhead  4 bytes of position per token and KV head, 16 bytes of header per block;
//   * fp rows   tokens kept in fp32 (sinks, residual window, incomplete per-channel key group):
//               8 bytes per channel (K and V) + 4 bytes of position per token.
// Counters (per token per layer, bytes): payload_B, overhead_B, total_B (= memory_bytes / tokens),
// and the codecs' k_bits / v_bits per value. Not a timing: one iteration.
#include "bench_common.hpp"

namespace kvpack_bench {
namespace {

constexpr std::int64_t kMemoryContext = 4096;

template <class Cfg, class Be>
void memory_case(benchmark::State& st, BenchShape s) {
  using Cache = typename Cfg::template cache<typename Be::tag>;
  std::string err;
  auto c = build_cache<Cache>(s, kMemoryContext, 1, err);
  if (c == nullptr) {
    st.SkipWithError(("cache build failed: " + err).c_str());
    return;
  }
  std::size_t total = 0;
  for (auto _ : st) {
    total = c->memory_bytes();
    benchmark::DoNotOptimize(total);
  }
  const auto kv = static_cast<double>(s.kv_heads);
  const auto D = static_cast<double>(s.head_dim);
  const auto q = static_cast<double>(c->quantized_tokens(0));
  const double fp_tokens = static_cast<double>(kMemoryContext) - q;
  double blocks = 0;
  for (int h = 0; h < s.kv_heads; ++h) blocks += static_cast<double>(c->blocks(0, h).size());
  const double fp_rows = fp_tokens * (kv * D * 2 * sizeof(float) + sizeof(std::int32_t));
  // Positions: an int32 per token and KV head in slot-position caches (eviction, PreRope), else
  // the layer's runs of consecutive positions (KVCache::slot_positions).
  double positions = q * kv * sizeof(std::int32_t);
  if constexpr (!Cache::slot_positions) positions = static_cast<double>(c->block_positions(0).held_bytes());
  const double overhead = positions + blocks * sizeof(kvpack::BlockHeader);
  const double payload = static_cast<double>(total) - fp_rows - overhead;
  const double analytic = q * kv * D * (Cache::key_bits_per_value + Cache::value_bits_per_value) / 8;
  if (std::abs(payload - analytic) > 1e-6) {
    st.SkipWithError(("payload " + std::to_string(payload) + " bytes != analytic " + std::to_string(analytic) +
                      " bytes (bits per value disagree with memory_bytes)")
                         .c_str());
    return;
  }
  st.counters["k_bits"] = Cache::key_bits_per_value;
  st.counters["v_bits"] = Cache::value_bits_per_value;
  st.counters["payload_B"] = q > 0 ? payload / q : 0.0;
  st.counters["analytic_B"] = kv * D * (Cache::key_bits_per_value + Cache::value_bits_per_value) / 8;
  st.counters["overhead_B"] = q > 0 ? overhead / q : 0.0;
  st.counters["fp_tokens"] = fp_tokens;
  st.counters["total_B"] = static_cast<double>(total) / static_cast<double>(kMemoryContext);
}

}  // namespace

void register_memory_benchmarks() {
  for (const BenchShape& s : kShapes)
    for_each_type(Configs{}, [&]<class Cfg>() {
      for_each_type(Backends{}, [&]<class Be>() {
        // Eviction configurations hold a budget, not 4096 tokens, and keep slot bookkeeping
        // (validity words, slot index and score per slot): their bytes are the decode cases'
        // kv_bytes counter, not this split.
        if constexpr (Cfg::template cache<typename Be::tag>::evicts) return;
        const std::string name = std::string("memory/") + Cfg::name + "/" + Be::name + "/" + s.name + "/" +
                                 std::to_string(kMemoryContext);
        benchmark::RegisterBenchmark(name.c_str(), memory_case<Cfg, Be>, s)->Iterations(1);
      });
    });
}

}  // namespace kvpack_bench
