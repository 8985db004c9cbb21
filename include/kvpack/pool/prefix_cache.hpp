// PrefixCache: full pages published by sequences, found again by the token ids of the prefix they
// end (prefix caching, as vLLM's automatic prefix caching and SGLang's radix cache do it per block).
//
// Entry k (k = 0, 1, ...) holds the pages of every (layer, KV head) that store prompt tokens
// [k * B, (k + 1) * B). Its key chains hashes: h_0 = hash(model id, codec format id, layout),
// h_{k+1} = hash(h_k, token ids of block k); the entry also keeps its block's token ids and its
// parent key, which a lookup compares, so a hash collision cannot attach a wrong page. Each entry
// holds one reference to each of its pages until clear().
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvpack/pool/page_pool.hpp"

namespace kvpack::pool_detail {

/// 64-bit FNV-1a over bytes, continuing from `h`.
[[nodiscard]] inline std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/// Published full pages, keyed by the chained hash of their prefix. Thread-safe.
class PrefixCache {
 public:
  struct Entry {
    std::uint64_t parent = 0;
    std::vector<std::int32_t> tokens;   ///< token ids of this block
    std::vector<std::uint32_t> pages;   ///< [layer][kv_head]
  };

  /// Root key for a model id and the cache's codec format and layout.
  [[nodiscard]] static std::uint64_t root(std::string_view model_id, std::uint32_t format_id, int block_tokens,
                                          int head_dim, int layers, int kv_heads) noexcept {
    std::uint64_t h = fnv1a(model_id.data(), model_id.size());
    const std::int64_t f[5] = {format_id, block_tokens, head_dim, layers, kv_heads};
    return fnv1a(f, sizeof f, h);
  }
  /// Key of the block after `parent` holding `tokens`.
  [[nodiscard]] static std::uint64_t next(std::uint64_t parent, std::span<const std::int32_t> tokens) noexcept {
    return fnv1a(tokens.data(), tokens.size_bytes(), fnv1a(&parent, sizeof parent));
  }

  /// Adds an entry under `key` holding `pages` (each retained) unless one exists. Returns whether
  /// added. May throw std::bad_alloc, with nothing added or retained.
  bool publish(PagePool& pool, std::uint64_t key, std::uint64_t parent, std::span<const std::int32_t> tokens,
               std::span<const std::uint32_t> pages) {
    std::lock_guard<std::mutex> g(mu_);
    if (map_.count(key)) return false;
    Entry e{parent, {tokens.begin(), tokens.end()}, {pages.begin(), pages.end()}};
    map_.emplace(key, std::move(e));  // may throw std::bad_alloc: before any page is retained
    for (const std::uint32_t p : pages) pool.retain(p);
    return true;
  }

  /// The entry under `key` whose parent and tokens match, retained page by page into `out`
  /// (appended); false when there is none. May throw std::bad_alloc, with nothing retained.
  bool find(PagePool& pool, std::uint64_t key, std::uint64_t parent, std::span<const std::int32_t> tokens,
            std::vector<std::uint32_t>& out) const {
    std::lock_guard<std::mutex> g(mu_);
    const auto it = map_.find(key);
    if (it == map_.end() || it->second.parent != parent ||
        !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(), it->second.tokens.end()))
      return false;
    out.reserve(out.size() + it->second.pages.size());  // may throw std::bad_alloc: before any retain
    for (const std::uint32_t p : it->second.pages) {
      pool.retain(p);
      out.push_back(p);
    }
    return true;
  }

  /// Releases every entry's pages.
  void clear(PagePool& pool) {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [k, e] : map_)
      for (const std::uint32_t p : e.pages) pool.release(p);
    map_.clear();
  }

  [[nodiscard]] std::size_t entries() const {
    std::lock_guard<std::mutex> g(mu_);
    return map_.size();
  }
  [[nodiscard]] std::size_t page_refs() const {
    std::lock_guard<std::mutex> g(mu_);
    std::size_t n = 0;
    for (const auto& [k, e] : map_) n += e.pages.size();
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::uint64_t, Entry> map_;
};

}  // namespace kvpack::pool_detail
