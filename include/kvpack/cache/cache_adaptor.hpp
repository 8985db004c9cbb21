// CacheAdaptor<Cache>: what every adaptor over a KV cache (Rotated<>, Calibrated<>) forwards
// unchanged to the cache it wraps: its traits and the size and token queries. An adaptor derives
// from it and defines what it changes (create, append, attend, read_back, reset, ...); a member of
// the same name in the adaptor hides the forwarded one (Calibrated's memory_bytes adds its scales).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kvpack/cache/shape.hpp"

namespace kvpack {

/// Base of the cache adaptors: holds the inner cache (`inner_`) and forwards to it.
template <class Cache>
class CacheAdaptor {
 public:
  using inner_type = Cache;
  using key_codec = typename Cache::key_codec;
  using value_codec = typename Cache::value_codec;
  using backend_tag = typename Cache::backend_tag;
  static constexpr bool keys_per_channel = Cache::keys_per_channel;
  static constexpr bool evicts = Cache::evicts;
  static constexpr bool evicts_continuously = Cache::evicts_continuously;
  static constexpr double key_bits_per_value = Cache::key_bits_per_value;
  static constexpr double value_bits_per_value = Cache::value_bits_per_value;

  [[nodiscard]] std::size_t memory_bytes() const noexcept { return inner_.memory_bytes(); }
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return inner_.allocated_bytes(); }
  [[nodiscard]] std::int64_t tokens(int layer) const noexcept { return inner_.tokens(layer); }
  [[nodiscard]] std::int64_t held_tokens(int layer, int kv_head = 0) const noexcept { return inner_.held_tokens(layer, kv_head); }
  [[nodiscard]] std::int64_t quantized_tokens(int layer) const noexcept { return inner_.quantized_tokens(layer); }
  /// Eviction caches: tokens per (layer, KV head) the policy holds (Cache::eviction_budget).
  [[nodiscard]] std::int64_t eviction_budget() const noexcept
    requires requires(const Cache& c) { c.eviction_budget(); }
  {
    return inner_.eviction_budget();
  }
  /// Demote<> caches: rows (layer, kv_head) holds in the low tier (Cache::demoted_tokens).
  [[nodiscard]] std::int64_t demoted_tokens(int layer, int kv_head) const noexcept
    requires requires(const Cache& c) { c.demoted_tokens(0, 0); }
  {
    return inner_.demoted_tokens(layer, kv_head);
  }
  [[nodiscard]] const ModelShape& shape() const noexcept { return inner_.shape(); }
  /// The inner cache (holding the adaptor's transformed rows).
  [[nodiscard]] Cache& inner() noexcept { return inner_; }
  [[nodiscard]] const Cache& inner() const noexcept { return inner_; }

 protected:
  explicit CacheAdaptor(Cache c) : inner_(std::move(c)) {}

  Cache inner_;
};

}  // namespace kvpack
