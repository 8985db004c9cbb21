// Swapped-out pool pages in an OffloadStore: the PageSwapTarget (pool/page_swap.hpp) that makes
// PagedCache::swap_out write a sequence's pages as records of the store's lower tiers (host RAM
// or the file tier) and swap_in read them back. Pages are compressed already (the pool's codes
// and metadata), and every record is sealed with the store's AEAD (XChaCha20-Poly1305 or
// AES-256-GCM) bound to the store's cache id, the page's key and a fresh version, so a tampered,
// swapped or replayed record is Errc::auth_failed at swap_in and the sequence stays swapped out.
// Erased records are wiped (hot copies) or their slots freed (file tier).
//
//   StoreConfig c;
//   c.layout = swap_layout_for(pool);
//   c.file = FileTier{.directory = "/var/tmp"};   // encrypted at rest
//   auto store = OffloadStore::create(c).value();  // an ephemeral data key
//   StoreSwapTarget target(*store);
//   pool.swap_out(seq, target);  ...  pool.swap_in(seq);
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "kvpack/cache/block.hpp"
#include "kvpack/offload/cache_layout.hpp"
#include "kvpack/offload/offload_store.hpp"
#include "kvpack/pool/page_swap.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

/// The RecordLayout of an OffloadStore holding swapped-out pages of `pool` (a PagedCache, or a
/// registry::AnyPool through its codec_format() and page_header()): layout_for(pool) with room
/// for the page's 16-byte BlockHeader before its payload.
template <class Pool>
[[nodiscard]] RecordLayout swap_layout_for(const Pool& pool) noexcept {
  RecordLayout l;
  if constexpr (requires { typename Pool::codec_hook; }) {
    l = layout_for(pool);
  } else {
    const kvpack::BlockHeader h = pool.page_header();
    l.codec_format = pool.codec_format();
    l.k_bits = h.k_bits, l.v_bits = h.v_bits, l.flags = h.flags;
    l.k_group = h.k_group, l.v_group = h.v_group, l.head_dim = h.head_dim;
    l.block_tokens = static_cast<uint16_t>(pool.block_tokens());
  }
  l.max_payload_bytes = static_cast<uint32_t>(pool.block_layout().bytes + sizeof(kvpack::BlockHeader));
  return l;
}

/// A PageSwapTarget over an OffloadStore (created with swap_layout_for(pool)). A page is stored
/// under BlockKey{layer, kv_head, (slot index << 32) | page index} as its header followed by its
/// payload; with `write_through` (default) store() moves the record to a lower tier at once
/// (OffloadStore::offload), so the page leaves process memory in encrypted form before swap_out
/// returns; without it the store's resident budget decides. The store must serve this target
/// only, and the target one pool (keys carry the slot, not the generation or the pool: another
/// user of the store would overwrite records). Thread-safe as the store is.
class StoreSwapTarget final : public kvpack::PageSwapTarget {
 public:
  /// `store` must outlive this target and every page swapped into it.
  explicit StoreSwapTarget(OffloadStore& store, bool write_through = true) noexcept : store_(store), through_(write_through) {}

  /// The store's put() and, with write_through, offload() errors: Errc::invalid_argument (a
  /// payload larger than the store's layout allows), capacity_exceeded (no lower tier, or it is
  /// full), io_error; nothing stays stored then.
  [[nodiscard]] Status store(const SwapPageKey& key, const kvpack::BlockHeader& header,
                             std::span<const std::byte> payload) override {
    const BlockKey k = block_key(key);
    SecureBytes rec(sizeof(kvpack::BlockHeader) + payload.size());
    std::memcpy(rec.data(), &header, sizeof(kvpack::BlockHeader));
    if (!payload.empty()) std::memcpy(rec.data() + sizeof(kvpack::BlockHeader), payload.data(), payload.size());
    if (Status s = store_.put(k, header.count, std::move(rec)); !s) return s;
    if (!through_) return {};
    if (Status s = store_.offload(k); !s) {
      (void)store_.erase(k);
      return s;
    }
    return {};
  }
  /// The store's acquire() errors (not_present, io_error, corrupt_data, auth_failed), and
  /// Errc::corrupt_data when the record is not one header and `payload.size()` bytes.
  [[nodiscard]] Status load(const SwapPageKey& key, kvpack::BlockHeader& header, std::span<std::byte> payload) override {
    auto h = store_.acquire(block_key(key));
    if (!h) return h.error();
    const std::span<const std::byte> rec = h->bytes();
    if (rec.size() != sizeof(kvpack::BlockHeader) + payload.size())
      return fail(Errc::corrupt_data, describe(block_key(key)) + ": swapped page record of " + std::to_string(rec.size()) +
                                          " bytes, expected " + std::to_string(sizeof(kvpack::BlockHeader) + payload.size()));
    std::memcpy(&header, rec.data(), sizeof(kvpack::BlockHeader));
    if (!payload.empty()) std::memcpy(payload.data(), rec.data() + sizeof(kvpack::BlockHeader), payload.size());
    return {};
  }
  void erase(const SwapPageKey& key) noexcept override { (void)store_.erase(block_key(key)); }

  /// The store's key of a swapped page.
  [[nodiscard]] static BlockKey block_key(const SwapPageKey& k) noexcept {
    return {k.layer, k.kv_head, static_cast<int64_t>((static_cast<uint64_t>(k.seq.index) << 32) | static_cast<uint64_t>(k.page))};
  }

 private:
  OffloadStore& store_;
  bool through_;
};

}  // namespace kvpack::offload
