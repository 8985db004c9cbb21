// AVX2 (+FMA, F16C) fused dequant-attention kernel: attend_avx2, same signature and semantics as
// kernels::attend_scalar (kernels/scalar/attention.hpp).
//
// Structure (kernels/simd_common.hpp): tiles of 16 keys, dequantized once into an L1-resident
// fp32 tile (kernels/avx2/codes.hpp), scored in register blocks of up to 4 query states x 2 keys;
// V accumulated for up to 4 states x 16 dims per pass; within 1e-5 relative of the scalar kernel.
// Default for per-token INT4/INT8 keys (groups of 32/64/128, head_dim 64/128/256): every block all
// queries see in full (decode) is attended whole by the block path (kernels/avx2/int_block.hpp):
// an int16 query, keys scored from their codes, one softmax update per 64 tokens, INT4/INT8 values
// accumulated from their codes with the scales folded into the weights (error bound:
// kernels::query_int8_group). Per-channel integer keys (KIVI) take the same whole-block route
// (kernels/avx2/channel_block.hpp): the query scaled by each token group's channel scales, fp32
// scores from the key levels, the same softmax and values. Opt-in (kernels/avx2/int_dot.hpp), for the remaining tiles: with
// KVPACK_AVX2_INTEGER_QK=1 per-token INT8/INT4 keys are scored from their codes against the query
// quantized in two int8 terms (vpdpbusd with AVX-VNNI / AVX-512 VNNI, else vpmaddubsw); with
// KVPACK_AVX2_INTEGER_PV=1 INT4 values are accumulated from their codes with two-byte weights
// (bounds: kernels::query_int_error, kernels::value_int_error in dispatch.hpp).
// head_dim 64/128/256 are compiled separately (fully known loop bounds), others run through the
// generic path (vector body plus a scalar tail).
// Only compiled when KVPACK_HAS_AVX2 (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kvpack/kernels/avx2/codes.hpp"
#include "kvpack/kernels/avx2/encode.hpp"
#include "kvpack/kernels/avx2/channel_block.hpp"
#include "kvpack/kernels/avx2/int_block.hpp"
#include "kvpack/kernels/avx2/int_dot.hpp"
#include "kvpack/kernels/avx2/math.hpp"
#include "kvpack/kernels/scalar/attention.hpp"
#include "kvpack/kernels/simd_common.hpp"

namespace kvpack::kernels {

namespace avx2_detail {

/// The instruction-set primitives of simd::attend_tiled for AVX2.
struct Isa {
  template <int DT, int JS, int KS>
  static void score(const float* const* q, const float* k, std::int64_t ks, int n, int D, float scale, float* out,
                    std::int64_t os) noexcept {
    static_assert(JS * KS <= 8, "score: at most 8 accumulators");
    const int Dn = DT > 0 ? DT : D;
    const int Dv = Dn & ~7;
    for (int t = 0; t < n; t += KS) {
      const float* kp[KS];
      simd::static_for<KS>([&](auto kk) { kp[kk] = k + std::min(t + kk(), n - 1) * ks; });
      __m256 acc[8];
      simd::static_for<8>([&](auto i) { acc[i] = _mm256_setzero_ps(); });
      for (int c = 0; c < Dv; c += 8) {
        __m256 kv[KS];
        simd::static_for<KS>([&](auto kk) { kv[kk] = _mm256_loadu_ps(kp[kk] + c); });
        simd::static_for<JS>([&](auto j) {
          const __m256 qv = _mm256_loadu_ps(q[j] + c);
          simd::static_for<KS>([&](auto kk) { acc[j * KS + kk] = _mm256_fmadd_ps(qv, kv[kk], acc[j * KS + kk]); });
        });
      }
      alignas(32) float r[8];
      _mm256_store_ps(r, reduce8(acc));
      if (Dv < Dn) {
        for (int j = 0; j < JS; ++j)
          for (int kk = 0; kk < KS; ++kk)
            for (int c = Dv; c < Dn; ++c) r[j * KS + kk] += q[j][c] * kp[kk][c];
      }
      for (int j = 0; j < JS; ++j)
        for (int kk = 0; kk < KS && t + kk < n; ++kk) out[j * os + t + kk] = r[j * KS + kk] * scale;
    }
  }

