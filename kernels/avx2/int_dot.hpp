// AVX2 integer Q·K for per-token INT8/INT4 keys (the codes are never dequantized to fp32).
//
// The query of every state is quantized once per attend call, per key group of G channels, to
// int8 (symmetric, q ≈ σ_g qi, σ_g = max|q_g| / 127, round half to even), as llama.cpp does for
// its q8_0 vec_dot. A stored key code u (unsigned byte; INT4 nibble, INT8 two's complement made
// unsigned by xor 0x80) with offset o (INT4 symmetric 8, INT8 symmetric 128, asymmetric 0)
// decodes to x̂ = zero + scale (u - o), so per token t and group g
//     q . x̂ = scale_tg σ_g (Σ qi u - o Σ qi) + zero_tg Σ q
// with the integer sum Σ qi u on u8 x s8 dot products: AVX-VNNI / AVX-512 VNNI vpdpbusd when the
// translation unit has it (-march=native on such a CPU), else vpmaddubsw + vpmaddwd (INT8 keys
// through the sign trick |k| x sign(qi, k), so the 16-bit pair sums never saturate). Eight tokens'
// group sums are reduced together (lanes = tokens), then scaled in fp32.
//
// Error: only the query's rounding, |Δ logit| <= scale_attn Σ_g σ_g / 2 Σ_{d in g} |x̂_d| (the
// bound tests/test_attention_vs_ref64.cpp checks); the keys are used exactly as stored.
// INT4 codes hold element 2i in the low nibble of byte i: a group's 16 bytes give its even
// elements (low nibbles) in the low 128-bit lane and its odd ones in the high lane, so the
// quantized query is stored in that order.
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvpack/kernels/avx2/codes.hpp"
#include "kvpack/codec/rows.hpp"
#include "kvpack/kernels/simd_common.hpp"

namespace kvpack::kernels::avx2 {

namespace int_dot_detail {

#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
inline constexpr bool kVnni = true;
#else
inline constexpr bool kVnni = false;
#endif

/// acc += Σ over 4-byte lanes of u[i] * s[i] (u unsigned, s signed bytes).
[[nodiscard]] inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) noexcept {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

[[nodiscard]] inline float hsum8(__m256 v) noexcept {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
[[nodiscard]] inline float hmax8(__m256 v) noexcept {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

/// Lane i = sum of the 8 lanes of v[i].
[[nodiscard]] inline __m256i reduce8(const __m256i* v) noexcept {
  const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i h23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i h67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i a = _mm256_hadd_epi32(h01, h23);
  const __m256i b = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/// Unsigned codes of 32 elements starting at element e (a multiple of 32) of a code row.
template <class C>
[[nodiscard]] inline __m256i codes32(const std::byte* row, std::size_t e) noexcept {
  if constexpr (C::bits == 4) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + e / 2)));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + e));
  }
}

/// Scale and zero-point (0 when symmetric) of every group of `ng` groups of one token's metadata
/// row, written to scale[g * 16] and zero[g * 16] (a [group][token] tile column).
template <class C>
inline void token_params(const std::byte* meta, int ng, float* scale, float* zero) noexcept {
  constexpr int per = C::meta_bytes_per_group / C::meta_type::bytes;
  float tmp[64];
  if (ng * per > 64) {  // head_dim > 1024: not worth a vector path
    for (int g = 0; g < ng; ++g) {
      const GroupParams p = C::load_params(meta + static_cast<std::size_t>(g) * C::meta_bytes_per_group);
      scale[g * 16] = p.scale;
      zero[g * 16] = p.zero;
    }
    return;
  }
  load_meta_values<typename C::meta_type>(meta, static_cast<std::size_t>(ng * per), tmp);  // F16C
  for (int g = 0; g < ng; ++g) {
    scale[g * 16] = tmp[g * per];
    zero[g * 16] = per == 2 ? tmp[g * per + 1] : 0.f;
  }
}

}  // namespace int_dot_detail

/// The integer Q·K / P·V paths are opt-in: define KVPACK_AVX2_INTEGER_DOT=1 to use them. Their
/// outputs differ from the fp32 kernel by up to ~2.5 % relative on random data (within the bounds
/// below); on SmolLM2 (docs/RESULTS-eval.md) they raise KL by 7 % (INT4) to 100 % (INT8), so the
/// default stays the fp32 kernel (bench/ builds with them on).
#if defined(KVPACK_AVX2_INTEGER_DOT) && KVPACK_AVX2_INTEGER_DOT
inline constexpr bool kIntegerDotEnabled = true;
#else
inline constexpr bool kIntegerDotEnabled = false;
#endif

