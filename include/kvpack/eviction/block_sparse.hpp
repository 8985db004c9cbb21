// BlockSparse: eviction at storage-block granularity with a per-(layer, KV head) block bitmask.
#pragma once

#include "kvpack/eviction/budget.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

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
/// blocks >= live blocks), the live tokens are rewritten densely, in cache-index order, into
/// fresh blocks and the old blocks are zeroed and freed. Decode then reads contiguous, fully
/// valid blocks, and a head never allocates more than 2 * (live blocks) + 1 blocks: memory is
/// bounded by the budget however long the stream. Compaction copies codes bit-for-bit and keeps
/// the order of the live tiles, so attention output is unchanged by it.
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
  static constexpr int sink_tokens = 0;  // token-level sinks: none (use Sinks<N> for fp32 sinks)
  static constexpr int block_tokens = BlockTokens;
  static constexpr int sink_blocks = SinkBlocks;
  static constexpr int recent_blocks = RecentBlocks;
};

namespace detail {
template <class E>
inline constexpr bool is_block_sparse_v = false;
template <class Bu, int B, int S, int R>
inline constexpr bool is_block_sparse_v<BlockSparse<Bu, B, S, R>> = true;
template <class E>
inline constexpr int block_tokens_of_v = 64;  // unused for other policies
template <class Bu, int B, int S, int R>
inline constexpr int block_tokens_of_v<BlockSparse<Bu, B, S, R>> = B;
}  // namespace detail

}  // namespace kvpack