  template <int JS, int DC>
  static void accumulate_block(float* const* acc, const float* const* p, const float* v, std::int64_t vs, int n,
                               std::uint32_t live, int c) noexcept {
    __m256 a[JS][DC];
    simd::static_for<JS>([&](auto j) {
      simd::static_for<DC>([&](auto d) { a[j][d] = _mm256_loadu_ps(acc[j] + c + 8 * d); });
    });
    auto step = [&](int t) {
      const float* vr = v + t * vs + c;
      if constexpr (JS == 1) {
        const __m256 pb = _mm256_set1_ps(p[0][t]);
        simd::static_for<DC>([&](auto d) { a[0][d] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vr + 8 * d), a[0][d]); });
      } else {
        __m256 vv[DC];
        simd::static_for<DC>([&](auto d) { vv[d] = _mm256_loadu_ps(vr + 8 * d); });
        simd::static_for<JS>([&](auto j) {
          const __m256 pb = _mm256_set1_ps(p[j][t]);
          simd::static_for<DC>([&](auto d) { a[j][d] = _mm256_fmadd_ps(pb, vv[d], a[j][d]); });
        });
      }
    };
    // Every token live (unmasked tiles): no bit test per token and block of dims.
    const std::uint32_t all = n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1u;
    if ((live & all) == all) {
      for (int t = 0; t < n; ++t) step(t);
    } else {
      for (int t = 0; t < n; ++t)
        if ((live >> t) & 1u) step(t);
    }
    simd::static_for<JS>([&](auto j) {
      simd::static_for<DC>([&](auto d) { _mm256_storeu_ps(acc[j] + c + 8 * d, a[j][d]); });
    });
  }

  template <int DT, int JS>
  static void accumulate(float* const* acc, const float* const* p, const float* v, std::int64_t vs, int n,
                         std::uint32_t live, int D) noexcept {
    constexpr int DC = JS >= 3 ? 2 : (JS == 2 ? 4 : 8);
    const int Dn = DT > 0 ? DT : D;
    int c = 0;
    for (; c + 8 * DC <= Dn; c += 8 * DC) accumulate_block<JS, DC>(acc, p, v, vs, n, live, c);
    for (; c + 8 <= Dn; c += 8) accumulate_block<JS, 1>(acc, p, v, vs, n, live, c);
    for (; c < Dn; ++c)
      for (int j = 0; j < JS; ++j)
        for (int t = 0; t < n; ++t)
          if ((live >> t) & 1u) acc[j][c] += p[j][t] * v[t * vs + c];
  }

