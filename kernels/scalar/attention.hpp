// Portable scalar fused dequant-attention kernel: the executable specification of kvpack's
// attention. SIMD and CUDA kernels must agree with it to 1e-5 relative.
//
// For one KV head and its GQA group of `group` query heads, it streams the head's stored tokens
// in order (sinks, quantized blocks, pending full-precision rows, the current chunk), dequantizes
// each block once into a small tile, scores every query of the group against each key of the tile
// (so K and V are read once per KV head, not once per query head), and keeps an online softmax
// (Milakov & Gimelshein 2018; FlashAttention) with fp32 accumulation. With AttendArgs::rope
// (PreRope<> caches) the queries and each dequantized key are first rotated at their positions
// (kernels/rope.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/codec/rows.hpp"
#include "kvpack/kernels/attend_args.hpp"
#include "kvpack/kernels/rope.hpp"

namespace kvpack::kernels {

namespace scalar_detail {

/// Online-softmax update of every (query, group head) state with `count` keys/values starting at
/// cache index `first` (causal), or, when `valid` is non-null, the slots whose bit is set.
/// `ordinal` numbers the first key for key_mass bookkeeping; when a.bias is set, a.bias[first + t]
/// is added to key t's scaled score, or a.bias[slot_index[t]] with `valid` (no bias when
/// slot_index is null).
inline void accumulate_tile(const AttendArgs& a, const float* kt, std::int64_t k_stride, const float* vt,
                            std::int64_t stride, std::int64_t first, std::int64_t count, const std::uint64_t* valid,
                            std::int64_t ordinal, Scratch& s, const std::int32_t* slot_index = nullptr) {
  const int D = a.head_dim;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < a.n_q; ++i) {
    const std::int64_t visible =
        valid ? count : std::clamp<std::int64_t>(a.q_first + i - first + 1, 0, count);
    if (visible == 0) continue;
    for (int j = 0; j < a.group; ++j) {
      const float* q = a.q + i * a.q_stride + j * D;
      const int st = i * a.group + j;
      float mx = kNegInf;
      for (std::int64_t t = 0; t < visible; ++t) {
        float sc = kNegInf;
        if (!valid || ((valid[t / 64] >> (t % 64)) & 1u)) {
          const float* k = kt + t * k_stride;
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += q[d] * k[d];
          sc = dot * a.scale;
          if (a.bias && !valid) sc += a.bias[first + t];
          else if (a.bias && slot_index) sc += a.bias[slot_index[t]];
        }
        s.scores[static_cast<std::size_t>(t)] = sc;
        mx = std::max(mx, sc);
      }
      if (a.key_mass) {
        float* lg = s.logits.data() + st * s.n_ordinals + ordinal;
        for (std::int64_t t = 0; t < visible; ++t) lg[t] = s.scores[static_cast<std::size_t>(t)];
      }
      if (mx == kNegInf) continue;  // every slot masked out
      const float m_new = std::max(s.m[st], mx);
      const float corr = std::exp(s.m[st] - m_new);  // 0 on the first tile (m = -inf)
      float* acc = s.acc.data() + static_cast<std::size_t>(st) * D;
      const float l_old = s.l[st] * corr;
      float sum = 0.f;
      for (std::int64_t t = 0; t < visible; ++t) {
        float& p = s.scores[static_cast<std::size_t>(t)];
        p = std::exp(p - m_new);  // 0 when masked
        sum += p;
      }
      // acc holds the normalized output so far (weights p / l, which sum to 1), not the raw sum
      // of p * v: every partial sum is bounded by max |v|, so values near the fp32 limit cannot
      // overflow the accumulator when the exact output is finite (the raw sum reaches l * |v|).
      const float l = l_old + sum, inv = 1.f / l, keep = l_old * inv;
      for (int d = 0; d < D; ++d) acc[d] *= keep;
      for (std::int64_t t = 0; t < visible; ++t) {
        const float p = s.scores[static_cast<std::size_t>(t)] * inv;
        if (p == 0.f) continue;
        const float* v = vt + t * stride;
        for (int d = 0; d < D; ++d) acc[d] += p * v[d];
      }
      s.m[st] = m_new;
      s.l[st] = l;
    }
  }
}

/// Dequantizes the keys and values of one block into the scratch tiles ([count][D] each).
template <KvCodec KC, KvCodec VC, bool KPerChannel>
void dequantize_block(const BlockLayout& L, const BlockRef& b, Scratch& s) {
  const int D = L.head_dim;
  const auto Dz = static_cast<std::size_t>(D);
  for (int t = 0; t < b.count; ++t) {
    const auto tt = static_cast<std::size_t>(t);
    float* kr = s.k_tile.data() + tt * Dz;
    if constexpr (KPerChannel) {
      // Decode the token group's per-channel scales once, then every row of the group.
      if (t % L.k_group == 0) {
        const std::byte* meta = b.data + L.k_meta + (tt / static_cast<std::size_t>(L.k_group)) * L.k_meta_group;
        for (std::size_t c = 0; c < Dz; ++c) s.channel_params[c] = KC::load_params(meta + c * KC::meta_bytes_per_group);
      }
      const std::byte* row = b.data + L.k_codes + tt * L.k_row;
      for (std::size_t c = 0; c < Dz; ++c) kr[c] = KC::decode_value(KC::load_code(row, c), s.channel_params[c]);
    } else {
      decode_row<KC>(b.data + L.k_codes + tt * L.k_row, b.data + L.k_meta + tt * L.k_meta_token, D, kr);
    }
    decode_row<VC>(b.data + L.v_codes + tt * L.v_row, b.data + L.v_meta + tt * L.v_meta_token, D,
                   s.v_tile.data() + tt * Dz);
  }
}

/// Writes out[i][j][:] = acc (already normalized by l) for every (query, GQA head) state after
/// the last tile; a state that saw no key (l == 0) writes zeros. Shared by the scalar and keyframe
/// kernels.
inline void write_output(const AttendArgs& a, const Scratch& s) {
  const int D = a.head_dim;
  for (int i = 0; i < a.n_q; ++i)
    for (int j = 0; j < a.group; ++j) {
      const int st = i * a.group + j;
      const float inv = s.l[st] > 0.f ? 1.f : 0.f;
      const float* acc = s.acc.data() + static_cast<std::size_t>(st) * D;
      float* o = a.out + i * a.out_stride + j * D;
      for (int d = 0; d < D; ++d) o[d] = acc[d] * inv;
    }
}

}  // namespace scalar_detail

