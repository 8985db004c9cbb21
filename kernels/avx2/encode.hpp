// AVX2 quantizer of the integer codecs (the encode side of kernels/avx2/codes.hpp) and the fp16
// row conversion (encode_row_fp16), bit-identical to the scalar encoder
// (include/kvpack/codec/rows.hpp: encode_row, encode_channels):
//  * codes: q = clamp(rne((x - zero) / scale)), a true division, clamp before the conversion,
//    round half to even by _mm256_round_ps; packed as the scalar store_code does (INT4: element
//    2i in the low nibble of byte i, symmetric q + 8; INT3/INT2: the LSB-first bit stream of
//    codec/int_lowbit.hpp, 8 codes in 3 / 2 bytes; INT8 two's complement or unsigned);
//  * metadata: group ranges by SIMD min/max (a signed-zero end rescanned), then the codec's
//    from_range, or derive4 for fp16 metadata (4 groups at once, F16C directed rounding).
// Only compiled when KVPACK_HAS_AVX2 (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvpack/codec/rows.hpp"
#include "kvpack/kernels/simd_common.hpp"
#include "kvpack/numeric.hpp"

namespace kvpack::kernels::avx2 {

/// Levels of 8 values under per-lane scale s and zero z: clamp(rne((x - z) / s)) as C::quantize
/// computes it (a true division; clamp before rounding, so it never wraps), as 32-bit lanes.
template <simd::IntCodecFamily C>
[[nodiscard]] inline __m256i quantize8(__m256 x, __m256 s, __m256 z) noexcept {
  const __m256 lo = _mm256_set1_ps(static_cast<float>(C::qmin)), hi = _mm256_set1_ps(static_cast<float>(C::qmax));
  if constexpr (C::asymmetric) x = _mm256_sub_ps(x, z);
  else (void)z;
  __m256 t = _mm256_div_ps(x, s);
  t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);  // clamp first (std::clamp order), never wraps
  t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_cvttps_epi32(t);
}

/// Stores the 8 levels q (quantize8) as the packed codes of elements i .. i + 7 of a row
/// (i a multiple of 8), as C::store_code would one by one.
template <simd::IntCodecFamily C>
inline void store8(__m256i q, std::byte* codes, std::size_t i) noexcept {
  if constexpr (C::sub_byte) q = _mm256_sub_epi32(q, _mm256_set1_epi32(C::qmin));  // stored: q - qmin
  if constexpr (C::bits == 2 || C::bits == 3) {
    // u_j << (Bits * j), then the OR of the 8 lanes (disjoint fields: a sum) into one word.
    const __m256i shifts = C::bits == 3 ? _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)
                                        : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i f = _mm256_sllv_epi32(q, shifts);
    __m128i h = _mm_or_si128(_mm256_castsi256_si128(f), _mm256_extracti128_si256(f, 1));
    h = _mm_or_si128(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_or_si128(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    const auto w = static_cast<std::uint32_t>(_mm_cvtsi128_si32(h));
    std::memcpy(codes + i * C::bits / 8, &w, C::bits);  // little-endian: the low Bits bytes
  } else if constexpr (C::bits == 8) {
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    const __m128i b = C::asymmetric ? _mm_packus_epi16(w16, w16) : _mm_packs_epi16(w16, w16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), b);
  } else {
    // 16-bit lanes u0..u7 -> bytes u0 | u1 << 4, u2 | u3 << 4, ...
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    const __m128i pair = _mm_or_si128(w16, _mm_srli_epi32(w16, 12));
    const __m128i b32 = _mm_and_si128(pair, _mm_set1_epi32(0xFF));
    const __m128i b = _mm_packus_epi16(_mm_packs_epi32(b32, b32), _mm_setzero_si128());
    const std::int32_t v = _mm_cvtsi128_si32(b);
    std::memcpy(codes + i / 2, &v, sizeof v);
  }
}

