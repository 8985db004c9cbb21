// AVX2 integer Q·K for per-token INT8/INT4 keys (the codes are never dequantized to fp32).
//
// The query of every state is quantized once per attend call, per key group of G channels, to
// two int8 terms: qi = round(q / σ1), σ1 = max|q_g| / 127 (as llama.cpp's q8_0 vec_dot), and the
// residual qr = round((q - σ1 qi) / σ) on the 254x finer step σ = σ1 / 254, so q = σ (254 qi + qr)
// to a 16-bit step while every product stays u8 x s8. A stored key code u (unsigned byte; INT4
// nibble, INT8 two's complement made unsigned by xor 0x80) with offset o (INT4 symmetric 8, INT8
// symmetric 128, asymmetric 0) decodes to x̂ = zero + scale (u - o), so per token t and group g
//     q . x̂ = scale_tg σ_g (254 Σ qi u + Σ qr u - o (254 Σ qi + Σ qr)) + zero_tg Σ q
// with the integer sums on u8 x s8 dot products: AVX-VNNI / AVX-512 VNNI vpdpbusd when the
// translation unit has it (-march=native on such a CPU), else vpmaddubsw + vpmaddwd (INT8 keys
// through the sign trick |k| x sign(qi, k), so the 16-bit pair sums never saturate). Eight tokens'
// group sums are reduced together (lanes = tokens), then scaled in fp32. Groups up to 128
// channels keep the sums within int32.
//
// Error: only the query's rounding, |Δ logit| <= scale_attn Σ_g max|q_g| / 64516 Σ_{d in g} |x̂_d|
// (kernels::query_int_error; the bound the float64-reference tests check); the keys are used
// exactly as stored. (One int8 term alone, max|q_g| / 254, raised the real model's KL by up to 2x
// for INT8 keys: docs/RESULTS-eval.md.)
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
#include "kvpack/kernels/avx2/math.hpp"
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

/// Which integer paths are compiled in, both opt-in: KVPACK_AVX2_INTEGER_QK=1 scores INT8/INT4
/// keys from their codes with the two-term query below, KVPACK_AVX2_INTEGER_PV=1 accumulates INT4
/// values from their codes with two-byte weights, KVPACK_AVX2_INTEGER_DOT=1 turns on both. On
/// SmolLM2 both stay within a few per cent of the fp32 kernel's KL (docs/RESULTS-eval.md) but are
/// not faster on AVX2 without VNNI and at most ~15 % faster with it (bench/RESULTS.md), so these
/// tile paths stay opt-in. What is on by default is the block path (kernels/avx2/int_block.hpp),
/// which attends decode's fully visible blocks whole and is about 2x faster; these paths then
/// cover only the tiles it leaves (partly visible blocks, slot masks, key_mass).
#if defined(KVPACK_AVX2_INTEGER_DOT) && KVPACK_AVX2_INTEGER_DOT
inline constexpr bool kIntegerQK = true;
inline constexpr bool kIntegerPV = true;
#else
#if defined(KVPACK_AVX2_INTEGER_QK) && KVPACK_AVX2_INTEGER_QK
inline constexpr bool kIntegerQK = true;
#else
inline constexpr bool kIntegerQK = false;
#endif
#if defined(KVPACK_AVX2_INTEGER_PV) && KVPACK_AVX2_INTEGER_PV
inline constexpr bool kIntegerPV = true;
#else
inline constexpr bool kIntegerPV = false;
#endif
#endif

/// Key codecs scored by integer dot products: per-token INT8/INT4 with groups of 32k channels
/// (asymmetric INT8, codes up to 255, only with VNNI: vpmaddubsw pair sums would saturate).
/// INT3/INT2 keys are dequantized into the fp32 tile instead (kernels/avx2/codes.hpp decode8).
template <class C>
inline constexpr bool int_dot_key = [] {
  if constexpr (!kIntegerQK)
    return false;
  else if constexpr (simd::IntCodecFamily<C>)
    return C::group_size % 32 == 0 && C::group_size <= 128 &&
           (C::bits == 4 || (C::bits == 8 && (!C::asymmetric || int_dot_detail::kVnni)));
  else
    return false;
}();

