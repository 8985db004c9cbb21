// Fused attention over blocks whose K and/or V use a Keyframe<...> codec (codec/keyframe.hpp).
// Portable scalar code; KVCache routes every cache with a keyframe codec here on every backend
// (Auto, Scalar, Avx2, Neon): there is no SIMD keyframe kernel yet.
//
// Per block, for one KV head and its GQA group, the kernel streams the block twice (K, then V),
// each token reconstructed on the fly into one D-float row by one addition (Anchor: to the kept
// keyframe; Chained: to the running sum) -- no decompressed copy of the block exists:
//   pass K: token t's key row -> scores of every visible (query, group head) state;
//   softmax: per state, the block maximum, the online-softmax correction (Milakov & Gimelshein
//            2018) and p_t = exp(score_t - m) in place;
//   pass V: token t's value row -> acc += p_t v_t for every state that sees t.
// Exact rows (sinks, pending, latest chunk) go through the scalar kernel's tile routine. fp32
// accumulation; semantics of attend_scalar (causal per query, GQA, zeros for a query that sees
// nothing). key_mass (H2O) is not supported: eviction with keyframe codecs is a compile error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kvpack/cache/block.hpp"
#include "kvpack/codec/keyframe.hpp"
#include "attention.hpp"

namespace kvpack::kernels {

namespace keyframe_detail {

/// Sequential row reader of one role (K or V) of a block: next(out) writes the next token's
/// reconstruction into out[0..D). Row codecs decode their per-token row; keyframe codecs stream.
/// Offsets come from L.at(flags): a delta-mode keyframe K stream moves the V region.
template <CacheCodec C, bool IsKey>
class RoleReader {
 public:
  RoleReader(const BlockLayout& L, const std::byte* data, std::uint8_t flags, float* ref)
      : D_(L.head_dim), stream_(nullptr, false, L.head_dim, ref) {
    const BlockLayout A = L.at(flags);
    codes_ = data + (IsKey ? A.k_codes : A.v_codes);
    meta_ = data + (IsKey ? A.k_meta : A.v_meta);
    row_ = IsKey ? A.k_row : A.v_row;
    meta_row_ = IsKey ? A.k_meta_token : A.v_meta_token;
    if constexpr (is_keyframe_codec_v<C>) stream_ = typename KfStream<C>::type(codes_, (flags & (IsKey ? 2u : 4u)) != 0, D_, ref);
  }
  void next(float* out) noexcept {
    if constexpr (is_keyframe_codec_v<C>) {
      stream_.next(out);
    } else {
      const auto t = static_cast<std::size_t>(t_);
      decode_row<C>(codes_ + t * row_, meta_ + t * meta_row_, D_, out);
    }
    ++t_;
  }

