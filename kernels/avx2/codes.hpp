// AVX2 (+FMA, F16C) decode of kvpack's stored codes: the register-level pieces of the AVX2
// attention kernel. Bit-identical to the scalar reference (include/kvpack/codec/rows.hpp and the
// codecs' decode_value): x̂ = zero + scale * q as one multiply and one add (no FMA), fp16
// metadata and Fp16 values through F16C (exact), FP8 through the fp16 unit: an E5M2 code is the
// top byte of an fp16; an E4M3FN code c is fp16 bits ((c & 0x7F) << 7 | sign) times 2^8, with
// 0x7F/0xFF NaN. The quantizer (encode) is kernels/avx2/encode.hpp.
// Only compiled when KVPACK_HAS_AVX2 (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kvpack/codec/rows.hpp"
#include "kvpack/kernels/simd_common.hpp"

namespace kvpack::kernels::avx2 {

namespace detail {

[[nodiscard]] inline __m128i load32(const std::byte* p) noexcept {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm_cvtsi32_si128(v);
}
[[nodiscard]] inline __m128i load64(const std::byte* p) noexcept {
  std::int64_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm_cvtsi64_si128(v);
}
[[nodiscard]] inline __m128i load128(const std::byte* p) noexcept {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
[[nodiscard]] inline float load_f32(const std::byte* p) noexcept {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[nodiscard]] inline float load_f16(const std::byte* p) noexcept {
  std::uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

/// 8 INT4 stored codes (elements 2i low nibble, 2i + 1 high nibble of byte i) from 4 bytes.
[[nodiscard]] inline __m256i nibbles8(const std::byte* p) noexcept {
  const __m128i b = load32(p);
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  return _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
}

/// 32 INT4 stored codes from 16 bytes, split into element order once: c[0] holds elements 0-15,
/// c[1] elements 16-31, one per byte (element 2i is the low nibble of byte i).
inline void nibbles32(const std::byte* p, __m128i c[2]) noexcept {
  const __m128i b = load128(p);
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  c[0] = _mm_unpacklo_epi8(lo, hi);
  c[1] = _mm_unpackhi_epi8(lo, hi);
}
/// Codes 8h .. 8h + 7 of nibbles32's split (h = 0..3) as int32 lanes.
[[nodiscard]] inline __m256i nibbles32_part(const __m128i c[2], int h) noexcept {
  return _mm256_cvtepu8_epi32(h % 2 == 0 ? c[h / 2] : _mm_srli_si128(c[h / 2], 8));
}

/// 8 fp16 codes (in the 16-bit lanes of h) for 8 FP8 codes (the low 8 bytes of b).
template <class Format>
[[nodiscard]] inline __m256 fp8x8(__m128i b) noexcept {
  const __m128i u = _mm_cvtepu8_epi16(b);
  if constexpr (std::is_same_v<Format, E5M2>) {
    return _mm256_cvtph_ps(_mm_slli_epi16(u, 8));
  } else {
    static_assert(std::is_same_v<Format, E4M3>, "FP8 format must be kvpack::E4M3 or kvpack::E5M2");
    const __m128i mag = _mm_and_si128(u, _mm_set1_epi16(0x7F));
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(u, _mm_set1_epi16(0x80)), 8);
    const __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), sign);
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.f));  // exact: bias 15 -> 7
    const __m256 nan_lanes =
        _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F))));
    return _mm256_blendv_ps(v, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), nan_lanes);
  }
}

/// The unscaled values of 16 FP8 codes (the 16 bytes at p): elements 0-7 in lo, 8-15 in hi.
/// Same conversions as fp8x8 (so bit-identical to it), each step on 16 codes at once.
template <class Format>
inline void fp8x16(const std::byte* p, __m256& lo, __m256& hi) noexcept {
  const __m256i u = _mm256_cvtepu8_epi16(load128(p));
  __m256i h;
  if constexpr (std::is_same_v<Format, E5M2>) {
    h = _mm256_slli_epi16(u, 8);
  } else {
    static_assert(std::is_same_v<Format, E4M3>, "FP8 format must be kvpack::E4M3 or kvpack::E5M2");
    // u << 7 puts the magnitude at bits 7-13 and the sign at bit 14; adding bit 14 to itself
    // carries it to bit 15: ((u & 0x7F) << 7) | ((u & 0x80) << 8) in 3 steps instead of 5.
    const __m256i t = _mm256_slli_epi16(u, 7);
    h = _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
    // 0x7F / 0xFF are NaN: the fp16 quiet NaN 0x7E00 converts to fp32's (fp8x8 blends that in).
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi16(0x7F));
    h = _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7E00), _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F)));
  }
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  if constexpr (std::is_same_v<Format, E4M3>) {
    lo = _mm256_mul_ps(lo, _mm256_set1_ps(256.f));  // exact: bias 15 -> 7
    hi = _mm256_mul_ps(hi, _mm256_set1_ps(256.f));
  }
}

