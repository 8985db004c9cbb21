// HeadStore: the quantized blocks of one (layer, KV head) and, for caches that evict, the slot
// bookkeeping that lets a token's slot be freed and reused (slot = block * B + offset).
//
// Without eviction, tokens fill slots in arrival order and only `blocks` is used. With eviction,
// every slot carries its cache index (-1 when free), a score (the eviction policy's), and a
// validity bit (what attention reads); freed slots are zeroed and reused before the pool grows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/block.hpp"
#include "kvpack/detail/secure_zero.hpp"

namespace kvpack {

/// A new zeroed block of layout.bytes payload bytes carrying `proto`'s header fields.
[[nodiscard]] inline Block make_block(const BlockLayout& layout, const BlockHeader& proto) {
  Block b;
  b.data = std::make_unique<std::byte[]>(layout.bytes);  // value-initialized: zeroed
  b.bytes = layout.bytes;
  b.header = proto;
  return b;
}

/// Moves the payload of `b` into an allocation of exactly `used` bytes when it holds more (a
/// keyframe block, coded into a block of the largest size before its modes were known); the
/// larger buffer is zeroed and freed. An allocation failure is not an error: the block keeps the
/// larger buffer (b.bytes says so), so a commit after the reservation still cannot fail.
inline void fit_payload(Block& b, std::size_t used) noexcept {
  if (used >= b.bytes || !b.data) return;
  std::unique_ptr<std::byte[]> exact(new (std::nothrow) std::byte[used]);
  if (!exact) return;
  std::memcpy(exact.get(), b.data.get(), used);
  detail::secure_zero(b.data.get(), b.bytes);
  b.data = std::move(exact);
  b.bytes = used;
}

/// Blocks and slot bookkeeping of one (layer, KV head).
struct HeadStore {
  std::vector<Block> blocks;
  std::vector<std::uint64_t> valid;      ///< words_per_block(B) words per block; bit set = live slot
  std::vector<std::int32_t> slot_token;  ///< cache index held by each slot, -1 when free
  std::vector<float> slot_score;         ///< the eviction policy's score of each slot
  std::vector<std::int32_t> free_slots;  ///< freed slots, reused last-freed first
  std::vector<Block> spare;              ///< zeroed blocks allocated ahead by reserve_slots, used first
  std::int64_t live = 0;                 ///< live slots

  HeadStore() = default;
  HeadStore(HeadStore&&) noexcept = default;  // vector<HeadStore> must move, never copy, its blocks
  HeadStore& operator=(HeadStore&&) noexcept = default;

  /// 64-bit validity words per block of B tokens.
  [[nodiscard]] static constexpr std::size_t words_per_block(int B) noexcept {
    return (static_cast<std::size_t>(B) + 63) / 64;
  }
  /// Slots allocated (blocks * B once blocks exist; the last block may be partly allocated).
  [[nodiscard]] std::int64_t slots() const noexcept { return static_cast<std::int64_t>(slot_token.size()); }
  /// Whether any slot of block b is live.
  [[nodiscard]] bool any_valid(std::size_t b, int B) const noexcept {
    const std::size_t w = words_per_block(B);
    for (std::size_t i = 0; i < w; ++i)
      if (valid[b * w + i] != 0) return true;
    return false;
  }

  /// A zeroed block for the pool: a spare one (reserve_slots) when there is one, else a new one.
  [[nodiscard]] Block new_block(const BlockLayout& layout, const BlockHeader& proto) {
    if (spare.empty()) return make_block(layout, proto);
    Block b = std::move(spare.back());
    spare.pop_back();
    return b;
  }
  /// Allocates ahead what growing to `slots_after` slots needs (block payloads as spares, vector
  /// capacities; with `evicts`, the slot bookkeeping and room for every slot to be freed), so that
  /// committing and evicting up to there allocate nothing: KVCache::append reserves first and
  /// mutates after, so an allocation failure leaves the cache unchanged. May throw std::bad_alloc
  /// (what was reserved stays reserved and counts in allocated_bytes; contents are unchanged).
  void reserve_slots(std::int64_t slots_after, bool evicts, const BlockLayout& layout, const BlockHeader& proto) {
    const auto B = static_cast<std::size_t>(layout.tokens);
    const std::size_t blocks_after = (static_cast<std::size_t>(std::max<std::int64_t>(slots_after, 0)) + B - 1) / B;
    if (blocks_after <= blocks.size()) return;
    reserve_geometric(blocks, blocks_after);
    reserve_geometric(spare, blocks_after - blocks.size());
    while (blocks.size() + spare.size() < blocks_after) spare.push_back(make_block(layout, proto));
    if (evicts) {
      reserve_geometric(valid, blocks_after * words_per_block(layout.tokens));
      reserve_geometric(slot_token, blocks_after * B), reserve_geometric(slot_score, blocks_after * B);
      reserve_geometric(free_slots, blocks_after * B);
    }
  }

