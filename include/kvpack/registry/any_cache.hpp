// AnyCache: a single-sequence KVCache<Policy...> behind a virtual interface, so a policy can be
// chosen at run time (AnyPool::make_single gives the twin of a pooled sequence; erase_cache any
// KVCache type). The calls forward to the
// concrete KVCache unchanged: same codes, same kernels, same errors; the cost is one virtual
// call per append/attend (per layer and chunk), nothing per token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kvpack/kv_cache.hpp"
#include "kvpack/result.hpp"

namespace kvpack::registry {

/// A single-sequence KV cache of a policy chosen at run time. Interface of KVCache<Policy...>
/// (kv_cache.hpp); every member states the KVCache member it forwards to. Not thread-safe (as
/// KVCache).
class AnyCache {
 public:
  virtual ~AnyCache() = default;
  AnyCache() = default;
  AnyCache(const AnyCache&) = delete;
  AnyCache& operator=(const AnyCache&) = delete;

  /// The registry name the cache was made from (e.g. "int8", "q8_0/q4_0").
  [[nodiscard]] virtual std::string_view policy() const noexcept = 0;
  /// KVCache::append: k, v [n][kv_heads][head_dim] float32 row-major (keys post-RoPE),
  /// positions [n]. Errors as KVCache::append (invalid_argument, capacity_exceeded, non_finite).
  virtual Status append(int layer, std::span<const float> k, std::span<const float> v,
                        std::span<const std::int32_t> positions) = 0;
  /// KVCache::attend: q, out [n_q][q_heads][head_dim], the last n_q tokens of the latest append.
  virtual Status attend(int layer, std::span<const float> q, std::span<float> out) = 0;
  /// KVCache::reset: back to empty, memory zeroed.
  virtual void reset() = 0;
  /// KVCache::tokens: tokens appended to `layer` (0 for a bad layer).
  [[nodiscard]] virtual std::int64_t tokens(int layer) const noexcept = 0;
  /// KVCache::memory_bytes: bytes held for KV data.
  [[nodiscard]] virtual std::size_t memory_bytes() const noexcept = 0;
  /// KVCache::shape.
  [[nodiscard]] virtual const ModelShape& shape() const noexcept = 0;
  /// Stored bits per key / value element of the codecs (metadata included, fp32 rows excluded).
  [[nodiscard]] virtual double key_bits_per_value() const noexcept = 0;
  [[nodiscard]] virtual double value_bits_per_value() const noexcept = 0;
  /// KVCache::blocks: the quantized blocks of (layer, kv_head), for comparisons of stored codes.
  [[nodiscard]] virtual std::span<const Block> blocks(int layer, int kv_head) const noexcept = 0;
  /// KVCache::block_layout: bytes of one block payload and where its parts lie.
  [[nodiscard]] virtual const BlockLayout& block_layout() const noexcept = 0;
};

/// AnyCache over a concrete `Cache` (a KVCache<Policy...>).
template <class Cache>
class CacheAdapter final : public AnyCache {
 public:
  CacheAdapter(Cache cache, std::string name) : cache_(std::move(cache)), name_(std::move(name)) {}

  [[nodiscard]] std::string_view policy() const noexcept override { return name_; }
  Status append(int layer, std::span<const float> k, std::span<const float> v,
                std::span<const std::int32_t> positions) override {
    return cache_.append(layer, k, v, positions);
  }
  Status attend(int layer, std::span<const float> q, std::span<float> out) override { return cache_.attend(layer, q, out); }
  void reset() override { cache_.reset(); }
  [[nodiscard]] std::int64_t tokens(int layer) const noexcept override { return cache_.tokens(layer); }
  [[nodiscard]] std::size_t memory_bytes() const noexcept override { return cache_.memory_bytes(); }
  [[nodiscard]] const ModelShape& shape() const noexcept override { return cache_.shape(); }
  [[nodiscard]] double key_bits_per_value() const noexcept override { return Cache::key_bits_per_value; }
  [[nodiscard]] double value_bits_per_value() const noexcept override { return Cache::value_bits_per_value; }
  [[nodiscard]] std::span<const Block> blocks(int layer, int kv_head) const noexcept override {
    return cache_.blocks(layer, kv_head);
  }
  [[nodiscard]] const BlockLayout& block_layout() const noexcept override { return cache_.block_layout(); }

  /// The concrete cache (for code that knows the type).
  [[nodiscard]] Cache& get() noexcept { return cache_; }

 private:
  Cache cache_;
  std::string name_;
};

/// Creates `Cache` for `shape` behind AnyCache, labelled `name`. Errors: those of Cache::create.
template <class Cache>
[[nodiscard]] Result<std::unique_ptr<AnyCache>> erase_cache(const ModelShape& shape, std::string name) {
  auto c = Cache::create(shape);
  if (!c) return c.error();
  return std::unique_ptr<AnyCache>(std::make_unique<CacheAdapter<Cache>>(std::move(c.value()), std::move(name)));
}

}  // namespace kvpack::registry