/// 8 INT3 / INT2 stored codes (the LSB-first bit stream: element j at bits Bits*j of the
/// little-endian word of the Bits bytes at p) as int32 lanes; reads exactly Bits bytes.
template <int Bits>
[[nodiscard]] inline __m256i packed8(const std::byte* p) noexcept {
  static_assert(Bits == 2 || Bits == 3, "packed8: INT2 or INT3 codes");
  std::uint32_t w = 0;
  std::memcpy(&w, p, Bits);  // little-endian: byte k at bits 8k
  const __m256i shifts = Bits == 3 ? _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)
                                   : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shifts),
                          _mm256_set1_epi32((1 << Bits) - 1));
}

}  // namespace detail

/// x̂ = level[u] * scale (one multiply: bit-identical to the codec's decode_value) of 8 stored
/// codes u (0..15, int32 lanes) of codebook codec C: two 8-entry permutes and a blend on bit 3.
template <simd::CodebookCodec C>
[[nodiscard]] inline __m256 codebook_value8(__m256i u, __m256 s) noexcept {
  const __m256 lo = _mm256_setr_ps(C::codebook_level(0), C::codebook_level(1), C::codebook_level(2), C::codebook_level(3),
                                   C::codebook_level(4), C::codebook_level(5), C::codebook_level(6), C::codebook_level(7));
  const __m256 hi = _mm256_setr_ps(C::codebook_level(8), C::codebook_level(9), C::codebook_level(10), C::codebook_level(11),
                                   C::codebook_level(12), C::codebook_level(13), C::codebook_level(14), C::codebook_level(15));
  const __m256 high_half = _mm256_castsi256_ps(_mm256_slli_epi32(u, 28));  // bit 3 -> sign bit
  const __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, u), _mm256_permutevar8x32_ps(hi, u), high_half);
  return _mm256_mul_ps(v, s);
}

/// x̂ = zero + scale * q (one multiply, one add: bit-identical to IntCodec::dequantize) of 8
/// stored codes u of integer codec C as int32 lanes (sub-byte symmetric codes: q = u + qmin).
template <simd::IntCodecFamily C>
[[nodiscard]] inline __m256 int_value8(__m256i u, __m256 s, __m256 z) noexcept {
  if constexpr (C::sub_byte && !C::asymmetric) u = _mm256_add_epi32(u, _mm256_set1_epi32(C::qmin));
  const __m256 f = _mm256_mul_ps(s, _mm256_cvtepi32_ps(u));
  if constexpr (C::asymmetric) return _mm256_add_ps(z, f);
  else return f;
}

/// Decodes elements [e, e + 8) of a row of codec C's codes with the group parameters s (scale)
/// and z (zero-point, asymmetric integer codecs only) broadcast or per lane. e is a multiple of 8.
template <KvCodec C>
[[nodiscard]] inline __m256 decode8(const std::byte* row, std::size_t e, __m256 s, __m256 z) noexcept {
  if constexpr (simd::IntCodecFamily<C>) {
    __m256i q;
    if constexpr (C::bits == 8) {
      const __m128i b = detail::load64(row + e);
      q = C::asymmetric ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b);
    } else if constexpr (C::bits == 4) {
      q = detail::nibbles8(row + e / 2);
    } else {
      q = detail::packed8<C::bits>(row + e * C::bits / 8);
    }
    return int_value8<C>(q, s, z);
  } else if constexpr (simd::CodebookCodec<C>) {
    return codebook_value8<C>(detail::nibbles8(row + e / 2), s);
  } else if constexpr (simd::Fp8CodecFamily<C>) {
    return _mm256_mul_ps(detail::fp8x8<typename C::format>(detail::load64(row + e)), s);
  } else if constexpr (simd::Fp8UnscaledFamily<C>) {
    return detail::fp8x8<typename C::format>(detail::load64(row + e));
  } else if constexpr (std::is_same_v<C, Fp16>) {
    return _mm256_cvtph_ps(detail::load128(row + 2 * e));
  } else {
    static_assert(std::is_same_v<C, Fp32>, "decode8: codec without an AVX2 decoder");
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row + 4 * e));
  }
}