/// Stores the levels of 32 consecutive elements (quantize8 of elements 0-7, 8-15, 16-23, 24-31)
/// as 16 bytes of INT4 codes at `out`, as store8 would 8 at a time: levels saturated to bytes in
/// element order, offset by -qmin, then each byte pair (2i, 2i + 1) joined as lo | hi << 4 by one
/// multiply-add (pair weights 1 and 16).
template <simd::IntCodecFamily C>
inline void store32_int4(__m256i q0, __m256i q1, __m256i q2, __m256i q3, std::byte* out) noexcept {
  static_assert(C::bits == 4);
  // packs work per 128-bit lane: bytes come out as dwords [q0 0-3, q1 0-3, q2 0-3, q3 0-3 |
  // q0 4-7, q1 4-7, q2 4-7, q3 4-7], put back in element order by one dword permute.
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
  __m256i u = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  u = _mm256_sub_epi8(u, _mm256_set1_epi8(static_cast<char>(C::qmin)));  // stored: q - qmin in 0..15
  const __m256i pairs = _mm256_maddubs_epi16(u, _mm256_set1_epi16(0x1001));  // lo * 1 + hi * 16
  const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bytes);
}

/// Encodes n values under one GroupParams p into packed codes, bit-identical to
/// C::store_code(codes, i, C::encode_value(x[i], p)) for every i. Integer codecs only.
/// For INT4, n is even and whole bytes are written; INT3/INT2 write 3 / 2 bytes per 8 values and
/// the tail (n % 8 values) through store_code.
template <simd::IntCodecFamily C>
inline void encode_codes(const float* x, std::size_t n, GroupParams p, std::byte* codes) noexcept {
  const __m256 s = _mm256_set1_ps(p.scale), z = _mm256_set1_ps(p.zero);
  std::size_t i = 0;
  if constexpr (C::bits == 4)
    for (; i + 32 <= n; i += 32)
      store32_int4<C>(quantize8<C>(_mm256_loadu_ps(x + i), s, z), quantize8<C>(_mm256_loadu_ps(x + i + 8), s, z),
                      quantize8<C>(_mm256_loadu_ps(x + i + 16), s, z), quantize8<C>(_mm256_loadu_ps(x + i + 24), s, z),
                      codes + i / 2);
  const std::size_t body = n - n % 8;
  for (; i < body; i += 8) store8<C>(quantize8<C>(_mm256_loadu_ps(x + i), s, z), codes, i);
  for (std::size_t k = 0; k < n % 8; ++k) C::store_code(codes, body + k, C::encode_value(x[body + k], p));
}

/// Whether derive4 computes C's metadata: integer codecs with fp16 metadata (F16C rounds in the
/// directed modes meta.hpp uses); others derive group by group through C::from_range.
template <class C>
inline constexpr bool kDerive4 = simd::IntCodecFamily<C> && std::is_same_v<typename C::meta_type, MetaF16>;

/// The 4 lanes of a double-precision compare mask as 32-bit lanes (all ones or zero).
[[nodiscard]] inline __m128i narrow_mask(__m256d m) noexcept {
  return _mm_castps_si128(_mm256_castps256_ps128(
      _mm256_permutevar8x32_ps(_mm256_castpd_ps(m), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7))));
}

/// f32_round_up of 4 non-negative doubles below 2^128 (meta.hpp): the nearest float, one ulp up
/// where that fell below.
[[nodiscard]] inline __m128 f32_round_up4(__m256d d) noexcept {
  const __m128 f = _mm256_cvtpd_ps(d);
  const __m128i below = narrow_mask(_mm256_cmp_pd(_mm256_cvtps_pd(f), d, _CMP_LT_OQ));
  return _mm_castsi128_ps(_mm_sub_epi32(_mm_castps_si128(f), below));  // mask -1: bits + 1
}

