// BlockSparse: eviction at storage-block granularity with a per-(layer, KV head) block bitmask.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/eviction/budget.hpp"
#include "kvpack/eviction/hook.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

namespace eviction {
/// BlockSparse's hook: per (layer, KV head) a bitmask with one bit per allocated block (set =
/// live); block scores are the summed cumulative mass of their tokens (as H2O's token scores).
template <class P>
class BlockSparseHook : public HookDefaults {
 public:
  static constexpr bool wants_mass = true;
  static constexpr int required_block_tokens = P::block_tokens;
  static constexpr bool evicts_continuously = true;

  /// Errc::invalid_argument when the resolved budget cannot hold the protected blocks.
  [[nodiscard]] static Status check(const ModelShape& shape) {
    const std::int64_t b = P::budget_type::resolve(shape.max_tokens);
    if (b >= P::protected_tokens) return {};
    return fail(Errc::invalid_argument, "KVCache::create: BlockSparse budget of " + std::to_string(b) +
                                            " tokens (from max_tokens " + std::to_string(shape.max_tokens) +
                                            ") is below the " + std::to_string(P::protected_tokens) +
                                            " tokens of its sink, recent and open blocks");
  }
  void init(const ModelShape& shape) {
    budget_ = P::budget_type::resolve(shape.max_tokens);
    heads_ = shape.kv_heads;
    masks_.assign(static_cast<std::size_t>(shape.layers) * static_cast<std::size_t>(shape.kv_heads), {});
  }
  void reset() {
    for (Mask& m : masks_) m = {};
  }
  [[nodiscard]] std::int64_t budget() const noexcept { return budget_; }
  /// Sets the budget to `b` tokens (the protocol wrapper, eviction/protocol.hpp, resolves it
  /// against the prompt when the prompt ends).
  void set_budget(std::int64_t b) noexcept { budget_ = b; }

  /// A new block is live.
  template <class St>
  void on_commit(St& st, int li, int h, std::int64_t, std::int64_t) {
    mark_live(mask(li, h), st.block_count(li, h));
  }
  /// Evicts whole blocks (lowest summed mass first, oldest on ties; never the first SinkBlocks,
  /// the open block or the RecentBlocks before it) until the head fits the budget, then compacts
  /// when at least half of the allocated blocks are masked out.
  template <class St>
  void enforce(St& st, int li, int h, std::int64_t pend) {
    auto& L = st.layer(li);
    HeadStore& H = L.heads[static_cast<std::size_t>(h)];
    Mask& m = mask(li, h);
    constexpr auto B = static_cast<std::size_t>(P::block_tokens);
    while (L.sinks_held + H.live + pend > budget_) {
      const std::size_t nb = st.block_count(li, h);
      const std::size_t protected_tail = static_cast<std::size_t>(P::recent_blocks) + 1;
      if (nb <= protected_tail) break;
      std::int64_t victim = -1;
      double best = 0;
      for (std::size_t b = static_cast<std::size_t>(P::sink_blocks); b < nb - protected_tail; ++b) {
        if (!live(m, b)) continue;
        double score = 0;
        for (std::size_t t = 0; t < B; ++t) score += H.slot_score[b * B + t];
        if (victim < 0 || score < best) victim = static_cast<std::int64_t>(b), best = score;
      }
      if (victim < 0) break;
      if constexpr (requires { st.drop_block(li, h, std::size_t{}); }) {
        st.drop_block(li, h, static_cast<std::size_t>(victim));  // a page pool frees the page at once
        relabel_live(m, st.block_count(li, h));
      } else {
        evict_block(st, li, h, m, static_cast<std::size_t>(victim), budget_);
      }
    }
    if constexpr (!requires { st.drop_block(li, h, std::size_t{}); }) {  // (a page pool holds no masked-out block)
      std::size_t live_blocks = 0;
      for (std::uint64_t w : m.words) live_blocks += static_cast<std::size_t>(std::popcount(w));
      const std::size_t nb = st.block_count(li, h);
      if (live_blocks < nb && nb - live_blocks >= live_blocks) compact(st, li, h);
    }
  }
  /// Room for the bits of `blocks` blocks of KV head h of layer li, so that on_commit allocates
  /// nothing (a paged store's reserve_append calls it). May throw std::bad_alloc (no change).
  void reserve_blocks(int li, int h, std::size_t blocks) { reserve_geometric(mask(li, h).words, (blocks + 63) / 64); }
  /// A masked-out block is never read.
  template <class St>
  [[nodiscard]] bool block_visible(const St&, int li, int h, std::size_t b) const noexcept {
    return live(masks_[index(li, h)], b);
  }
  template <class St>
  void on_mass(St& st, int li, int h, const kernels::HeadSegments& seg, std::span<const float> mass) {
    credit_mass(st, li, h, seg, mass, Credit::add);
  }
  /// KVCache::compact_blocks: rewrites every KV head of layer li densely.
  template <class St>
  void compact_layer(St& st, int li) {
    for (int h = 0; h < heads_; ++h) compact(st, li, h);
  }
  /// The block bitmask of (layer li, KV head h) (KVCache::block_mask).
  [[nodiscard]] std::span<const std::uint64_t> mask_words(int li, int h) const noexcept { return masks_[index(li, h)].words; }
  /// Masked-out blocks hold memory until compaction: every allocated slot counts.
  [[nodiscard]] std::size_t payload_slots(const HeadStore& H) const noexcept { return H.slot_token.size(); }
  [[nodiscard]] std::size_t extra_bytes(int li, int h) const noexcept {
    return masks_[index(li, h)].words.size() * sizeof(std::uint64_t);
  }
  void wipe() noexcept { masks_.clear(); }