/// Quantizes the query of one state (D floats) for key codec C into slot `st` of `qq`: per key
/// group, qi = round(q / σ1) with σ1 = max|q_g| / 127, then the residual q - σ1 qi (at most σ1 / 2)
/// as qr = round((q - σ1 qi) / σ) on the step σ = σ1 / 254 (|qr| <= 127), so q = σ (254 qi + qr)
/// within σ / 2 = max|q_g| / 64516 per element (kernels::query_int_error).
template <class C>
inline void quantize_query(const float* q, int D, int st, const simd::QueryInt8& qq) noexcept {
  constexpr int G = C::group_size;
  constexpr int offset = C::asymmetric ? 0 : (C::bits == 4 ? 8 : (int_dot_detail::kVnni ? 128 : 0));
  const std::size_t row = static_cast<std::size_t>(st) * static_cast<std::size_t>(D);
  std::int8_t* qi = qq.qi + row;
  std::int8_t* qr = qq.qr + row;
  for (int g = 0; g < D / G; ++g) {
    const float* x = q + g * G;
    float amax = 0.f, sum = 0.f;
    for (int d = 0; d < G; ++d) {
      amax = std::max(amax, std::fabs(x[d]));
      sum += x[d];
    }
    const float sigma1 = amax / 127.f;
    const float inv1 = amax > 0.f ? 127.f / amax : 0.f;
    const float inv = inv1 * 254.f;
    int isum = 0, rsum = 0;
    for (int c = 0; c < G; c += 32)
      for (int d = 0; d < 32; ++d) {
        // INT4: position d of the 32-element chunk holds element 2d (d < 16) or 2(d - 16) + 1.
        const int src = C::bits == 4 ? (d < 16 ? 2 * d : 2 * (d - 16) + 1) : d;
        const float xv = x[c + src];
        const int v = static_cast<int>(std::nearbyint(xv * inv1));
        const int r = std::clamp(static_cast<int>(std::nearbyint((xv - sigma1 * static_cast<float>(v)) * inv)), -127, 127);
        qi[g * G + c + d] = static_cast<std::int8_t>(v);
        qr[g * G + c + d] = static_cast<std::int8_t>(r);
        isum += v;
        rsum += r;
      }
    const std::size_t at = static_cast<std::size_t>(st) * static_cast<std::size_t>(qq.groups) + static_cast<std::size_t>(g);
    qq.sigma[at] = sigma1 / 254.f;
    qq.offset_sum[at] = offset * (254 * isum + rsum);
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
  const __m256i k254 = _mm256_set1_epi32(254);
  for (int tb = 0; tb < n; tb += 8) {
    __m256 sc[JS];
    simd::static_for<JS>([&](auto j) { sc[j] = _mm256_setzero_ps(); });
    for (int g = 0; g < ng; ++g) {
      alignas(32) __m256i I[JS][8];
      for (int tt = 0; tt < 8; ++tt) {
        const int t = std::min(tb + tt, n - 1);
        const std::byte* r = codes + static_cast<std::size_t>(t) * row;
        __m256i hi[JS], lo[JS];  // Σ qi u and Σ qr u
        simd::static_for<JS>([&](auto j) { hi[j] = lo[j] = _mm256_setzero_si256(); });
        for (int c = 0; c < G; c += 32) {
          const std::size_t e = static_cast<std::size_t>(g * G + c);
          __m256i u = codes32<C>(r, e);
          simd::static_for<JS>([&](auto j) {
            const std::size_t at = static_cast<std::size_t>(st0 + j) * static_cast<std::size_t>(D) + e;
            const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qq.qi + at));
            const __m256i sr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qq.qr + at));
            if constexpr (C::bits == 8 && !C::asymmetric && !kVnni) {
              const __m256i au = _mm256_abs_epi8(u);
              hi[j] = dot_u8s8(hi[j], au, _mm256_sign_epi8(s, u));
              lo[j] = dot_u8s8(lo[j], au, _mm256_sign_epi8(sr, u));
            } else if constexpr (C::bits == 8 && !C::asymmetric) {
              const __m256i fu = _mm256_xor_si256(u, flip);
              hi[j] = dot_u8s8(hi[j], fu, s);
              lo[j] = dot_u8s8(lo[j], fu, sr);
            } else {
              hi[j] = dot_u8s8(hi[j], u, s);
              lo[j] = dot_u8s8(lo[j], u, sr);
            }
          });
        }
        // 254 Σ qi u + Σ qr u: |Σ qi u| <= G * 127 * 255, so G <= 128 keeps it within int32.
        simd::static_for<JS>([&](auto j) { I[j][tt] = _mm256_add_epi32(_mm256_mullo_epi32(hi[j], k254), lo[j]); });
      }
      const __m256 kscale = _mm256_loadu_ps(ksc + g * 16 + tb);
      const __m256 kzero = _mm256_loadu_ps(kz + g * 16 + tb);
      simd::static_for<JS>([&](auto j) {
        const std::size_t at = static_cast<std::size_t>(st0 + j) * static_cast<std::size_t>(qq.groups) +
                               static_cast<std::size_t>(g);
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_sub_epi32(reduce8(I[j]), _mm256_set1_epi32(qq.offset_sum[at])));
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
  if constexpr (!kIntegerPV) return false;
  else if constexpr (simd::IntCodecFamily<C>) return C::bits == 4 && C::group_size % 32 == 0;
  else return false;
}();

