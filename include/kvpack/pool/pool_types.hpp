// Plain types of the paged pool (pool/paged_cache.hpp): its configuration, sequence handles and
// statistics. Vocabulary follows vLLM's: a *page* (vLLM "block") is one storage block of
// Blocks<B> tokens of one (layer, KV head); a sequence's *page table* (vLLM "block table") lists
// its pages per layer and KV head, oldest first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/cache/shape.hpp"

namespace kvpack {

/// How a PagedCache is sized.
struct PoolConfig {
  /// Model shape. `shape.max_tokens` is the capacity of ONE sequence per layer (tokens it may
  /// hold) and, PreRope<>, the bound on positions (the RoPE table's size); the pool as a whole
  /// is bounded by `byte_budget`.
  ModelShape shape;
  /// Bytes of the page arena: floor(byte_budget / page_bytes) pages are available, where
  /// page_bytes is one block payload (BlockLayout::bytes) rounded up to 64 bytes. Must hold at
  /// least one page.
  std::size_t byte_budget = 0;
  /// Sequences that may exist at once (live handles), >= 1.
  int max_sequences = 1;
  /// How many newest tokens truncate() may drop (speculative decoding: the draft length).
  /// Each sequence keeps fp32 copies of its newest max_rollback_tokens + Residual + commit_unit - 1
  /// tokens per layer to rebuild the state before them exactly (0: no copies, no rollback).
  int max_rollback_tokens = 0;
};

/// Handle of a sequence in a PagedCache: a slot index and the generation of that slot. A handle
/// whose sequence was freed (or never existed) is rejected with Errc::invalid_argument by every
/// call, even after its slot was reused: the generation differs.
struct SeqId {
  std::uint32_t index = 0xFFFFFFFFu;
  std::uint32_t generation = 0;
  friend constexpr bool operator==(const SeqId&, const SeqId&) = default;
};

/// Additive attention masks of a batched decode (PagedCache::attend_batch with masks), one per
/// sequence of the batch, in the ragged CSR layout of FlashInfer's custom masks (a flat array plus
/// an index pointer): sequence i's mask is values[offsets[i], offsets[i + 1]), float32, one entry
/// per token the sequence holds in the layer attended (PagedCache::tokens(id, layer)). Entry t
/// belongs to the key with cache index t (0 = the oldest token, in order of append; the decode
/// query's own token is the last) and is added, in logit units, to the scaled score
/// q.k_t * scale before the softmax, for every query head (the same bias for all heads of every
/// GQA group; per-head masks are not supported). -INFINITY removes key t; NaN and +INFINITY are
/// rejected (Errc::non_finite), and so is a mask that removes every key (Errc::invalid_argument).
/// Example (ALiBi with slope s, sequence of n tokens): values[offsets[i] + t] = -s * (n - 1 - t).
struct BatchMask {
  std::span<const float> values;          ///< every mask, concatenated (any order the offsets name)
  std::span<const std::int64_t> offsets;  ///< N + 1 non-decreasing offsets into values
};

/// A page of a sequence's page table as PagedCache::pages() shows it.
struct PageView {
  std::uint32_t page = 0;          ///< page id in the arena
  const std::byte* data = nullptr; ///< payload (BlockLayout of block_layout())
  BlockHeader header;              ///< count = tokens stored in the page
  std::uint32_t refs = 0;          ///< references now (> 1: shared, read-only)
};

/// One live sequence in PoolStats.
struct SequenceStats {
  SeqId id;
  std::int64_t tokens = 0;        ///< tokens appended to layer 0 (the sequence length)
  std::size_t pages = 0;          ///< pages in its page tables (shared ones included; swapped-out ones not)
  std::size_t swapped_pages = 0;  ///< its pages held by a PageSwapTarget (swap_out; 0 when resident)
  std::size_t exact_bytes = 0;    ///< bytes of its fp32 rows (sinks, pending, rollback copies, latest chunk) and position runs
};

/// A snapshot of the pool (PagedCache::stats()).
struct PoolStats {
  std::size_t page_bytes = 0;     ///< bytes per page (block payload rounded up to 64)
  std::size_t pages_total = 0;    ///< pages in the arena
  std::size_t pages_used = 0;     ///< pages with a reference (sequences or the prefix cache)
  std::size_t pages_free = 0;     ///< pages on the free list
  std::size_t pages_shared = 0;   ///< pages referenced more than once (fork, prefix cache)
  std::size_t prefix_pages = 0;   ///< page references held by the prefix cache
  std::size_t prefix_entries = 0; ///< published prefix blocks
  std::size_t budget_bytes = 0;   ///< PoolConfig::byte_budget
  std::size_t bytes_used = 0;     ///< pages_used * page_bytes (each shared page counted once)
  std::size_t bytes_free = 0;     ///< pages_free * page_bytes
  /// Bytes the page tables would need if no page were shared: the sum over sequences of their
  /// pages times page_bytes (what separate caches would hold in blocks).
  std::size_t bytes_if_unshared = 0;
  std::size_t overhead_bytes = 0; ///< fixed overhead: per page its BlockHeader, refcount and free-list entry (24 B); a PreRope<> pool's RoPE table
  std::size_t exact_bytes = 0;    ///< fp32 rows and position runs of every sequence (SequenceStats::exact_bytes summed)
  std::size_t pages_swapped = 0;  ///< pages of swapped-out sequences held by their PageSwapTargets (not in the arena)
  std::vector<SequenceStats> sequences;  ///< live sequences, by slot index
};

}  // namespace kvpack
