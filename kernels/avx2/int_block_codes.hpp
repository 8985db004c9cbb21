// Code and metadata loaders of the AVX2 block path (kernels/avx2/int_block.hpp): 32-code chunks
// of key rows widened to int16 for vpdpwssd / vpmaddwd, value codes converted to fp32 in code
// order, and per-token scales and zero-points built in registers.
// Only compiled when KVPACK_HAS_AVX2 (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2

#include <immintrin.h>

#include <cstddef>
#include <type_traits>

#include "kvpack/codec/params.hpp"
#include "kvpack/kernels/avx2/codes.hpp"

namespace kvpack::kernels::avx2 {

namespace int_block_detail {

/// acc + Σ over pairs of 16-bit lanes of a * b (signed).
[[nodiscard]] inline __m256i dot_s16(__m256i acc, __m256i a, __m256i b) noexcept {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/// Stored-code offset: x̂ = zero + scale * (w - offset) for the widened code w (symmetric INT4
/// stores q + 8; INT8 is widened with its sign, asymmetric codes are unsigned).
template <class C>
inline constexpr int code_offset = (C::bits == 4 && !C::asymmetric) ? 8 : 0;

/// Chunk c (32 elements) of a key code row as int16: INT4 lo = elements 2i, hi = 2i + 1
/// (i < 16); INT8 lo = elements 0-15, hi = 16-31.
template <class C>
inline void key_chunk(const std::byte* row, int c, __m256i& lo, __m256i& hi) noexcept {
  if constexpr (C::bits == 4) {
    const __m256i w = _mm256_cvtepu8_epi16(detail::load128(row + 16 * c));
    lo = _mm256_and_si256(w, _mm256_set1_epi16(0x0F));
    hi = _mm256_srli_epi16(w, 4);
  } else if constexpr (C::asymmetric) {
    lo = _mm256_cvtepu8_epi16(detail::load128(row + 32 * c));
    hi = _mm256_cvtepu8_epi16(detail::load128(row + 32 * c + 16));
  } else {
    lo = _mm256_cvtepi8_epi16(detail::load128(row + 32 * c));
    hi = _mm256_cvtepi8_epi16(detail::load128(row + 32 * c + 16));
  }
}
/// Element of chunk position p (0..31) in key_chunk's order.
template <class C>
[[nodiscard]] constexpr int key_element(int p) noexcept {
  return C::bits == 4 ? (p < 16 ? 2 * p : 2 * (p - 16) + 1) : p;
}

/// Half h2 (16 elements) of chunk c of a value code row as 2 x 8 floats (the widened codes w),
/// parts 2 h2 and 2 h2 + 1 of the chunk's code order: INT4 part 0 = elements 0, 2, .., 14;
/// part 1 = 1, 3, .., 15; part 2 = 16, .., 30; part 3 = 17, .., 31. INT8: element order.
template <class C>
inline void value_half(const std::byte* row, int c, int h2, __m256* u) noexcept {
  if constexpr (C::bits == 4) {
    const __m256i b = _mm256_cvtepu8_epi32(detail::load64(row + 16 * c + 8 * h2));
    u[0] = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x0F)));
    u[1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  } else {
    for (int h = 0; h < 2; ++h) {
      const __m128i b = detail::load64(row + 32 * c + 16 * h2 + 8 * h);
      u[h] = _mm256_cvtepi32_ps(C::asymmetric ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b));
    }
  }
}
/// The 32 floats of value_half's code order in element order (out may not alias in).
template <class C>
inline void value_chunk_to_elements(const float* in, float* out) noexcept {
  if constexpr (C::bits == 4) {
    for (int h = 0; h < 2; ++h) {
      const __m256 e = _mm256_loadu_ps(in + 16 * h), o = _mm256_loadu_ps(in + 16 * h + 8);
      const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);  // [0-3 | 8-11], [4-7 | 12-15]
      _mm256_storeu_ps(out + 16 * h, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_storeu_ps(out + 16 * h + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
  } else {
    for (int h = 0; h < 4; ++h) _mm256_storeu_ps(out + 8 * h, _mm256_loadu_ps(in + 8 * h));
  }
}

/// Whether 32 vector registers are available (AVX-512VL): a value pass then keeps 4 states x
/// 4 parts of accumulators; with AVX2's 16 it takes half a chunk for 3 or 4 states.
#if defined(__AVX512VL__)
inline constexpr bool kWideRegisters = true;
#else
inline constexpr bool kWideRegisters = false;
#endif

/// N <= 8 metadata values at p (fp16 or fp32 as Meta) in lanes 0..N-1, zeros above: built in
/// registers, because a vector load of values just stored piecewise stalls store forwarding.
template <class Meta, int N>
[[nodiscard]] inline __m256 meta_floats(const std::byte* p) noexcept {
  static_assert(N >= 1 && N <= 8);
  if constexpr (std::is_same_v<Meta, MetaF16>) {
    __m128i h;
    if constexpr (N > 4) h = detail::load128(p);
    else if constexpr (N > 2) h = detail::load64(p);
    else if constexpr (N == 2) h = detail::load32(p);
    else h = _mm_cvtsi32_si128(static_cast<int>(std::to_integer<unsigned>(p[0]) | (std::to_integer<unsigned>(p[1]) << 8)));
    return _mm256_cvtph_ps(h);
  } else if constexpr (N > 4) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (N > 2) {
    return _mm256_zextps128_ps256(_mm_loadu_ps(reinterpret_cast<const float*>(p)));
  } else if constexpr (N == 2) {
    return _mm256_zextps128_ps256(_mm_castsi128_ps(detail::load64(p)));
  } else {
    return _mm256_zextps128_ps256(_mm_set_ss(detail::load_f32(p)));
  }
}

/// Scale (S) and z' = zero - offset * scale (Z) of the value groups of one token row, group g in
/// lane g (NG <= 8 groups).
template <class C, int NG>
inline void value_params(const std::byte* meta, __m256& S, __m256& Z) noexcept {
  static_assert(NG <= 8);
  using Meta = typename C::meta_type;
  constexpr int PER = C::asymmetric ? 2 : 1, N = NG * PER;
  const __m256i is = _mm256_setr_epi32(0, PER, 2 * PER, 3 * PER, 4 * PER % 8, 5 * PER % 8, 6 * PER % 8, 7 * PER % 8);
  const __m256i iz = _mm256_add_epi32(is, _mm256_set1_epi32(1));
  __m256 zero = _mm256_setzero_ps();
  if constexpr (N <= 8) {
    const __m256 m = meta_floats<Meta, N>(meta);
    S = _mm256_permutevar8x32_ps(m, is);
    if constexpr (PER == 2) zero = _mm256_permutevar8x32_ps(m, iz);
  } else {  // 8 asymmetric groups: lanes 0-3 from the first 8 values, 4-7 from the next
    const __m256 m0 = meta_floats<Meta, 8>(meta), m1 = meta_floats<Meta, N - 8>(meta + 8 * Meta::bytes);
    S = _mm256_blend_ps(_mm256_permutevar8x32_ps(m0, is), _mm256_permutevar8x32_ps(m1, is), 0xF0);
    zero = _mm256_blend_ps(_mm256_permutevar8x32_ps(m0, iz), _mm256_permutevar8x32_ps(m1, iz), 0xF0);
  }
  Z = _mm256_fnmadd_ps(_mm256_set1_ps(static_cast<float>(code_offset<C>)), S, zero);
}

/// Key groups per vphaddd batch and the group of each lane: 1 group -> all lanes; 2 -> lanes
/// [0 0 1 1 | 0 0 1 1]; 4 -> [0 1 2 3 | 0 1 2 3].
[[nodiscard]] constexpr int lane_group(int per_batch, int lane) noexcept {
  return per_batch == 1 ? 0 : per_batch == 2 ? (lane % 4) / 2 : lane % 4;
}

}  // namespace int_block_detail

}  // namespace kvpack::kernels::avx2

#endif  // KVPACK_HAS_AVX2
