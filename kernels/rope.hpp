// Rotary position embedding (RoPE; Su et al. 2021, "RoFormer") applied inside the attention
// kernels, for caches that store keys before RoPE (PreRope<>, policy.hpp). KVQuant (Hooper et al.
// 2024) showed that keys quantize better before RoPE, whose position-dependent rotation mixes
// channel pairs and smears per-channel outlier structure; and a cache holding pre-RoPE keys can
// rotate them at any position it chooses, e.g. their rank within the cache after eviction
// (StreamingLLM's cache-relative positions; Xiao et al. 2024).
//
// Convention: pair i (i < pairs = rope_dims / 2) of a head row rotates by angle pos * theta_i,
// theta_i = base^(-2i / rope_dims), as (x_a, x_b) -> (x_a cos - x_b sin, x_a sin + x_b cos), with
// (a, b) = (2i, 2i + 1) ("normal" / GPT-J pairing, llama.cpp's LLAMA_ROPE_TYPE_NORM) or
// (i, i + pairs) (NeoX pairing, LLAMA_ROPE_TYPE_NEOX); channels >= rope_dims are not rotated
// (partial rotary). Keys are rotated once per dequantized tile and reused by every query head of
// the GQA group; queries once per attend call. The integer Q·K paths of AVX2 score codes without
// dequantizing, so they step aside for PreRope caches (the fp32 tile path runs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/config.hpp"
#include "kvpack/kernels/attend_args.hpp"

#if KVPACK_HAS_AVX2
#include <immintrin.h>
#endif