  static float mask_max(float* row, int visible, std::uint32_t bits) noexcept {
    const __m256i idx0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i idx1 = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i vis = _mm256_set1_epi32(visible);
    __m256i ok0 = _mm256_cmpgt_epi32(vis, idx0), ok1 = _mm256_cmpgt_epi32(vis, idx1);
    if ((bits & 0xFFFFu) != 0xFFFFu) {
      const __m256i b = _mm256_set1_epi32(static_cast<int>(bits));
      const __m256i s0 = _mm256_sllv_epi32(_mm256_set1_epi32(1), idx0);
      const __m256i s1 = _mm256_sllv_epi32(_mm256_set1_epi32(1), idx1);
      ok0 = _mm256_and_si256(ok0, _mm256_cmpeq_epi32(_mm256_and_si256(b, s0), s0));
      ok1 = _mm256_and_si256(ok1, _mm256_cmpeq_epi32(_mm256_and_si256(b, s1), s1));
    }
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    const __m256 r0 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(row), _mm256_castsi256_ps(ok0));
    const __m256 r1 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(row + 8), _mm256_castsi256_ps(ok1));
    _mm256_storeu_ps(row, r0);
    _mm256_storeu_ps(row + 8, r1);
    return hmax(_mm256_max_ps(r0, r1));
  }

  static float exp_sum(float* row, float m) noexcept {
    const __m256 mv = _mm256_set1_ps(m);
    const __m256 p0 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row), mv));
    const __m256 p1 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row + 8), mv));
    _mm256_storeu_ps(row, p0);
    _mm256_storeu_ps(row + 8, p1);
    return hsum(_mm256_add_ps(p0, p1));
  }

  static void scale(float* x, int D, float c) noexcept {
    const __m256 cv = _mm256_set1_ps(c);
    int d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(x + d, _mm256_mul_ps(_mm256_loadu_ps(x + d), cv));
    for (; d < D; ++d) x[d] *= c;
  }

  static void store_scaled(float* out, const float* acc, int D, float c) noexcept {
    const __m256 cv = _mm256_set1_ps(c);
    int d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), cv));
    for (; d < D; ++d) out[d] = acc[d] * c;
  }

  static void add_key_mass(float* km, const float* lg, std::int64_t n, float m, float inv) noexcept {
    const __m256 mv = _mm256_set1_ps(m), iv = _mm256_set1_ps(inv);
    std::int64_t o = 0;
    for (; o + 8 <= n; o += 8) {
      const __m256 p = _mm256_mul_ps(exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(lg + o), mv)), iv);
      _mm256_storeu_ps(km + o, _mm256_add_ps(_mm256_loadu_ps(km + o), p));
    }
    for (; o < n; ++o)
      if (lg[o] != -std::numeric_limits<float>::infinity()) km[o] += std::exp(lg[o] - m) * inv;
  }

  template <KvCodec C>
  static void decode_row(const std::byte* codes, const std::byte* meta, int n, float* out, float* tmp) noexcept {
    avx2::decode_row<C>(codes, meta, n, out, tmp);
  }
  // Integer Q·K for per-token INT8/INT4 keys (kernels/avx2/int_dot.hpp).
  template <class C>
  static constexpr bool int_dot_key = avx2::int_dot_key<C>;
  template <class C>
  static void quantize_query(const float* q, int D, int st, const simd::QueryInt8& qq) noexcept {
    avx2::quantize_query<C>(q, D, st, qq);
  }
  template <class C>
  static constexpr bool int_dot_value = avx2::int_dot_value<C>;
  template <class C, int JS>
  static void int_accumulate(float* const* acc, const float* const* p, const std::byte* codes, std::size_t row,
                             const std::byte* meta, std::size_t meta_row, int n, std::uint32_t live, int D, float* vs,
                             float* vz) noexcept {
    avx2::int_accumulate<C, JS>(acc, p, codes, row, meta, meta_row, n, live, D, vs, vz);
  }
  template <class C, int JS>
  static void int_scores(const simd::QueryInt8& qq, int st0, const std::byte* codes, std::size_t row,
                         const std::byte* meta, std::size_t meta_row, int n, int D, float attn_scale, float* out,
                         std::int64_t out_stride, float* ksc, float* kz) noexcept {
    avx2::int_scores<C, JS>(qq, st0, codes, row, meta, meta_row, n, D, attn_scale, out, out_stride, ksc, kz);
  }
  // Whole visible blocks of per-token integer keys (kernels/avx2/int_block.hpp).
  template <class C>
  static constexpr bool int_block = avx2::int_block_key<C>;
  static constexpr int int_block_max_states = avx2::kBlockMaxStates;
  using IntBlockMemory = avx2::IntBlockMemory;
  template <class C, class QueryOf>
  static IntBlockMemory int_block_prepare(QueryOf&& q_of, int n_states, int D, Scratch& s) {
    return avx2::int_block_prepare<C>(q_of, n_states, D, s);
  }
  template <class KC, class VC, int D>
  static bool int_block_attend(const IntBlockMemory& w, int n_states, const std::byte* data, const BlockLayout& L,
                               int count, float attn_scale, const float* bias, float* m, float* l, float* acc,
                               const std::byte* next) {
    return avx2::int_block_attend<Isa, KC, VC, D>(w, n_states, data, L, count, attn_scale, bias, m, l, acc, next);
  }
  // Whole visible blocks of per-channel keys (kernels/avx2/channel_block.hpp).
  template <class C>
  static constexpr bool channel_block = avx2::channel_block_key<C>;
  using ChannelBlockMemory = avx2::ChannelBlockMemory;
  template <class QueryOf>
  static ChannelBlockMemory channel_block_prepare(QueryOf&& q_of, int n_states, int D, Scratch& s) {
    return avx2::channel_block_prepare(q_of, n_states, D, s);
  }
  template <class KC, class VC, int D>
  static bool channel_block_attend(const ChannelBlockMemory& c, int n_states, const std::byte* data, const BlockLayout& L,
                                   int count, float attn_scale, const float* bias, float* m, float* l, float* acc,
                                   const std::byte* next) {
    return avx2::channel_block_attend<Isa, KC, VC, D>(c, n_states, data, L, count, attn_scale, bias, m, l, acc, next);
  }
  template <KvCodec C>
  static void load_channel_params(const std::byte* meta, int n, float* scale, float* zero, float* tmp) noexcept {
    avx2::load_channel_params<C>(meta, n, scale, zero, tmp);
  }
  template <KvCodec C>
  static void decode_row_channels(const std::byte* codes, const float* scale, const float* zero, int n,
                                  float* out) noexcept {
    avx2::decode_row_channels<C>(codes, scale, zero, n, out);
  }
};

}  // namespace avx2_detail

/// AVX2 fused dequant-attention for one KV head and its query group: same contract as
/// attend_scalar (decode n_q = 1, causal prefill n_q > 1, BlockRef::valid slot masks,
/// AttendArgs::key_mass); outputs within 1e-5 relative of it, or, for integer Q·K / P·V codecs,
/// within the bounds documented in kernels/dispatch.hpp. Writes softmax(q k^T * scale) v for
/// every query; a query that sees no key gets zeros. Scratch must not be shared across threads.
template <KvCodec KC, KvCodec VC, bool KPerChannel>
void attend_avx2(const AttendArgs& a, const HeadSegments& seg, const BlockLayout& L, Scratch& s) {
  simd::attend_dispatch_dim<avx2_detail::Isa, KC, VC, KPerChannel>(a, seg, L, s);
}

}  // namespace kvpack::kernels

#endif  // KVPACK_HAS_AVX2