/// Decodes `count` metadata values (scale, zero-point, ... as stored: Meta = MetaF16 | MetaF32)
/// into floats.
template <class Meta>
inline void load_meta_values(const std::byte* meta, std::size_t count, float* out) noexcept {
  if constexpr (std::is_same_v<Meta, MetaF16>) {
    std::size_t i = 0;
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(detail::load128(meta + 2 * i)));
    // A row of 4 groups (head_dim 128, INT8/FP8 group 32) or 2: one conversion, not 4 or 2.
    if (i + 4 <= count) {
      _mm_storeu_ps(out + i, _mm_cvtph_ps(detail::load64(meta + 2 * i)));
      i += 4;
    }
    if (i + 2 <= count) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_castps_si128(_mm_cvtph_ps(detail::load32(meta + 2 * i))));
      i += 2;
    }
    if (i < count) out[i] = detail::load_f16(meta + 2 * i);
  } else {
    std::memcpy(out, meta, count * sizeof(float));
  }
}

/// Decodes one per-token row of n values (as kvpack::decode_row<C>). `tmp` holds >= 2n / 8 + 8
/// floats of working memory (the row's decoded metadata).
template <KvCodec C>
inline void decode_row(const std::byte* codes, const std::byte* meta, int n, float* out, float* tmp) noexcept {
  if constexpr (!simd::SimdDecodable<C>) {
    kvpack::decode_row<C>(codes, meta, n, out);
  } else if constexpr (C::grouped) {
    constexpr int G = C::group_size;
    constexpr int per = C::meta_bytes_per_group / C::meta_type::bytes;  // 2: scale + zero, 1: scale
    const int ng = n / G;
    load_meta_values<typename C::meta_type>(meta, static_cast<std::size_t>(ng * per), tmp);
    for (int g = 0; g < ng; ++g) {
      const __m256 s = _mm256_set1_ps(tmp[g * per]);
      const __m256 z = per == 2 ? _mm256_set1_ps(tmp[g * per + 1]) : _mm256_setzero_ps();
      if constexpr (simd::IntCodecFamily<C> && C::bits == 4 && G % 32 == 0) {
        // 32 INT4 codes per 16-byte load, split into element order once (decode8 reads 4 bytes
        // and splits them for every 8 codes); the same multiply and add, so bit-identical.
        simd::static_for<G / 32>([&](auto k) {
          const int e = g * G + 32 * k;
          __m128i c[2];
          detail::nibbles32(codes + e / 2, c);
          for (int h = 0; h < 4; ++h) _mm256_storeu_ps(out + e + 8 * h, int_value8<C>(detail::nibbles32_part(c, h), s, z));
        });
      } else if constexpr (simd::CodebookCodec<C> && G % 32 == 0) {
        simd::static_for<G / 32>([&](auto k) {  // 32 codes per load, as INT4
          const int e = g * G + 32 * k;
          __m128i c[2];
          detail::nibbles32(codes + e / 2, c);
          for (int h = 0; h < 4; ++h) _mm256_storeu_ps(out + e + 8 * h, codebook_value8<C>(detail::nibbles32_part(c, h), s));
        });
      } else if constexpr (simd::Fp8CodecFamily<C> && G % 16 == 0) {
        // 16 FP8 codes per load, widened and converted to fp16 bits in one pass (fp8x16).
        simd::static_for<G / 16>([&](auto k) {
          const int e = g * G + 16 * k;
          __m256 lo, hi;
          detail::fp8x16<typename C::format>(codes + e, lo, hi);
          _mm256_storeu_ps(out + e, _mm256_mul_ps(lo, s));
          _mm256_storeu_ps(out + e + 8, _mm256_mul_ps(hi, s));
        });
      } else {
        // Unrolled at compile time: a run-time loop of G / 8 steps cost as much as the decode.
        simd::static_for<G / 8>([&](auto k) {
          const int e = g * G + 8 * k;
          _mm256_storeu_ps(out + e, decode8<C>(codes, static_cast<std::size_t>(e), s, z));
        });
      }
    }
  } else {
    int e = 0;
    const __m256 none = _mm256_setzero_ps();
    for (; e + 8 <= n; e += 8) _mm256_storeu_ps(out + e, decode8<C>(codes, static_cast<std::size_t>(e), none, none));
    for (; e < n; ++e) out[e] = C::decode_value(C::load_code(codes, static_cast<std::size_t>(e)), {});
  }
}