/// Metadata of 4 groups from their ranges (lanes of lo, hi: finite, as group_range finds them),
/// bit-identical to C::store_params(C::from_range({lo, hi}), meta + j * meta_bytes_per_group) for
/// lanes j < count (the other lanes' metadata is not written); returns the lanes' scales and
/// zero-points as C::load_params reads them back. kDerive4<C> only.
template <simd::IntCodecFamily C>
inline void derive4(__m128 lo, __m128 hi, int count, std::byte* meta, __m128& scale, __m128& zero) noexcept {
  const __m128 lim = _mm_set1_ps(kFp16Max);
  // clamp_f(v, -lim, lim): for finite v the same as min then max, signed zeros included
  lo = _mm_max_ps(_mm_min_ps(lo, lim), _mm_sub_ps(_mm_setzero_ps(), lim));
  hi = _mm_max_ps(_mm_min_ps(hi, lim), _mm_sub_ps(_mm_setzero_ps(), lim));
  const __m256d qmax = _mm256_set1_pd(static_cast<double>(C::qmax));
  __m128i scode, zcode = _mm_setzero_si128();
  if constexpr (C::asymmetric) {
    // zero = meta_round_down(lo): lo is a float already; fp16 toward -inf
    zcode = _mm_cvtps_ph(lo, _MM_FROUND_TO_NEG_INF);
    zero = _mm_cvtph_ps(zcode);
    const __m256d range = _mm256_sub_pd(_mm256_cvtps_pd(hi), _mm256_cvtps_pd(zero));
    scode = _mm_cvtps_ph(f32_round_up4(_mm256_div_pd(range, qmax)), _MM_FROUND_TO_POS_INF);
    const __m128i nonpos = narrow_mask(_mm256_cmp_pd(range, _mm256_setzero_pd(), _CMP_LE_OQ));  // not range > 0: scale 1
    const __m128i m16 = _mm_packs_epi32(nonpos, _mm_setzero_si128());
    scode = _mm_blendv_epi8(scode, _mm_set1_epi16(0x3C00), m16);
  } else {
    const __m128 neg_lo = _mm_sub_ps(_mm_setzero_ps(), lo);
    const __m128 amax = _mm_blendv_ps(neg_lo, hi, _mm_cmplt_ps(neg_lo, hi));  // -lo < hi ? hi : -lo
    __m128 pre = f32_round_up4(_mm256_div_pd(_mm256_cvtps_pd(amax), qmax));
    pre = _mm_blendv_ps(pre, amax, _mm_cmpeq_ps(lo, hi));  // constant group: round_up(amax)
    scode = _mm_cvtps_ph(pre, _MM_FROUND_TO_POS_INF);
    const __m128i zero_group = _mm_castps_si128(_mm_cmpeq_ps(amax, _mm_setzero_ps()));
    scode = _mm_blendv_epi8(scode, _mm_set1_epi16(0x3C00), _mm_packs_epi32(zero_group, _mm_setzero_si128()));
    zero = _mm_setzero_ps();
  }
  scale = _mm_cvtph_ps(scode);
  alignas(16) std::uint16_t codes[8];
  if constexpr (C::asymmetric) _mm_store_si128(reinterpret_cast<__m128i*>(codes), _mm_unpacklo_epi16(scode, zcode));
  else _mm_storel_epi64(reinterpret_cast<__m128i*>(codes), scode);
  std::memcpy(meta, codes, static_cast<std::size_t>(count) * C::meta_bytes_per_group);
}

/// The first minimum and maximum of G contiguous finite values, bit-identical to
/// kvpack::detail::group_range: min/max of 8 lanes at a time; their value is the scalar scan's
/// except that among equal values the scan keeps the first, which only changes the bits for
/// +0 / -0, so a range with a zero end is found again by the scan.
template <int G>
[[nodiscard]] inline kvpack::detail::GroupRange group_range(const float* x) noexcept {
  if constexpr (G % 8 != 0) {
    return kvpack::detail::group_range(x, 1, G);
  } else {
    __m256 lo = _mm256_loadu_ps(x), hi = lo;
    for (int i = 8; i < G; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      lo = _mm256_min_ps(lo, v);
      hi = _mm256_max_ps(hi, v);
    }
    __m128 l = _mm_min_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
    l = _mm_min_ps(l, _mm_movehl_ps(l, l));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    l = _mm_min_ss(l, _mm_shuffle_ps(l, l, 1));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const kvpack::detail::GroupRange r{_mm_cvtss_f32(l), _mm_cvtss_f32(h)};
    if (r.min == 0.f || r.max == 0.f) return kvpack::detail::group_range(x, 1, G);
    return r;
  }
}