/// acc_j[d] += Σ_t p_j[t] x̂_td for JS states over n <= 16 tokens of INT4 values (codes at
/// `codes`, stride `row`; metadata at `meta`, stride `meta_row`), slots whose bit in `live` is set,
/// without dequantizing a value: with x̂ = zero' + scale (u - 8) per token group (centered codes;
/// zero' = zero + 8 scale asymmetric, 0 symmetric), the weight w_t = p_t scale_tg is quantized per
/// (state, group, tile) in two unsigned bytes, x = w / σ1 (σ1 = max_t w_t / 255), wi = floor(x),
/// wr = round(255 (x - wi)), so w = σ1 (wi + wr / 255) within σ1 / 510; two tokens' centered codes
/// are interleaved byte-wise and multiplied by their two weights in one vpmaddubsw per term
/// (16-bit sums, <= 16 tokens * 255 * 8 < 2^15: no saturation), combined as 255 Σ wi u + Σ wr u in
/// int32 and scaled once per tile; the zero-points add Σ_t p_t zero'_tg per group. Error: each
/// weight within max_t w_t / 130050 and |u - 8| <= 8, so |Δacc_d| <= 8 / 130050 * Σ_t max_tile(w)
/// over the tiles (kernels::value_int_error). `vs`, `vz`: 2 * 16 * groups floats of room.
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
    // Quantized weights of every state, two tokens per 16-bit lane, in two terms.
    alignas(32) std::int16_t pw[JS][8], pr[JS][8];
    float sigma[JS], zsum[JS];
    // p beyond n is garbage-free (rows are kTile long, past-the-end keys got p = 0) and dead
    // slots have scale 0, so the 16 lanes need no masking.
    const __m256 s0 = _mm256_loadu_ps(vs + g * 16), s1 = _mm256_loadu_ps(vs + g * 16 + 8);
    const __m256 z0 = _mm256_loadu_ps(vz + g * 16), z1 = _mm256_loadu_ps(vz + g * 16 + 8);
    const __m256 k255 = _mm256_set1_ps(255.f);
    simd::static_for<JS>([&](auto j) {
      const __m256 p0 = _mm256_loadu_ps(p[j]), p1 = _mm256_loadu_ps(p[j] + 8);
      const __m256 w0 = _mm256_mul_ps(p0, s0), w1 = _mm256_mul_ps(p1, s1);
      const float wmax = avx2_detail::hmax(_mm256_max_ps(w0, w1));
      zsum[j] = avx2_detail::hsum(_mm256_fmadd_ps(p1, z1, _mm256_mul_ps(p0, z0)));
      const __m256 inv = _mm256_set1_ps(wmax > 0.f ? 255.f / wmax : 0.f);
      // x = w / σ1 in [0, 255]: wi = floor(x), wr = round(255 (x - wi)), both unsigned bytes.
      const __m256 x0 = _mm256_mul_ps(w0, inv), x1 = _mm256_mul_ps(w1, inv);
      const __m256i i0 = _mm256_cvttps_epi32(x0), i1 = _mm256_cvttps_epi32(x1);
      const __m256i r0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(x0, _mm256_cvtepi32_ps(i0)), k255));
      const __m256i r1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(x1, _mm256_cvtepi32_ps(i1)), k255));
      auto pack = [](__m256i a, __m256i b, std::int16_t* to) {  // token 2k | 2k + 1 << 8
        const __m128i lo = _mm_packus_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        const __m128i hi = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        _mm_store_si128(reinterpret_cast<__m128i*>(to), _mm_packus_epi16(lo, hi));
      };
      pack(i0, i1, pw[j]);
      pack(r0, r1, pr[j]);
      sigma[j] = wmax / (255.f * 255.f);
    });
    for (int c = 0; c < G; c += 32) {
      const std::size_t e = static_cast<std::size_t>(g * G + c);
      __m256i a16[JS][2], r16[JS][2];
      simd::static_for<JS>([&](auto j) { a16[j][0] = a16[j][1] = r16[j][0] = r16[j][1] = _mm256_setzero_si256(); });
      for (int k = 0; k < pairs; ++k) {
        const __m256i eight = _mm256_set1_epi8(8);
        const __m256i u0 = _mm256_sub_epi8(codes32<C>(codes + static_cast<std::size_t>(2 * k) * row, e), eight);
        const __m256i u1 =
            _mm256_sub_epi8(codes32<C>(codes + static_cast<std::size_t>(std::min(2 * k + 1, n - 1)) * row, e), eight);
        const __m256i lo = _mm256_unpacklo_epi8(u0, u1), hi = _mm256_unpackhi_epi8(u0, u1);
        simd::static_for<JS>([&](auto j) {
          const __m256i wv = _mm256_set1_epi16(pw[j][k]);  // unsigned weights, signed centered codes
          const __m256i rv = _mm256_set1_epi16(pr[j][k]);
          a16[j][0] = _mm256_add_epi16(a16[j][0], _mm256_maddubs_epi16(wv, lo));
          a16[j][1] = _mm256_add_epi16(a16[j][1], _mm256_maddubs_epi16(wv, hi));
          r16[j][0] = _mm256_add_epi16(r16[j][0], _mm256_maddubs_epi16(rv, lo));
          r16[j][1] = _mm256_add_epi16(r16[j][1], _mm256_maddubs_epi16(rv, hi));
        });
      }
      // a16[j][0]: lane 0 = channels 0, 2, .., 14, lane 1 = 1, 3, .., 15; a16[j][1]: 16.. 30, 17.. 31.
      simd::static_for<JS>([&](auto j) {
        const __m256 sg = _mm256_set1_ps(sigma[j]), zs = _mm256_set1_ps(zsum[j]);
        for (int h = 0; h < 2; ++h) {
          // 255 Σ wi u + Σ wr u per channel (int32: |.| <= 256 * 16 * 255 * 8).
          auto widen = [&](__m128i a, __m128i r) {
            const __m256i wa = _mm256_cvtepi16_epi32(a);
            return _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(wa, 8), wa), _mm256_cvtepi16_epi32(r));
          };
          const __m256i ev = widen(_mm256_castsi256_si128(a16[j][h]), _mm256_castsi256_si128(r16[j][h]));
          const __m256i od = widen(_mm256_extracti128_si256(a16[j][h], 1), _mm256_extracti128_si256(r16[j][h], 1));
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