 private:
  struct Mask {
    std::vector<std::uint64_t> words;  // bit b % 64 of word b / 64: block b live
    std::size_t blocks = 0;            // blocks the mask covers
  };
  [[nodiscard]] std::size_t index(int li, int h) const noexcept {
    return static_cast<std::size_t>(li) * static_cast<std::size_t>(heads_) + static_cast<std::size_t>(h);
  }
  [[nodiscard]] Mask& mask(int li, int h) noexcept { return masks_[index(li, h)]; }
  [[nodiscard]] static bool live(const Mask& m, std::size_t b) noexcept { return ((m.words[b / 64] >> (b % 64)) & 1u) != 0; }
  // Every one of `blocks` blocks live, in the words m has (a paged store's blocks after a drop:
  // fewer than before, so nothing is allocated).
  static void relabel_live(Mask& m, std::size_t blocks) noexcept {
    std::fill(m.words.begin(), m.words.end(), std::uint64_t{0});
    for (std::size_t b = 0; b < blocks; ++b) m.words[b / 64] |= std::uint64_t{1} << (b % 64);
    m.blocks = blocks;
  }
  static void mark_live(Mask& m, std::size_t blocks) {
    for (; m.blocks < blocks; ++m.blocks) {
      if (m.blocks / 64 >= m.words.size()) m.words.push_back(0);
      m.words[m.blocks / 64] |= std::uint64_t{1} << (m.blocks % 64);
    }
  }
  // Masks out block b of KV head h of layer li (bit cleared, slots demoted with Demote<> and
  // forgotten). The block bit alone hides the block from attention; the payload is zeroed and
  // freed by the next compaction.
  template <class St>
  static void evict_block(St& st, int li, int h, Mask& m, std::size_t b, std::int64_t budget) {
    HeadStore& H = st.layer(li).heads[static_cast<std::size_t>(h)];
    m.words[b / 64] &= ~(std::uint64_t{1} << (b % 64));
    for (std::size_t t = 0; t < static_cast<std::size_t>(P::block_tokens); ++t) {
      const auto slot = static_cast<std::int64_t>(b * static_cast<std::size_t>(P::block_tokens) + t);
      st.demote_slot(li, h, slot, budget);
      H.forget_slot(slot);
    }
    ++H.blocks[b].header.version;
  }
  // Rewrites head h densely: KVCache's store erases the masked-out blocks in place (no allocation,
  // so an append stays all or nothing); the mask keeps its words.
  template <class St>
  void compact(St& st, int li, int h) {
    Mask& m = mask(li, h);
    st.erase_blocks(li, h, [&](std::size_t b) { return live(m, b); });
    relabel_live(m, st.block_count(li, h));
  }

  std::int64_t budget_ = 0;
  int heads_ = 0;
  std::vector<Mask> masks_;  // [layer * kv_heads + h]
};
}  // namespace eviction

