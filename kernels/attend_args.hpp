// The arguments every fused dequant-attention kernel of kernels/ takes (scalar, AVX2, NEON, the
// keyframe kernel, split-K): the segments one KV head holds (exact rows and quantized blocks), the
// queries and outputs of its GQA group, and the kernel's reusable scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpack/codec/params.hpp"

namespace kvpack::kernels {

struct RopeArgs;  // kernels/rope.hpp

/// Full-precision rows of one KV head: token t's key at k + t * stride (floats), value likewise;
/// tokens carry cache indices [first, first + count).
struct ExactRows {
  const float* k = nullptr;
  const float* v = nullptr;
  std::int64_t stride = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
  const std::int32_t* pos = nullptr;  ///< PreRope, original positions: row t's position pos[t]
  std::int64_t rank = 0;              ///< PreRope, cache-relative: row 0's rank among held tokens
};

/// A quantized block of one KV head: payload laid out as BlockLayout. Without a mask, its first
/// `count` slots hold tokens with cache indices [first, first + count), masked causally. With a
/// mask (eviction caches), slot t is read iff bit t % 64 of valid[t / 64] is set, and every
/// masked-in slot is visible to every query (the cache only masks in tokens older than the
/// queries); `first` is then unused.
struct BlockRef {
  const std::byte* data = nullptr;
  std::int64_t first = 0;
  int count = 0;
  const std::uint64_t* valid = nullptr;
  std::uint8_t flags = 0;  ///< the block's BlockHeader::flags (keyframe delta/plain mode bits)
  /// PreRope, cache-relative positions (kernels/rope.hpp): slot t's rank among the head's held
  /// tokens is slot_rank[t] when set (eviction caches reuse slots), else rank + t. Original
  /// positions come from the payload, or from pos / pos_base below.
  std::int64_t rank = 0;
  const std::int32_t* slot_rank = nullptr;
  /// Caches that reuse slots (eviction, with `valid` set): the cache index of slot t (-1 when
  /// free), where AttendArgs::bias is read for it. Null: a masked block gets no bias.
  const std::int32_t* slot_index = nullptr;
  /// PreRope, original positions, payloads without slot positions (BlockLayout::pos_bytes 0:
  /// caches without eviction keep them per layer, run-length coded): slot t's position is
  /// pos[t] when set (the block spans a jump in the caller's positions), else pos_base + t.
  const std::int32_t* pos = nullptr;
  std::int64_t pos_base = 0;
};

/// Everything one KV head holds, in cache-index order.
struct HeadSegments {
  ExactRows sinks;
  std::span<const BlockRef> blocks;
  ExactRows pending;
  ExactRows chunk;
};

/// Queries and outputs of one GQA group. Query i (cache index q_first + i), group head j:
/// q + i * q_stride + j * head_dim; out likewise with out_stride. Causal: a query sees keys whose
/// cache index is <= its own.
///
/// key_mass (optional, for heavy-hitter eviction): when non-null, the kernel adds to
/// key_mass[ordinal] the attention probability each key received, summed over the n_q queries and
/// the group's query heads. Ordinals: sinks rows first, then block i slot t at
/// sinks.count + i * BlockTokens + t, then pending rows, then chunk rows. Masked or invisible keys
/// receive nothing. Scores are kept in scratch while the kernel runs: no second pass over K/V.
///
/// bias (optional, additive attention mask): when non-null, bias[c] is added to the scaled score
/// q.k * scale of the key with cache index c, for every query and every head of the group (one
/// bias per key, not per head); -inf drops the key. It must hold an entry for every cache index
/// the kernel reads (sinks, blocks' first + slot, pending and chunk rows), be finite or -inf, and
/// the kernels read it only for unmasked blocks (BlockRef::valid == nullptr). Honoured by
/// attend_scalar, attend_avx2 and attend_neon (kernels/simd_common.hpp); attend_keyframe ignores
/// it (its only caller, KVCache with Keyframe<> codecs, never sets it). nullptr: the kernels run
/// exactly as without the field (bit-identical outputs).
struct AttendArgs {
  int head_dim = 0;
  int group = 1;
  int n_q = 0;
  std::int64_t q_first = 0;
  float scale = 1.f;
  const float* q = nullptr;
  std::int64_t q_stride = 0;
  float* out = nullptr;
  std::int64_t out_stride = 0;
  float* key_mass = nullptr;
  const float* bias = nullptr;
  /// Keys stored before RoPE (PreRope<>, kernels/rope.hpp): when non-null, q is pre-RoPE too and
  /// the kernel rotates queries and dequantized keys at their positions before scoring. nullptr:
  /// keys and queries arrive rotated (bit-identical to kernels without the field).
  const RopeArgs* rope = nullptr;
};

/// Reusable working memory of the kernel (grown on demand, never shrunk: no steady-state allocation).
struct Scratch {
  std::vector<float> m, l, acc, scores, k_tile, v_tile;
  std::vector<float> logits;                 // [n_states][n_ordinals] when key_mass is requested
  std::int64_t n_ordinals = 0;
  std::vector<GroupParams> channel_params;  // per-channel key metadata of one token group
  std::vector<float> block_scores;           // keyframe kernel: [n_states][BlockTokens] probabilities
  std::vector<std::int8_t> q_int8;           // SIMD integer Q·K: quantized queries [2][n_states][D]
  std::vector<std::int32_t> q_offsets;       // ... their code-offset sums [n_states][groups]
  std::vector<float> q_params;               // ... and their per-group parameters, key tile metadata
  std::vector<std::int16_t> q_int16;         // AVX2 block path: int16 queries [n_states][D]
  std::vector<float> block_work;             // ... and its working memory (kernels/avx2/int_block.hpp)
  std::vector<float> channel_work;           // AVX2 per-channel block path (kernels/avx2/channel_block.hpp)
  std::vector<float> q_rope;                 // PreRope: the rotated queries [n_states][D]
  void ensure(int n_states, int head_dim, int tile) {
    const auto ns = static_cast<std::size_t>(n_states);
    const auto D = static_cast<std::size_t>(head_dim);
    const auto T = static_cast<std::size_t>(tile);
    // Each vector on its own: after a std::bad_alloc between two resizes the next call still
    // grows the one left short (tests/test_alloc_fault.cpp).
    if (m.size() < ns) m.resize(ns);
    if (l.size() < ns) l.resize(ns);
    if (acc.size() < ns * D) acc.resize(ns * D);
    if (scores.size() < T) scores.resize(T);
    if (k_tile.size() < T * D) k_tile.resize(T * D);
    if (v_tile.size() < T * D) v_tile.resize(T * D);
    if (channel_params.size() < D) channel_params.resize(D);
  }
};

}  // namespace kvpack::kernels