namespace kvpack::kernels {

/// What a kernel needs to rotate pre-RoPE queries and keys (AttendArgs::rope).
struct RopeArgs {
  const float* table = nullptr;  ///< [positions][pairs][2]: cos, sin of pos * theta_i (RopeTable)
  std::int64_t positions = 0;    ///< rows of the table; larger positions are clamped to the last
  int pairs = 0;                 ///< rotated channel pairs (rope_dims / 2)
  bool neox = false;             ///< NeoX pairing (i, i + pairs); else adjacent (2i, 2i + 1)
  bool relative = false;         ///< cache-relative: a token's position is its rank among held tokens
  const std::int32_t* q_pos = nullptr;  ///< original positions: position of query i (n_q entries)
  std::int64_t q_rank = 0;              ///< cache-relative: rank of query 0 (queries follow)
};

/// Rotates one head row x (>= 2 * pairs floats) to position `pos` (clamped into the table).
/// Adjacent pairs run 4 at a time on AVX2 where the translation unit has it (every backend's
/// kernel, the scalar one included, calls this: the rotation is not what a backend tests).
inline void rope_row(float* x, const RopeArgs& r, std::int64_t pos) noexcept {
  pos = std::clamp<std::int64_t>(pos, 0, r.positions - 1);
  const float* cs = r.table + static_cast<std::size_t>(pos) * 2 * static_cast<std::size_t>(r.pairs);
  const int step = r.neox ? 1 : 2, partner = r.neox ? r.pairs : 1;
  int i = 0;
#if KVPACK_HAS_AVX2
  if (!r.neox)
    for (; i + 4 <= r.pairs; i += 4) {  // lanes (x_a, x_b) per pair: (x_a c - x_b s, x_b c + x_a s)
      const __m256 v = _mm256_loadu_ps(x + 2 * i), t = _mm256_loadu_ps(cs + 2 * i);
      const __m256 swapped = _mm256_permute_ps(v, 0xB1);
      _mm256_storeu_ps(x + 2 * i, _mm256_addsub_ps(_mm256_mul_ps(v, _mm256_moveldup_ps(t)),
                                                   _mm256_mul_ps(swapped, _mm256_movehdup_ps(t))));
    }
#endif
  for (; i < r.pairs; ++i) {
    float* a = x + i * step;
    const float xa = a[0], xb = a[partner], c = cs[2 * i], s = cs[2 * i + 1];
    a[0] = xa * c - xb * s;
    a[partner] = xa * s + xb * c;
  }
}

/// Position of query i (its original position, or its rank).
[[nodiscard]] inline std::int64_t rope_query_pos(const RopeArgs& r, int i) noexcept {
  return r.relative ? r.q_rank + i : r.q_pos[i];
}

/// dst[t][0, D) = exact row t0 + t of `rows` (keys), rotated at its position, for t < n.
inline void rope_exact_rows(const RopeArgs& r, const ExactRows& rows, std::int64_t t0, int n, int D,
                            float* dst) noexcept {
  for (int t = 0; t < n; ++t) {
    float* d = dst + static_cast<std::size_t>(t) * static_cast<std::size_t>(D);
    std::memcpy(d, rows.k + (t0 + t) * rows.stride, static_cast<std::size_t>(D) * sizeof(float));
    rope_row(d, r, r.relative ? rows.rank + t0 + t : rows.pos[t0 + t]);
  }
}

/// Rotates the dequantized keys of slots [t0, t0 + n) of block b, row t at tile + t * D, each at
/// its position: the one stored in the payload, or given by the ref when the payload holds none
/// (original: b.pos[slot] or b.pos_base + slot), or its rank among the head's held tokens
/// (cache-relative: b.slot_rank[slot] when set, else b.rank + slot). Slots masked out by b.valid
/// are skipped.
inline void rope_block_rows(const RopeArgs& r, const BlockRef& b, const BlockLayout& L, int t0, int n, float* tile,
                            int D) noexcept {
  for (int t = 0; t < n; ++t) {
    const int slot = t0 + t;
    if (b.valid && !((b.valid[slot / 64] >> (slot % 64)) & 1u)) continue;
    std::int64_t pos = b.slot_rank ? b.slot_rank[slot] : b.rank + slot;
    if (!r.relative) {
      if (L.pos_bytes) {
        std::int32_t p;
        std::memcpy(&p, b.data + L.positions + static_cast<std::size_t>(slot) * sizeof p, sizeof p);
        pos = p;
      } else {
        pos = b.pos ? std::int64_t{b.pos[slot]} : b.pos_base + slot;
      }
    }
    rope_row(tile + static_cast<std::size_t>(t) * static_cast<std::size_t>(D), r, pos);
  }
}

/// Rotated copies of the n_q * group queries of `a` ([n_states][D] in s.q_rope): the arguments a
/// kernel runs with. Returns `a` itself when it carries no RopeArgs.
[[nodiscard]] inline AttendArgs rope_queries(const AttendArgs& a, Scratch& s) {
  if (!a.rope) return a;
  const auto D = static_cast<std::size_t>(a.head_dim);
  const std::size_t n_states = static_cast<std::size_t>(a.n_q) * static_cast<std::size_t>(a.group);
  if (s.q_rope.size() < n_states * D) s.q_rope.resize(n_states * D);
  for (int i = 0; i < a.n_q; ++i)
    for (int j = 0; j < a.group; ++j) {
      float* d = s.q_rope.data() + (static_cast<std::size_t>(i) * a.group + j) * D;
      std::memcpy(d, a.q + i * a.q_stride + j * a.head_dim, D * sizeof(float));
      rope_row(d, *a.rope, rope_query_pos(*a.rope, i));
    }
  AttendArgs r = a;
  r.q = s.q_rope.data();
  r.q_stride = static_cast<std::int64_t>(a.group) * a.head_dim;
  return r;
}

/// Fills the ranks of seg for cache-relative positions: every held token in cache-index order,
/// sinks first, then the blocks, pending rows, the latest chunk. Blocks without a slot mask hold
/// slots in arrival order (b.rank); a head whose slots are reused (eviction caches, BlockRef::valid)
/// passes slot_token (the cache index of each slot, -1 when free) and gets a rank per read slot in
/// `slot_rank` (b.slot_rank points into it). `blocks` is seg.blocks' storage, B the block tokens.
/// Returns the held tokens, so the n_q queries (the newest held tokens) start at the result - n_q.
inline std::int64_t assign_rope_ranks(HeadSegments& seg, std::vector<BlockRef>& blocks, int B,
                                      const std::vector<std::int32_t>* slot_token,
                                      std::vector<std::int32_t>& slot_rank, std::vector<std::int64_t>& order) {
  std::int64_t rank = seg.sinks.count;
  if (slot_token) {  // rank = order of the read slots' cache indices
    order.clear();
    for (std::size_t bi = 0; bi < blocks.size(); ++bi) {
      const BlockRef& b = blocks[bi];
      for (int t = 0; t < b.count; ++t) {
        const std::size_t slot = bi * static_cast<std::size_t>(B) + static_cast<std::size_t>(t);
        if (b.valid && !((b.valid[t / 64] >> (t % 64)) & 1u)) continue;
        order.push_back((static_cast<std::int64_t>((*slot_token)[slot]) << 32) | static_cast<std::int64_t>(slot));
      }
    }
    std::sort(order.begin(), order.end());
    slot_rank.assign(blocks.size() * static_cast<std::size_t>(B), 0);
    for (const std::int64_t o : order) slot_rank[static_cast<std::size_t>(o & 0xFFFFFFFF)] = static_cast<std::int32_t>(rank++);
    for (std::size_t bi = 0; bi < blocks.size(); ++bi) blocks[bi].slot_rank = slot_rank.data() + bi * static_cast<std::size_t>(B);
  } else {
    for (BlockRef& b : blocks) b.rank = rank, rank += b.count;
  }
  seg.sinks.rank = 0;
  seg.pending.rank = rank;
  rank += seg.pending.count;
  seg.chunk.rank = rank;
  return rank + seg.chunk.count;
}

/// cos/sin table of RoPE for positions [0, size()): row p holds (cos, sin) of p * theta_i for
/// every pair i, computed in double precision and stored as float. Grown on demand (doubling),
/// never shrunk. Bytes: positions * rope_dims * 4.
class RopeTable {
 public:
  RopeTable() = default;
  /// theta_i = base^(-2i / (2 * pairs)): the same expression as a model runner's table
  /// (tools/llama/model.hpp), so both agree bit for bit.
  RopeTable(double base, int pairs) : pairs_(pairs), theta_(static_cast<std::size_t>(pairs)) {
    for (int i = 0; i < pairs; ++i) theta_[static_cast<std::size_t>(i)] = std::pow(base, -2.0 * i / (2.0 * pairs));
  }

  /// Makes rows [0, positions) available. May throw std::bad_alloc (the table is unchanged).
  void ensure(std::int64_t positions) {
    if (positions <= rows_) return;
    const std::int64_t rows = std::max(positions, 2 * rows_);
    const auto P = static_cast<std::size_t>(pairs_);
    cs_.resize(static_cast<std::size_t>(rows) * 2 * P);
    for (std::int64_t p = rows_; p < rows; ++p)
      for (std::size_t i = 0; i < P; ++i) {
        const double ang = static_cast<double>(p) * theta_[i];
        cs_[(static_cast<std::size_t>(p) * P + i) * 2] = static_cast<float>(std::cos(ang));
        cs_[(static_cast<std::size_t>(p) * P + i) * 2 + 1] = static_cast<float>(std::sin(ang));
      }
    rows_ = rows;
  }
  [[nodiscard]] std::int64_t size() const noexcept { return rows_; }
  [[nodiscard]] const float* data() const noexcept { return cs_.data(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return cs_.capacity() * sizeof(float); }

 private:
  int pairs_ = 0;
  std::int64_t rows_ = 0;
  std::vector<double> theta_;  // [pairs]
  std::vector<float> cs_;      // [rows_][pairs][2]
};

}  // namespace kvpack::kernels