/// The ranges of `count` (1-4) consecutive groups of G values at x (G % 8 == 0) as lanes of lo
/// and hi, bit-identical to group_range<G> of each (lanes past count: 1.0, finite, for derive4's
/// unused lanes): the groups' min/max reduced and transposed in registers. Lanes go through
/// memory only when one ends at a signed zero (rescanned): 4 scalar stores read back as one
/// vector cannot be forwarded from the store buffer, and that stall took 17 % of an INT4 row's
/// encoding.
template <int G>
inline void group_ranges4(const float* x, int count, __m128& lo, __m128& hi) noexcept {
  static_assert(G % 8 == 0);
  __m128 l[4], h[4];
  for (int g = 0; g < 4; ++g) {
    if (g >= count) {
      l[g] = h[g] = _mm_set1_ps(1.f);
      continue;
    }
    const float* p = x + g * G;
    __m256 a = _mm256_loadu_ps(p), b = a;
    for (int i = 8; i < G; i += 8) {
      const __m256 v = _mm256_loadu_ps(p + i);
      a = _mm256_min_ps(a, v);
      b = _mm256_max_ps(b, v);
    }
    l[g] = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h[g] = _mm_max_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  }
  // 4x4 transpose, then the min (max) across rows: lane g is group g's reduction.
  auto reduce = [](__m128 r0, __m128 r1, __m128 r2, __m128 r3, auto op) {
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    return op(op(r0, r1), op(r2, r3));
  };
  lo = reduce(l[0], l[1], l[2], l[3], [](__m128 u, __m128 v) { return _mm_min_ps(u, v); });
  hi = reduce(h[0], h[1], h[2], h[3], [](__m128 u, __m128 v) { return _mm_max_ps(u, v); });
  const __m128 zero = _mm_setzero_ps();
  if (_mm_movemask_ps(_mm_or_ps(_mm_cmpeq_ps(lo, zero), _mm_cmpeq_ps(hi, zero))) != 0) {
    alignas(16) float lo_s[4] = {1.f, 1.f, 1.f, 1.f}, hi_s[4] = {1.f, 1.f, 1.f, 1.f};
    for (int g = 0; g < count; ++g) {
      const kvpack::detail::GroupRange r = group_range<G>(x + g * G);
      lo_s[g] = r.min, hi_s[g] = r.max;
    }
    lo = _mm_load_ps(lo_s);
    hi = _mm_load_ps(hi_s);
  }
}

/// Encodes one per-token row of n values (as kvpack::encode_row<C>): metadata by the codec's
/// derive and store_params, codes by encode_codes against the stored parameters.
template <simd::IntCodecFamily C>
inline void encode_row(const float* x, int n, std::byte* codes, std::byte* meta) noexcept {
  constexpr int G = C::group_size;
  // Three passes over the groups (ranges, metadata, codes) rather than one: each pass's groups
  // are independent, so their latency chains (reductions, the metadata's double division and
  // fp16 rounding, the code divisions) overlap instead of running one group after another.
  constexpr int kMaxGroups = 64;
  for (int g0 = 0; g0 < n / G; g0 += kMaxGroups) {
    const int ng = std::min(kMaxGroups, n / G - g0);
    alignas(16) float lo[kMaxGroups + 3], hi[kMaxGroups + 3], scale[kMaxGroups + 3], zero[kMaxGroups + 3];
    std::byte* m0 = meta + g0 * C::meta_bytes_per_group;
    if constexpr (kDerive4<C> && G % 8 == 0) {
      for (int g = 0; g < ng; g += 4) {  // ranges of 4 groups at a time, in registers
        const int count = std::min(4, ng - g);
        __m128 l, h, s, z;
        group_ranges4<G>(x + (g0 + g) * G, count, l, h);
        derive4<C>(l, h, count, m0 + g * C::meta_bytes_per_group, s, z);
        _mm_store_ps(scale + g, s);
        _mm_store_ps(zero + g, z);
      }
    } else {
      for (int g = 0; g < ng; ++g) {
        const kvpack::detail::GroupRange r = group_range<G>(x + (g0 + g) * G);
        lo[g] = r.min, hi[g] = r.max;
      }
      if constexpr (kDerive4<C>) {
        for (int g = ng; g < ng + 3; ++g) lo[g] = hi[g] = 1.f;  // padding lanes: finite, not stored
        for (int g = 0; g < ng; g += 4) {
          __m128 s, z;
          derive4<C>(_mm_load_ps(lo + g), _mm_load_ps(hi + g), std::min(4, ng - g), m0 + g * C::meta_bytes_per_group, s, z);
          _mm_store_ps(scale + g, s);
          _mm_store_ps(zero + g, z);
        }
      } else {
        for (int g = 0; g < ng; ++g) {
          std::byte* m = m0 + g * C::meta_bytes_per_group;
          C::store_params(C::from_range({lo[g], hi[g]}), m);
          const GroupParams p = C::load_params(m);
          scale[g] = p.scale, zero[g] = p.zero;
        }
      }
    }
    for (int g = 0; g < ng; ++g)
      encode_codes<C>(x + (g0 + g) * G, G, GroupParams{scale[g], zero[g]},
                      codes + C::code_bytes(static_cast<std::size_t>((g0 + g) * G)));
  }
}