/// Fused dequant-attention for one KV head and its query group (decode: n_q = 1; prefill: n_q > 1).
/// Writes softmax(q k^T * scale + bias) v for every query (bias: AttendArgs::bias, absent = 0);
/// a query that sees no key (or only keys whose bias is -inf) gets zeros.
/// Range: the value accumulation is normalized as it goes (accumulate_tile), so any finite K/V
/// whose exact output is finite gives a finite output; the logits q.k * scale must be finite in
/// fp32 (|q.k * scale| < 3.4e38), else the output is non-finite. On return, s.m[st] and s.l[st]
/// hold each state's running max logit and softmax denominator (split-K combines them).
/// Preconditions (checked by KVCache): layout matches the blocks, scratch not shared across threads.
template <KvCodec KC, KvCodec VC, bool KPerChannel>
void attend_scalar(const AttendArgs& a_in, const HeadSegments& seg, const BlockLayout& L, Scratch& s) {
  const AttendArgs a = rope_queries(a_in, s);  // PreRope: rotated queries (else a_in itself)
  const int D = a.head_dim;
  const int n_states = a.n_q * a.group;
  s.ensure(n_states, D, std::max(L.tokens, 1));
  std::fill_n(s.m.begin(), n_states, -std::numeric_limits<float>::infinity());
  std::fill_n(s.l.begin(), n_states, 0.f);
  std::fill_n(s.acc.begin(), static_cast<std::size_t>(n_states) * D, 0.f);

  const std::int64_t blocks_ord = seg.sinks.count;
  const std::int64_t pending_ord = blocks_ord + static_cast<std::int64_t>(seg.blocks.size()) * L.tokens;
  const std::int64_t chunk_ord = pending_ord + seg.pending.count;
  if (a.key_mass) {
    s.n_ordinals = chunk_ord + seg.chunk.count;
    const auto need = static_cast<std::size_t>(n_states) * static_cast<std::size_t>(s.n_ordinals);
    if (s.logits.size() < need) s.logits.resize(need);
    std::fill_n(s.logits.begin(), need, -std::numeric_limits<float>::infinity());
  }
  auto exact = [&](const ExactRows& r, std::int64_t ordinal) {
    // Tile exact rows too, so the score buffer stays BlockTokens long.
    for (std::int64_t t0 = 0; t0 < r.count; t0 += L.tokens) {
      const std::int64_t n = std::min<std::int64_t>(L.tokens, r.count - t0);
      const float* k = r.k + t0 * r.stride;
      std::int64_t k_stride = r.stride;
      if (a.rope) {  // pre-RoPE keys: a rotated copy in the K tile
        rope_exact_rows(*a.rope, r, t0, static_cast<int>(n), D, s.k_tile.data());
        k = s.k_tile.data(), k_stride = D;
      }
      scalar_detail::accumulate_tile(a, k, k_stride, r.v + t0 * r.stride, r.stride, r.first + t0, n, nullptr,
                                     ordinal + t0, s);
    }
  };
  exact(seg.sinks, 0);
  for (std::size_t i = 0; i < seg.blocks.size(); ++i) {
    const BlockRef& b = seg.blocks[i];
    if (b.count == 0 || (!b.valid && b.first > a.q_first + a.n_q - 1)) continue;
    scalar_detail::dequantize_block<KC, VC, KPerChannel>(L, b, s);
    if (a.rope)  // pre-RoPE keys: rotated at their positions (masked-out slots skipped)
      rope_block_rows(*a.rope, b, L, 0, b.count, s.k_tile.data(), D);
    scalar_detail::accumulate_tile(a, s.k_tile.data(), D, s.v_tile.data(), D, b.first, b.count, b.valid,
                                   blocks_ord + static_cast<std::int64_t>(i) * L.tokens, s, b.slot_index);
  }
  exact(seg.pending, pending_ord);
  exact(seg.chunk, chunk_ord);

  if (a.key_mass) {
    for (int st = 0; st < n_states; ++st) {
      if (!(s.l[st] > 0.f)) continue;
      const float inv = 1.f / s.l[st];
      const float* lg = s.logits.data() + st * s.n_ordinals;
      for (std::int64_t o = 0; o < s.n_ordinals; ++o)
        if (lg[o] != -std::numeric_limits<float>::infinity()) a.key_mass[o] += std::exp(lg[o] - s.m[st]) * inv;
    }
  }

  scalar_detail::write_output(a, s);
}

}  // namespace kvpack::kernels