/// Key codecs scored by integer dot products: per-token INT8/INT4 with groups of 32k channels
/// (asymmetric INT8, codes up to 255, only with VNNI: vpmaddubsw pair sums would saturate).
/// INT3/INT2 keys are dequantized into the fp32 tile instead (kernels/avx2/codes.hpp decode8).
template <class C>
inline constexpr bool int_dot_key = [] {
  if constexpr (!kIntegerDotEnabled)
    return false;
  else if constexpr (simd::IntCodecFamily<C>)
    return C::group_size % 32 == 0 &&
           (C::bits == 4 || (C::bits == 8 && (!C::asymmetric || int_dot_detail::kVnni)));
  else
    return false;
}();

/// Quantizes the query of one state (D floats) for key codec C into slot `st` of `qq`.
template <class C>
inline void quantize_query(const float* q, int D, int st, const simd::QueryInt8& qq) noexcept {
  constexpr int G = C::group_size;
  constexpr int offset = C::asymmetric ? 0 : (C::bits == 4 ? 8 : (int_dot_detail::kVnni ? 128 : 0));
  std::int8_t* qi = qq.qi + static_cast<std::size_t>(st) * static_cast<std::size_t>(D);
  for (int g = 0; g < D / G; ++g) {
    const float* x = q + g * G;
    float amax = 0.f, sum = 0.f;
    for (int d = 0; d < G; ++d) {
      amax = std::max(amax, std::fabs(x[d]));
      sum += x[d];
    }
    const float sigma = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int isum = 0;
    for (int c = 0; c < G; c += 32)
      for (int d = 0; d < 32; ++d) {
        // INT4: position d of the 32-element chunk holds element 2d (d < 16) or 2(d - 16) + 1.
        const int src = C::bits == 4 ? (d < 16 ? 2 * d : 2 * (d - 16) + 1) : d;
        const int v = static_cast<int>(std::nearbyint(x[c + src] * inv));
        qi[g * G + c + d] = static_cast<std::int8_t>(v);
        isum += v;
      }
    const std::size_t at = static_cast<std::size_t>(st) * static_cast<std::size_t>(qq.groups) + static_cast<std::size_t>(g);
    qq.sigma[at] = sigma;
    qq.offset_sum[at] = static_cast<float>(offset * isum);
    qq.q_sum[at] = sum;
  }
}

/// Logits of JS states (st0 .. st0 + JS - 1) against n <= 16 tokens of a block whose key codes
/// start at `codes` (row stride `row` bytes) and metadata at `meta` (stride `meta_row`):
/// out[j * out_stride + t] = attn_scale * q_j . x̂_t. `ksc`, `kz`: 2 * 16 * groups floats of room.
template <class C, int JS>
inline void int_scores(const simd::QueryInt8& qq, int st0, const std::byte* codes, std::size_t row, const std::byte* meta,
                       std::size_t meta_row, int n, int D, float attn_scale, float* out, std::int64_t out_stride,
                       float* ksc, float* kz) noexcept {
  using namespace int_dot_detail;
  constexpr int G = C::group_size;
  const int ng = D / G;
  // Key metadata of the tile, transposed to [group][token].
  for (int t = 0; t < n; ++t) token_params<C>(meta + static_cast<std::size_t>(t) * meta_row, ng, ksc + t, kz + t);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int tb = 0; tb < n; tb += 8) {
    __m256 sc[JS];
    simd::static_for<JS>([&](auto j) { sc[j] = _mm256_setzero_ps(); });
    for (int g = 0; g < ng; ++g) {
      alignas(32) __m256i I[JS][8];
      for (int tt = 0; tt < 8; ++tt) {
        const int t = std::min(tb + tt, n - 1);
        const std::byte* r = codes + static_cast<std::size_t>(t) * row;
        simd::static_for<JS>([&](auto j) { I[j][tt] = _mm256_setzero_si256(); });
        for (int c = 0; c < G; c += 32) {
          const std::size_t e = static_cast<std::size_t>(g * G + c);
          __m256i u = codes32<C>(r, e);
          simd::static_for<JS>([&](auto j) {
            const __m256i s = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(qq.qi + static_cast<std::size_t>(st0 + j) * D + e));
            if constexpr (C::bits == 8 && !C::asymmetric && !kVnni) {
              I[j][tt] = dot_u8s8(I[j][tt], _mm256_abs_epi8(u), _mm256_sign_epi8(s, u));
            } else if constexpr (C::bits == 8 && !C::asymmetric) {
              I[j][tt] = dot_u8s8(I[j][tt], _mm256_xor_si256(u, flip), s);
            } else {
              I[j][tt] = dot_u8s8(I[j][tt], u, s);
            }
          });
        }
      }
      const __m256 kscale = _mm256_loadu_ps(ksc + g * 16 + tb);
      const __m256 kzero = _mm256_loadu_ps(kz + g * 16 + tb);
      simd::static_for<JS>([&](auto j) {
        const std::size_t at = static_cast<std::size_t>(st0 + j) * static_cast<std::size_t>(qq.groups) +
                               static_cast<std::size_t>(g);
        const __m256 isum = _mm256_sub_ps(_mm256_cvtepi32_ps(reduce8(I[j])), _mm256_set1_ps(qq.offset_sum[at]));
        sc[j] = _mm256_fmadd_ps(isum, _mm256_mul_ps(kscale, _mm256_set1_ps(qq.sigma[at])), sc[j]);
        if constexpr (C::asymmetric) sc[j] = _mm256_fmadd_ps(kzero, _mm256_set1_ps(qq.q_sum[at]), sc[j]);
      });
    }
    simd::static_for<JS>([&](auto j) {
      alignas(32) float r[8];
      _mm256_store_ps(r, _mm256_mul_ps(sc[j], _mm256_set1_ps(attn_scale)));
      for (int tt = 0; tt < 8 && tb + tt < n; ++tt) out[j * out_stride + tb + tt] = r[tt];
    });
  }
}