/// Decodes the per-channel metadata of one key token group ([n][meta bytes]) into scale[n] and
/// zero[n] (zero-points 0 for symmetric codecs). `tmp` holds >= 2n + 8 floats.
template <GroupedCodec C>
inline void load_channel_params(const std::byte* meta, int n, float* scale, float* zero, float* tmp) noexcept {
  if constexpr (!simd::SimdDecodable<C>) {
    for (int c = 0; c < n; ++c) {
      const GroupParams p = C::load_params(meta + c * C::meta_bytes_per_group);
      scale[c] = p.scale;
      zero[c] = p.zero;
    }
  } else {
    constexpr int per = C::meta_bytes_per_group / C::meta_type::bytes;
    load_meta_values<typename C::meta_type>(meta, static_cast<std::size_t>(n * per), tmp);
    for (int c = 0; c < n; ++c) {
      scale[c] = tmp[c * per];
      zero[c] = per == 2 ? tmp[c * per + 1] : 0.f;
    }
  }
}

/// Decodes one key row of a per-channel group (as kvpack::decode_row_channels<C>) from the
/// decoded channel parameters.
template <GroupedCodec C>
inline void decode_row_channels(const std::byte* codes, const float* scale, const float* zero, int n,
                                float* out) noexcept {
  int e = 0;
  if constexpr (simd::SimdDecodable<C>) {
    if constexpr (simd::IntCodecFamily<C> && C::bits == 4) {
      for (; e + 32 <= n; e += 32) {  // 32 codes per load, as decode_row
        __m128i c[2];
        detail::nibbles32(codes + e / 2, c);
        for (int h = 0; h < 4; ++h)
          _mm256_storeu_ps(out + e + 8 * h, int_value8<C>(detail::nibbles32_part(c, h), _mm256_loadu_ps(scale + e + 8 * h),
                                                          _mm256_loadu_ps(zero + e + 8 * h)));
      }
    } else if constexpr (simd::Fp8CodecFamily<C>) {
      for (; e + 16 <= n; e += 16) {
        __m256 lo, hi;
        detail::fp8x16<typename C::format>(codes + e, lo, hi);
        _mm256_storeu_ps(out + e, _mm256_mul_ps(lo, _mm256_loadu_ps(scale + e)));
        _mm256_storeu_ps(out + e + 8, _mm256_mul_ps(hi, _mm256_loadu_ps(scale + e + 8)));
      }
    }
    for (; e + 8 <= n; e += 8)
      _mm256_storeu_ps(out + e, decode8<C>(codes, static_cast<std::size_t>(e), _mm256_loadu_ps(scale + e),
                                           _mm256_loadu_ps(zero + e)));
  }
  for (; e < n; ++e) out[e] = C::decode_value(C::load_code(codes, static_cast<std::size_t>(e)), {scale[e], zero[e]});
}

/// Decodes n codes that all share one GroupParams p (for tests and tools; the kernel decodes
/// through decode_row / decode_row_channels).
template <KvCodec C>
inline void decode_codes(const std::byte* codes, std::size_t n, GroupParams p, float* out) noexcept {
  std::size_t e = 0;
  if constexpr (simd::SimdDecodable<C>) {
    const __m256 s = _mm256_set1_ps(p.scale), z = _mm256_set1_ps(p.zero);
    for (; e < n - n % 8; e += 8) _mm256_storeu_ps(out + e, decode8<C>(codes, e, s, z));
  }
  for (std::size_t k = 0; k < n - e; ++k) out[e + k] = C::decode_value(C::load_code(codes, e + k), p);
}

}  // namespace kvpack::kernels::avx2

#endif  // KVPACK_HAS_AVX2