 private:
  template <class X, bool = is_keyframe_codec_v<X>>
  struct KfStream {
    struct type {
      type(const std::byte*, bool, int, float*) noexcept {}
    };
  };
  template <class X>
  struct KfStream<X, true> {
    using type = typename X::Stream;
  };
  int D_;
  const std::byte* codes_ = nullptr;
  const std::byte* meta_ = nullptr;
  std::size_t row_ = 0, meta_row_ = 0;
  typename KfStream<C>::type stream_;
  int t_ = 0;
};

/// Decodes the first `count` tokens of a block into k_out / v_out ([count][D] each), as the
/// kernel reconstructs them (read_back and tests).
template <CacheCodec KC, CacheCodec VC>
void decode_block(const BlockLayout& L, const std::byte* data, std::uint8_t flags, int count, float* k_out,
                  float* v_out) {
  const auto D = static_cast<std::size_t>(L.head_dim);
  std::vector<float> kref(D), vref(D);
  RoleReader<KC, true> kr(L, data, flags, kref.data());
  RoleReader<VC, false> vr(L, data, flags, vref.data());
  for (int t = 0; t < count; ++t) {
    kr.next(k_out + static_cast<std::size_t>(t) * D);
    vr.next(v_out + static_cast<std::size_t>(t) * D);
  }
}

}  // namespace keyframe_detail

/// Fused attention for one KV head whose blocks use a keyframe codec for K and/or V (the other
/// role may be any per-token row codec). Same contract as attend_scalar (kernels/scalar/
/// attention.hpp) except: blocks are never masked (no eviction), key_mass must be null.
template <CacheCodec KC, CacheCodec VC>
void attend_keyframe(const AttendArgs& a, const HeadSegments& seg, const BlockLayout& L, Scratch& s) {
  const int D = a.head_dim;
  const int n_states = a.n_q * a.group;
  const int B = std::max(L.tokens, 1);
  s.ensure(n_states, D, std::max(B, 3));  // k_tile doubles as 3 working rows below (intervals of 2)
  const auto need = static_cast<std::size_t>(n_states) * static_cast<std::size_t>(B);
  if (s.block_scores.size() < need) s.block_scores.resize(need);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::fill_n(s.m.begin(), n_states, kNegInf);
  std::fill_n(s.l.begin(), n_states, 0.f);
  std::fill_n(s.acc.begin(), static_cast<std::size_t>(n_states) * D, 0.f);

  auto exact = [&](const ExactRows& r) {
    for (std::int64_t t0 = 0; t0 < r.count; t0 += B) {
      const std::int64_t n = std::min<std::int64_t>(B, r.count - t0);
      scalar_detail::accumulate_tile(a, r.k + t0 * r.stride, r.stride, r.v + t0 * r.stride, r.stride, r.first + t0, n, nullptr, 0, s);
    }
  };
  exact(seg.sinks);
  // Working rows: the reconstructed token and each role's reference (keyframe or running sum).
  float* row = s.k_tile.data();
  float* kref = row + D;
  float* vref = kref + D;  // k_tile holds max(B, 3) * D >= 3 * D floats (ensure above)
  for (const BlockRef& b : seg.blocks) {
    if (b.count == 0 || b.first > a.q_first + a.n_q - 1) continue;
    auto visible = [&](int i) {
      return static_cast<int>(std::clamp<std::int64_t>(a.q_first + i - b.first + 1, 0, b.count));
    };
    const int n_read = visible(a.n_q - 1);  // the last query sees the most
    // Pass K: scores.
    keyframe_detail::RoleReader<KC, true> kr(L, b.data, b.flags, kref);
    for (int t = 0; t < n_read; ++t) {
      kr.next(row);
      for (int i = 0; i < a.n_q; ++i) {
        if (t >= visible(i)) continue;
        for (int j = 0; j < a.group; ++j) {
          const float* q = a.q + i * a.q_stride + j * D;
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += q[d] * row[d];
          s.block_scores[static_cast<std::size_t>((i * a.group + j) * B + t)] = dot * a.scale;
        }
      }
    }
    // Online softmax update; scores become probabilities relative to the new maximum.
    for (int i = 0; i < a.n_q; ++i) {
      const int vis = visible(i);
      if (vis == 0) continue;
      for (int j = 0; j < a.group; ++j) {
        const int st = i * a.group + j;
        float* sc = s.block_scores.data() + static_cast<std::size_t>(st) * B;
        float mx = kNegInf;
        for (int t = 0; t < vis; ++t) mx = std::max(mx, sc[t]);
        const float m_new = std::max(s.m[st], mx);
        const float corr = std::exp(s.m[st] - m_new);
        float* acc = s.acc.data() + static_cast<std::size_t>(st) * D;
        const float l_old = s.l[st] * corr;
        float sum = 0.f;
        for (int t = 0; t < vis; ++t) {
          sc[t] = std::exp(sc[t] - m_new);
          sum += sc[t];
        }
        // acc stays the normalized output (scalar_detail::accumulate_tile explains why).
        const float l = l_old + sum, inv = 1.f / l, keep = l_old * inv;
        for (int d = 0; d < D; ++d) acc[d] *= keep;
        for (int t = 0; t < vis; ++t) sc[t] *= inv;
        s.m[st] = m_new;
        s.l[st] = l;
      }
    }
    // Pass V: weighted sum.
    keyframe_detail::RoleReader<VC, false> vr(L, b.data, b.flags, vref);
    for (int t = 0; t < n_read; ++t) {
      vr.next(row);
      for (int i = 0; i < a.n_q; ++i) {
        if (t >= visible(i)) continue;
        for (int j = 0; j < a.group; ++j) {
          const int st = i * a.group + j;
          const float p = s.block_scores[static_cast<std::size_t>(st * B + t)];
          float* acc = s.acc.data() + static_cast<std::size_t>(st) * D;
          for (int d = 0; d < D; ++d) acc[d] += p * row[d];
        }
      }
    }
  }
  exact(seg.pending);
  exact(seg.chunk);

  scalar_detail::write_output(a, s);
}

}  // namespace kvpack::kernels
