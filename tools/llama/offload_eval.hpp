// kvpack-eval's offload support: creating a policy's cache with a resident budget (a fraction
// of the window's quantized block bytes) and an encrypted file tier, collecting its offload
// metrics over the windows, and the exactness check against its twin policy without offload
// ("int4-g32+offload" vs "int4-g32": max |Δlogit| over every scored row).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include <kvpack/kvpack.hpp>
#if defined(KVPACK_HAS_SODIUM)
#include <kvpack/offload.hpp>
#endif

namespace kvpack::llama {

/// How kvpack-eval runs Offload<> policies.
struct OffloadEvalOptions {
  double budget_fraction = 0.25;  ///< resident budget / quantized block bytes of the window
  std::string directory;          ///< file tier directory ("" = $TMPDIR or /tmp)
};

/// Offload figures of one policy, summed over windows (latency percentiles: worst window).
struct OffloadReport {
  bool active = false;
  uint64_t budget_bytes = 0, block_bytes_total = 0;  ///< first window
  uint64_t resident_bytes_end = 0;                   ///< after the first window's decode, flushed
  uint64_t bytes_written = 0, bytes_read = 0, fetches = 0, offload_failures = 0, fetch_failures = 0;
  uint64_t prefetch_hits = 0, prefetch_misses = 0, hidden_ns = 0, wait_ns = 0;
  double fetch_p50_us = 0, fetch_p99_us = 0;
  std::string aead;
  // Exactness against the twin policy (same name without "+offload").
  std::string twin;
  bool compared = false;
  double max_abs_dlogit = 0;
  int64_t compared_rows = 0;

  /// Share of fetch time prefetch hid: fetch time of prefetched blocks / (that + time attend
  /// waited for blocks).
  [[nodiscard]] double hidden_share() const {
    const double h = double(hidden_ns), w = double(wait_ns);
    return h + w > 0 ? h / (h + w) : 0.0;
  }
  [[nodiscard]] double hit_rate() const {
    const uint64_t n = prefetch_hits + prefetch_misses;
    return n ? double(prefetch_hits) / double(n) : 0.0;
  }
};

/// The twin of an offload policy name: "int4-g32+offload" -> "int4-g32"; "" otherwise.
[[nodiscard]] inline std::string offload_twin(std::string_view name) {
  constexpr std::string_view suffix = "+offload";
  if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix)
    return std::string(name.substr(0, name.size() - suffix.size()));
  return {};
}

template <class Cache>
inline constexpr bool offloading_cache_v = [] {
  if constexpr (requires { Cache::offloads; })
    return Cache::offloads;
  else
    return false;
}();

/// Creates the cache of policy `Cache` for `shape`. An Offload<> policy gets a resident budget
/// of `o.budget_fraction` of the quantized block bytes of `tokens` tokens (all layers and KV
/// heads, whole blocks) and its file tier in `o.directory`; `report` (if given) records them.
template <class Cache>
[[nodiscard]] Result<Cache> make_eval_cache(const ModelShape& shape, int64_t tokens, const OffloadEvalOptions& o,
                                            OffloadReport* report = nullptr) {
#if defined(KVPACK_HAS_SODIUM)
  if constexpr (offloading_cache_v<Cache>) {
    const std::size_t block = make_block_layout<typename Cache::key_codec, typename Cache::value_codec,
                                                Cache::keys_per_channel>(Cache::block_tokens, shape.head_dim,
                                                                         Cache::slot_positions)
                                  .bytes;
    const auto blocks = static_cast<uint64_t>((tokens + Cache::block_tokens - 1) / Cache::block_tokens);
    const uint64_t total = uint64_t(shape.layers) * uint64_t(shape.kv_heads) * blocks * block;
    offload::OffloadOptions opt;
    opt.resident_budget_bytes = static_cast<uint64_t>(std::floor(o.budget_fraction * double(total)));
    opt.file.directory = o.directory;
    if (report && !report->active) {
      report->active = true;
      report->budget_bytes = opt.resident_budget_bytes;
      report->block_bytes_total = total;
    }
    return Cache::create(shape, opt);
  }
#endif
  (void)tokens, (void)o, (void)report;
  return Cache::create(shape);
}

/// Adds `cache`'s offload metrics (after a window) to `r`; a no-op for other caches. The first
/// call also records the resident bytes (after a flush) and the AEAD.
template <class Cache>
[[nodiscard]] Status collect_offload(Cache& cache, OffloadReport& r) {
#if defined(KVPACK_HAS_SODIUM)
  if constexpr (offloading_cache_v<Cache>) {
    cache.offload().clear_prefetch_window();
    if (Status s = cache.offload().flush(); !s) return s;
    const auto m = cache.offload().metrics();
    if (r.aead.empty()) {
      r.resident_bytes_end = m.resident_bytes;
      r.aead = offload::to_string(cache.offload().store()->aead());
    }
    r.bytes_written += m.store.bytes_written;
    r.bytes_read += m.store.bytes_read;
    r.fetches += m.store.fetches;
    r.offload_failures += m.store.offload_failures;
    r.fetch_failures += m.store.fetch_failures;
    r.prefetch_hits += m.store.prefetch_hits;
    r.prefetch_misses += m.store.prefetch_misses;
    r.hidden_ns += m.store.prefetch_hidden_ns;
    r.wait_ns += m.store.acquire_wait_ns;
    r.fetch_p50_us = std::max(r.fetch_p50_us, m.store.fetch_p50_us);
    r.fetch_p99_us = std::max(r.fetch_p99_us, m.store.fetch_p99_us);
  }
#endif
  (void)cache, (void)r;
  return {};
}

}  // namespace kvpack::llama