/// Block-granular eviction (a block-level heavy-hitter policy in the spirit of H2O, Zhang et al.
/// 2023, arXiv:2306.14048, with the block-sparse layout of paged/block-sparse attention).
///
/// Unit: one storage block of BlockTokens consecutive tokens of one (layer, KV head). The cache's
/// block size is BlockTokens (a Blocks<B> policy with another B is a compile-time error).
/// Every (layer, KV head) keeps a bitmask with one bit per allocated block (KVCache::block_mask):
/// set = live. Decode and prefill attention skip a cleared block without reading its payload.
///
/// Which blocks go: while the head holds more than Budget tokens (fp32 sinks, live quantized
/// tokens and pending tokens all count), the live block with the smallest **block score** is
/// evicted, where the block score is the sum over its tokens of the cumulative attention mass
/// each token received (AttendArgs::key_mass, gathered by the kernel as it runs, summed over
/// queries, steps and the GQA group's query heads, exactly as H2O's token scores). Never evicted:
/// the first SinkBlocks blocks (attention sinks at block granularity), the newest block (open, it
/// may be partly filled) and the RecentBlocks full blocks before it. Ties evict the oldest block.
/// Only full blocks are candidates, so a head holds between Budget - BlockTokens + 1 and Budget
/// tokens once the budget is reached (block granularity).
///
/// Compaction: evicting only clears the mask bit (and the slots' bookkeeping); the payload stays
/// allocated. When at least half of a head's allocated blocks are masked out (threshold: masked
/// blocks >= live blocks), the masked-out blocks are zeroed and freed and the live ones move down
/// in place, in cache-index order (nothing is allocated, so an append stays all or nothing).
/// Decode then reads contiguous, fully valid blocks, and a head never allocates more than
/// 2 * (live blocks) + 1 blocks: memory is bounded by the budget however long the stream.
/// Compaction keeps the codes and the order of the live tiles, so attention output is unchanged
/// by it. On the page pool (EvictingPagedCache) a victim block is a page that leaves the
/// sequence's page table at once: no masked-out block is ever held there.
///
/// Positions: original positions are kept (keys post-RoPE, never re-rotated), as for every policy.
/// Per-channel keys are not supported yet (compile-time error, like the token-level policies).
/// Budget: Tokens<N> or Fraction<Num, Den> of ModelShape::max_tokens, resolved at create();
/// it must cover the protected blocks: (SinkBlocks + RecentBlocks + 1) * BlockTokens tokens
/// (compile time for Tokens<N>, Errc::invalid_argument from create() for a fraction).
template <EvictionBudget Budget, int BlockTokens = 64, int SinkBlocks = 1, int RecentBlocks = 1>
struct BlockSparse {
  static_assert(BlockTokens >= 8 && BlockTokens <= 1024 && (BlockTokens & (BlockTokens - 1)) == 0,
                "kvpack::BlockSparse<Budget, BlockTokens>: BlockTokens must be a power of two in [8, 1024]");
  static_assert(SinkBlocks >= 0 && RecentBlocks >= 0,
                "kvpack::BlockSparse<Budget, B, SinkBlocks, RecentBlocks>: need SinkBlocks >= 0, RecentBlocks >= 0");
  /// Tokens the protected blocks (sinks, recent, the open block) can hold.
  static constexpr long long protected_tokens = static_cast<long long>(SinkBlocks + RecentBlocks + 1) * BlockTokens;
  static_assert(Budget::is_fraction || Budget::resolve(0) >= protected_tokens,
                "kvpack::BlockSparse<Tokens<N>, B, SinkBlocks, RecentBlocks>: the budget N must be at least "
                "(SinkBlocks + RecentBlocks + 1) * B tokens (the blocks that are never evicted)");
  using kvpack_role = role::eviction;
  using budget_type = Budget;
  static constexpr bool evicts = true;
  using hook = eviction::BlockSparseHook<BlockSparse>;
  static constexpr int sink_tokens = 0;  // token-level sinks: none (use Sinks<N> for fp32 sinks)
  static constexpr int block_tokens = BlockTokens;
  static constexpr int sink_blocks = SinkBlocks;
  static constexpr int recent_blocks = RecentBlocks;
};

}  // namespace kvpack