/// Value codecs accumulated by integer P·V: per-token INT4 with groups of 32k channels.
template <class C>
inline constexpr bool int_dot_value = [] {
  if constexpr (!kIntegerDotEnabled) return false;
  else if constexpr (simd::IntCodecFamily<C>) return C::bits == 4 && C::group_size % 32 == 0;
  else return false;
}();

/// acc_j[d] += Σ_t p_j[t] x̂_td for JS states over n <= 16 tokens of INT4 values (codes at
/// `codes`, stride `row`; metadata at `meta`, stride `meta_row`), slots whose bit in `live` is set,
/// without dequantizing a value: with x̂ = zero' + scale (u - 8) per token group (centered codes;
/// zero' = zero + 8 scale asymmetric, 0 symmetric), the weight w_t = p_t scale_tg is quantized per
/// (state, group, tile) to 8 unsigned bits (σ = max_t w_t / 255, round half to even), two
/// tokens' centered codes are interleaved byte-wise and multiplied by their two weights in one
/// vpmaddubsw (16-bit sums, <= 16 tokens * 255 * 8 < 2^15: no saturation), then scaled by σ once
/// per tile; the zero-points add Σ_t p_t zero'_tg per group. Error: each weight within
/// σ / 2 = max_t w_t / 510 and |u - 8| <= 8, so |Δacc_d| <= 8 / 510 * Σ_t max_tile(w) over the
/// tiles (kernels::value_int_accumulate). `vs`, `vz`: 2 * 16 * groups floats of room.
template <class C, int JS>
inline void int_accumulate(float* const* acc, const float* const* p, const std::byte* codes, std::size_t row,
                           const std::byte* meta, std::size_t meta_row, int n, std::uint32_t live, int D, float* vs,
                           float* vz) noexcept {
  using namespace int_dot_detail;
  constexpr int G = C::group_size;
  const int ng = D / G;
  for (int t = 0; t < 16; ++t) {
    if (t < n && ((live >> t) & 1u)) {
      token_params<C>(meta + static_cast<std::size_t>(t) * meta_row, ng, vs + t, vz + t);
      if constexpr (C::asymmetric)  // x̂ = zero + 8 scale + scale (u - 8); symmetric: scale (u - 8)
        for (int g = 0; g < ng; ++g) vz[g * 16 + t] += 8.f * vs[g * 16 + t];
    } else {
      for (int g = 0; g < ng; ++g) vs[g * 16 + t] = vz[g * 16 + t] = 0.f;  // dead slot: weight 0
    }
  }
  const int pairs = (n + 1) / 2;
  for (int g = 0; g < ng; ++g) {
    // Quantized weights of every state, two tokens per 16-bit lane.
    alignas(32) std::int16_t pw[JS][8];
    float sigma[JS], zsum[JS];
    // p beyond n is garbage-free (rows are kTile long, past-the-end keys got p = 0) and dead
    // slots have scale 0, so the 16 lanes need no masking.
    const __m256 s0 = _mm256_loadu_ps(vs + g * 16), s1 = _mm256_loadu_ps(vs + g * 16 + 8);
    const __m256 z0 = _mm256_loadu_ps(vz + g * 16), z1 = _mm256_loadu_ps(vz + g * 16 + 8);
    simd::static_for<JS>([&](auto j) {
      const __m256 p0 = _mm256_loadu_ps(p[j]), p1 = _mm256_loadu_ps(p[j] + 8);
      const __m256 w0 = _mm256_mul_ps(p0, s0), w1 = _mm256_mul_ps(p1, s1);
      const float wmax = hmax8(_mm256_max_ps(w0, w1));
      zsum[j] = hsum8(_mm256_fmadd_ps(p1, z1, _mm256_mul_ps(p0, z0)));
      const __m256 inv = _mm256_set1_ps(wmax > 0.f ? 255.f / wmax : 0.f);
      const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(w0, inv)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(w1, inv));
      const __m128i a = _mm_packus_epi32(_mm256_castsi256_si128(q0), _mm256_extracti128_si256(q0, 1));
      const __m128i b = _mm_packus_epi32(_mm256_castsi256_si128(q1), _mm256_extracti128_si256(q1, 1));
      _mm_store_si128(reinterpret_cast<__m128i*>(pw[j]), _mm_packus_epi16(a, b));  // token 2k | 2k + 1 << 8
      sigma[j] = wmax / 255.f;
    });
    for (int c = 0; c < G; c += 32) {
      const std::size_t e = static_cast<std::size_t>(g * G + c);
      __m256i a16[JS][2];
      simd::static_for<JS>([&](auto j) { a16[j][0] = a16[j][1] = _mm256_setzero_si256(); });
      for (int k = 0; k < pairs; ++k) {
        const __m256i eight = _mm256_set1_epi8(8);
        const __m256i u0 = _mm256_sub_epi8(codes32<C>(codes + static_cast<std::size_t>(2 * k) * row, e), eight);
        const __m256i u1 =
            _mm256_sub_epi8(codes32<C>(codes + static_cast<std::size_t>(std::min(2 * k + 1, n - 1)) * row, e), eight);
        const __m256i lo = _mm256_unpacklo_epi8(u0, u1), hi = _mm256_unpackhi_epi8(u0, u1);
        simd::static_for<JS>([&](auto j) {
          const __m256i wv = _mm256_set1_epi16(pw[j][k]);  // unsigned weights, signed centered codes
          a16[j][0] = _mm256_add_epi16(a16[j][0], _mm256_maddubs_epi16(wv, lo));
          a16[j][1] = _mm256_add_epi16(a16[j][1], _mm256_maddubs_epi16(wv, hi));
        });
      }
      // a16[j][0]: lane 0 = channels 0, 2, .., 14, lane 1 = 1, 3, .., 15; a16[j][1]: 16.. 30, 17.. 31.
      simd::static_for<JS>([&](auto j) {
        const __m256 sg = _mm256_set1_ps(sigma[j]), zs = _mm256_set1_ps(zsum[j]);
        for (int h = 0; h < 2; ++h) {
          const __m256i ev = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a16[j][h]));
          const __m256i od = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a16[j][h], 1));
          const __m256i x0 = _mm256_unpacklo_epi32(ev, od), x1 = _mm256_unpackhi_epi32(ev, od);
          const __m256i first = _mm256_permute2x128_si256(x0, x1, 0x20), second = _mm256_permute2x128_si256(x0, x1, 0x31);
          float* out = acc[j] + e + 16 * h;
          _mm256_storeu_ps(out, _mm256_add_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(first), sg, zs), _mm256_loadu_ps(out)));
          _mm256_storeu_ps(out + 8,
                           _mm256_add_ps(_mm256_fmadd_ps(_mm256_cvtepi32_ps(second), sg, zs), _mm256_loadu_ps(out + 8)));
        }
      });
    }
  }
}

}  // namespace kvpack::kernels::avx2

#endif  // KVPACK_HAS_AVX2