/// Encodes one row of n finite values as fp16 codes (Fp16's layout: 2 bytes per value, no
/// metadata), bit-identical to kvpack::encode_row<Fp16>: F16C's round-half-to-even conversion
/// after a clamp to +-65504, which gives fp16_from_float's saturation (F16C alone turns
/// |x| >= 65520 into Inf). 8 values per step, the tail through the scalar conversion.
inline void encode_row_fp16(const float* x, int n, std::byte* codes) noexcept {
  const __m256 lim = _mm256_set1_ps(kFp16Max), neg_lim = _mm256_set1_ps(-kFp16Max);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(x + i), neg_lim), lim);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 2 * i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) {
    const std::uint16_t c = fp16_from_float(x[i]);
    std::memcpy(codes + 2 * i, &c, 2);
  }
}

/// Encodes a per-channel group (KIVI keys; as kvpack::encode_channels<C>): G = C::group_size
/// token rows x + r * x_stride of n channels; channel c's scale (and zero) from its G values go
/// to meta + c * meta_bytes_per_group, row r's codes to codes + r * code_row_bytes. Eight
/// channels at a time: their ranges are lane-wise min/max down the rows (no horizontal
/// reduction; a lane whose range ends at a signed zero is scanned again, as group_range keeps
/// the first of -0 / +0), their levels one division per row. Channels past the last multiple of
/// 8 go through the scalar encoder. Bit-identical to encode_channels (tests/test_cache_simd_encode.cpp).
template <simd::IntCodecFamily C>
inline void encode_channels(const float* x, std::ptrdiff_t x_stride, int n, std::byte* codes, std::size_t code_row_bytes,
                            std::byte* meta) noexcept {
  constexpr int G = C::group_size;
  const int body = n - n % 8;
  for (int c = 0; c < body; c += 8) {
    __m256 lo = _mm256_loadu_ps(x + c), hi = lo;
    for (int r = 1; r < G; ++r) {
      const __m256 v = _mm256_loadu_ps(x + r * x_stride + c);
      lo = _mm256_min_ps(lo, v);
      hi = _mm256_max_ps(hi, v);
    }
    alignas(32) float los[8], his[8], scale[8], zero[8];
    _mm256_store_ps(los, lo);
    _mm256_store_ps(his, hi);
    for (int j = 0; j < 8; ++j)
      if (los[j] == 0.f || his[j] == 0.f) {  // a signed-zero end: the scan's choice of sign
        const kvpack::detail::GroupRange r = kvpack::detail::group_range(x + c + j, x_stride, G);
        los[j] = r.min, his[j] = r.max;
      }
    std::byte* m = meta + c * C::meta_bytes_per_group;
    if constexpr (kDerive4<C>) {
      for (int h = 0; h < 8; h += 4) {
        __m128 s, z;
        derive4<C>(_mm_load_ps(los + h), _mm_load_ps(his + h), 4, m + h * C::meta_bytes_per_group, s, z);
        _mm_store_ps(scale + h, s);
        _mm_store_ps(zero + h, z);
      }
    } else {
      for (int j = 0; j < 8; ++j) {
        C::store_params(C::from_range({los[j], his[j]}), m + j * C::meta_bytes_per_group);
        const GroupParams p = C::load_params(m + j * C::meta_bytes_per_group);
        scale[j] = p.scale, zero[j] = p.zero;
      }
    }
    const __m256 s = _mm256_load_ps(scale), z = _mm256_load_ps(zero);
    for (int r = 0; r < G; ++r)
      store8<C>(quantize8<C>(_mm256_loadu_ps(x + r * x_stride + c), s, z), codes + r * code_row_bytes,
                static_cast<std::size_t>(c));
  }
  for (int c = body; c < n; ++c) {
    std::byte* m = meta + c * C::meta_bytes_per_group;
    C::store_params(C::derive(x + c, x_stride, G), m);
    const GroupParams p = C::load_params(m);
    for (int r = 0; r < G; ++r)
      C::store_code(codes + r * code_row_bytes, static_cast<std::size_t>(c), C::encode_value(x[r * x_stride + c], p));
  }
}

}  // namespace kvpack::kernels::avx2

#endif  // KVPACK_HAS_AVX2