  /// A free slot (reused first), growing the pool by one block of `layout` when needed.
  std::int64_t take_slot(const BlockLayout& layout, const BlockHeader& proto) {
    if (!free_slots.empty()) {
      const std::int32_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    const auto s = slots();
    if (s % layout.tokens == 0) {
      blocks.push_back(new_block(layout, proto));
      valid.resize(valid.size() + words_per_block(layout.tokens), 0);
    }
    slot_token.push_back(-1);
    slot_score.push_back(0.f);
    return s;
  }

  /// Marks `slot` live, holding cache index `token` with `score`.
  void fill_slot(std::int64_t slot, std::int64_t token, float score, int B) noexcept {
    const auto su = static_cast<std::size_t>(slot);
    const auto bu = static_cast<std::size_t>(B);
    valid[su / bu * words_per_block(B) + (su % bu) / 64] |= std::uint64_t{1} << ((su % bu) % 64);
    slot_token[su] = static_cast<std::int32_t>(token);
    slot_score[su] = score;
    ++live;
  }

  /// Evicts `slot`: clears its bit, zeroes its codes, metadata and position, frees it for reuse.
  void evict_slot(std::int64_t slot, const BlockLayout& L) noexcept {
    const auto su = static_cast<std::size_t>(slot);
    const auto bu = static_cast<std::size_t>(L.tokens);
    valid[su / bu * words_per_block(L.tokens) + (su % bu) / 64] &= ~(std::uint64_t{1} << ((su % bu) % 64));
    std::byte* d = blocks[su / bu].data.get();
    const std::size_t off = su % bu;
    detail::secure_zero(d + L.k_codes + off * L.k_row, L.k_row);
    detail::secure_zero(d + L.k_meta + off * L.k_meta_token, L.k_meta_token);
    detail::secure_zero(d + L.v_codes + off * L.v_row, L.v_row);
    detail::secure_zero(d + L.v_meta + off * L.v_meta_token, L.v_meta_token);
    detail::secure_zero(d + L.positions + off * L.pos_bytes, L.pos_bytes);
    ++blocks[su / bu].header.version;
    slot_token[su] = -1;
    slot_score[su] = 0.f;
    free_slots.push_back(static_cast<std::int32_t>(slot));
    --live;
  }

  /// Forgets `slot` without zeroing its payload (block-granular eviction zeroes whole blocks at
  /// compaction); its validity bit is left as it was.
  void forget_slot(std::int64_t slot) noexcept {
    const auto su = static_cast<std::size_t>(slot);
    if (slot_token[su] >= 0) --live;
    slot_token[su] = -1;
    slot_score[su] = 0.f;
  }

  /// Rewrites the live slots densely, in cache-index order, into fresh blocks (codes copied
  /// bit-for-bit, scores carried); zeroes and frees the old blocks. Per-token layouts only.
  void compact(const BlockLayout& L, const BlockHeader& proto) {
    std::vector<std::pair<std::int32_t, std::int32_t>> order;  // (token, slot)
    for (std::size_t s = 0; s < slot_token.size(); ++s)
      if (slot_token[s] >= 0) order.emplace_back(slot_token[s], static_cast<std::int32_t>(s));
    std::sort(order.begin(), order.end());
    HeadStore fresh;
    const auto B = static_cast<std::size_t>(L.tokens);
    for (const auto& [tok, slot] : order) {
      const std::int64_t ns = fresh.take_slot(L, proto);
      const auto so = static_cast<std::size_t>(slot) % B, dof = static_cast<std::size_t>(ns) % B;
      const std::byte* src = blocks[static_cast<std::size_t>(slot) / B].data.get();
      Block& db = fresh.blocks[static_cast<std::size_t>(ns) / B];
      std::byte* dst = db.data.get();
      std::memcpy(dst + L.k_codes + dof * L.k_row, src + L.k_codes + so * L.k_row, L.k_row);
      std::memcpy(dst + L.k_meta + dof * L.k_meta_token, src + L.k_meta + so * L.k_meta_token, L.k_meta_token);
      std::memcpy(dst + L.v_codes + dof * L.v_row, src + L.v_codes + so * L.v_row, L.v_row);
      std::memcpy(dst + L.v_meta + dof * L.v_meta_token, src + L.v_meta + so * L.v_meta_token, L.v_meta_token);
      std::memcpy(dst + L.positions + dof * L.pos_bytes, src + L.positions + so * L.pos_bytes, L.pos_bytes);
      db.header.count = static_cast<std::uint16_t>(dof + 1);
      fresh.fill_slot(ns, tok, slot_score[static_cast<std::size_t>(slot)], L.tokens);
    }
    for (Block& b : blocks)
      if (b.data) detail::secure_zero(b.data.get(), b.bytes);
    *this = std::move(fresh);
  }

  /// Zeroes every block payload, all b.bytes of each (the blocks stay allocated).
  void zero_blocks() noexcept {
    for (Block& b : blocks)
      if (b.data) detail::secure_zero(b.data.get(), b.bytes);
  }
};

}  // namespace kvpack
