// AArch64 Advanced SIMD (NEON) decode and encode of kvpack's stored codes: the register-level
// pieces of the NEON attention kernel, and a SIMD quantizer. Same contract as
// kernels/avx2/codes.hpp, bit-identical to the scalar reference:
//  * decode: x̂ = zero + scale * q as one multiply and one add (no FMA); fp16 metadata and Fp16
//    values through FCVTL (exact); E5M2 codes are the top byte of an fp16; an E4M3FN code c is
//    the fp16 ((c & 0x7F) << 7 | sign) times 2^8, with 0x7F/0xFF NaN;
//  * encode (integer codecs): q = clamp(rne((x - zero) / scale)) by FDIV, FMAX/FMIN then FRINTN
//    (round to nearest, ties to even) and an exact conversion; packed as the scalar store_code.
// Only compiled when KVPACK_HAS_NEON (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_NEON

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kvpack/codec/rows.hpp"
#include "kvpack/kernels/simd_common.hpp"

namespace kvpack::kernels::neon {

/// Eight floats as two NEON registers (elements 0-3, 4-7).
struct F8 {
  float32x4_t lo, hi;
};

namespace detail {

[[nodiscard]] inline uint8x8_t load_u8x4(const std::byte* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return vcreate_u8(v);
}
[[nodiscard]] inline uint8x8_t load_u8x8(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return vcreate_u8(v);
}
[[nodiscard]] inline float load_f16(const std::byte* p) noexcept {
  std::uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
[[nodiscard]] inline F8 f16x8(uint16x8_t h) noexcept {
  const float16x8_t f = vreinterpretq_f16_u16(h);
  return {vcvt_f32_f16(vget_low_f16(f)), vcvt_high_f32_f16(f)};
}
[[nodiscard]] inline F8 from_u16(uint16x8_t u) noexcept {
  return {vcvtq_f32_u32(vmovl_u16(vget_low_u16(u))), vcvtq_f32_u32(vmovl_high_u16(u))};
}
[[nodiscard]] inline F8 from_s16(int16x8_t u) noexcept {
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(u))), vcvtq_f32_s32(vmovl_high_s16(u))};
}
/// 8 INT4 stored codes (element 2i low nibble, 2i + 1 high nibble of byte i) from 4 bytes, as u16.
[[nodiscard]] inline uint16x8_t nibbles8(const std::byte* p) noexcept {
  const uint8x8_t b = load_u8x4(p);
  const uint8x8_t lo = vand_u8(b, vdup_n_u8(0x0F));
  const uint8x8_t hi = vshr_n_u8(b, 4);
  return vmovl_u8(vzip1_u8(lo, hi));
}
/// The 16 levels of codebook codec C as a 64-byte table (level u at bytes 4u..4u+3, little-endian
/// fp32) for TBL.
template <class C>
alignas(16) inline constexpr float kCodebookLevels[16] = {
    C::codebook_level(0),  C::codebook_level(1),  C::codebook_level(2),  C::codebook_level(3),
    C::codebook_level(4),  C::codebook_level(5),  C::codebook_level(6),  C::codebook_level(7),
    C::codebook_level(8),  C::codebook_level(9),  C::codebook_level(10), C::codebook_level(11),
    C::codebook_level(12), C::codebook_level(13), C::codebook_level(14), C::codebook_level(15)};
template <class C>
[[nodiscard]] inline uint8x16x4_t codebook_table() noexcept {
  const float* f = kCodebookLevels<C>;
  uint8x16x4_t t;
  t.val[0] = vld1q_u8(reinterpret_cast<const std::uint8_t*>(f));
  t.val[1] = vld1q_u8(reinterpret_cast<const std::uint8_t*>(f + 4));
  t.val[2] = vld1q_u8(reinterpret_cast<const std::uint8_t*>(f + 8));
  t.val[3] = vld1q_u8(reinterpret_cast<const std::uint8_t*>(f + 12));
  return t;
}
/// The levels of 8 codebook codes (u16 lanes, 0..15) as fp32: each code u becomes the byte
/// indices 4u..4u+3 of the table, looked up by one TBL of 64 bytes per 4 values.
template <class C>
[[nodiscard]] inline F8 codebook8(uint16x8_t u) noexcept {
  const uint8x16_t t4 = vcombine_u8(vshl_n_u8(vmovn_u16(u), 2), vdup_n_u8(0));  // 4u in bytes 0-7
  const uint8x16_t lane = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  const uint8x16_t spread_lo = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  const uint8x16_t spread_hi = {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
  const uint8x16x4_t table = codebook_table<C>();
  const uint8x16_t lo = vqtbl4q_u8(table, vaddq_u8(vqtbl1q_u8(t4, spread_lo), lane));
  const uint8x16_t hi = vqtbl4q_u8(table, vaddq_u8(vqtbl1q_u8(t4, spread_hi), lane));
  return {vreinterpretq_f32_u8(lo), vreinterpretq_f32_u8(hi)};
}
/// Shift counts of the 8 fields of an INT3 / INT2 word (element j at bits Bits * j), as two
/// int32x4 halves (elements 0-3, 4-7).
template <int Bits>
[[nodiscard]] inline int32x4x2_t packed_shifts() noexcept {
  const std::int32_t s[8] = {0, Bits, 2 * Bits, 3 * Bits, 4 * Bits, 5 * Bits, 6 * Bits, 7 * Bits};
  return {{vld1q_s32(s), vld1q_s32(s + 4)}};
}
/// 8 INT3 / INT2 stored codes (the LSB-first bit stream: element j at bits Bits*j of the
/// little-endian word of the Bits bytes at p) plus `offset`, as floats; reads exactly Bits bytes.
template <int Bits>
[[nodiscard]] inline F8 packed8(const std::byte* p, int offset) noexcept {
  static_assert(Bits == 2 || Bits == 3, "packed8: INT2 or INT3 codes");
  std::uint32_t w = 0;
  std::memcpy(&w, p, Bits);  // little-endian: byte k at bits 8k
  const int32x4x2_t sh = packed_shifts<Bits>();
  const uint32x4_t word = vdupq_n_u32(w), mask = vdupq_n_u32((1u << Bits) - 1u);
  const int32x4_t off = vdupq_n_s32(offset);
  // vshlq_u32 by a negative count shifts right.
  const uint32x4_t lo = vandq_u32(vshlq_u32(word, vnegq_s32(sh.val[0])), mask);
  const uint32x4_t hi = vandq_u32(vshlq_u32(word, vnegq_s32(sh.val[1])), mask);
  return {vcvtq_f32_s32(vaddq_s32(vreinterpretq_s32_u32(lo), off)),
          vcvtq_f32_s32(vaddq_s32(vreinterpretq_s32_u32(hi), off))};
}
template <class Format>
[[nodiscard]] inline F8 fp8x8(uint8x8_t b) noexcept {
  if constexpr (std::is_same_v<Format, E5M2>) {
    return f16x8(vshll_n_u8(b, 8));
  } else {
    static_assert(std::is_same_v<Format, E4M3>, "FP8 format must be kvpack::E4M3 or kvpack::E5M2");
    const uint16x8_t u = vmovl_u8(b);
    const uint16x8_t mag = vandq_u16(u, vdupq_n_u16(0x7F));
    const uint16x8_t sign = vshlq_n_u16(vandq_u16(u, vdupq_n_u16(0x80)), 8);
    const F8 h = f16x8(vorrq_u16(vshlq_n_u16(mag, 7), sign));
    const float32x4_t k256 = vdupq_n_f32(256.f);  // exact: exponent bias 15 -> 7
    const int16x8_t nan16 = vreinterpretq_s16_u16(vceqq_u16(mag, vdupq_n_u16(0x7F)));
    const uint32x4_t nan_lo = vreinterpretq_u32_s32(vmovl_s16(vget_low_s16(nan16)));
    const uint32x4_t nan_hi = vreinterpretq_u32_s32(vmovl_high_s16(nan16));
    const float32x4_t qnan = vdupq_n_f32(std::numeric_limits<float>::quiet_NaN());
    return {vbslq_f32(nan_lo, qnan, vmulq_f32(h.lo, k256)), vbslq_f32(nan_hi, qnan, vmulq_f32(h.hi, k256))};
  }
}

}  // namespace detail

/// Decodes elements [e, e + 8) of a row of codec C's codes with group parameters s (scale) and z
/// (zero-point, asymmetric integer codecs only), broadcast or per lane. e is a multiple of 8.
template <KvCodec C>
[[nodiscard]] inline F8 decode8(const std::byte* row, std::size_t e, F8 s, F8 z) noexcept {
  if constexpr (simd::IntCodecFamily<C>) {
    F8 q;
    if constexpr (C::bits == 8) {
      const uint8x8_t b = detail::load_u8x8(row + e);
      q = C::asymmetric ? detail::from_u16(vmovl_u8(b)) : detail::from_s16(vmovl_s8(vreinterpret_s8_u8(b)));
    } else if constexpr (C::bits == 4) {
      const uint16x8_t u = detail::nibbles8(row + e / 2);
      q = C::asymmetric ? detail::from_u16(u) : detail::from_s16(vsubq_s16(vreinterpretq_s16_u16(u), vdupq_n_s16(8)));
    } else {
      q = detail::packed8<C::bits>(row + e * C::bits / 8, C::qmin);  // u + qmin
    }
    const F8 f{vmulq_f32(s.lo, q.lo), vmulq_f32(s.hi, q.hi)};
    if constexpr (C::asymmetric) return {vaddq_f32(z.lo, f.lo), vaddq_f32(z.hi, f.hi)};
    else return f;
  } else if constexpr (simd::CodebookCodec<C>) {  // level[u] * scale: one multiply, as decode_value
    const F8 v = detail::codebook8<C>(detail::nibbles8(row + e / 2));
    return {vmulq_f32(v.lo, s.lo), vmulq_f32(v.hi, s.hi)};
  } else if constexpr (simd::Fp8CodecFamily<C>) {
    const F8 v = detail::fp8x8<typename C::format>(detail::load_u8x8(row + e));
    return {vmulq_f32(v.lo, s.lo), vmulq_f32(v.hi, s.hi)};
  } else if constexpr (simd::Fp8UnscaledFamily<C>) {
    return detail::fp8x8<typename C::format>(detail::load_u8x8(row + e));
  } else if constexpr (std::is_same_v<C, Fp16>) {
    std::uint16_t h[8];
    std::memcpy(h, row + 2 * e, sizeof h);
    return detail::f16x8(vld1q_u16(h));
  } else {
    static_assert(std::is_same_v<C, Fp32>, "decode8: codec without a NEON decoder");
    float f[8];
    std::memcpy(f, row + 4 * e, sizeof f);
    return {vld1q_f32(f), vld1q_f32(f + 4)};
  }
}

inline void store8(float* out, F8 v) noexcept {
  vst1q_f32(out, v.lo);
  vst1q_f32(out + 4, v.hi);
}
[[nodiscard]] inline F8 dup8(float x) noexcept { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
[[nodiscard]] inline F8 load8(const float* p) noexcept { return {vld1q_f32(p), vld1q_f32(p + 4)}; }

/// Decodes `count` metadata values (Meta = MetaF16 | MetaF32, as stored) into floats.
template <class Meta>
inline void load_meta_values(const std::byte* meta, std::size_t count, float* out) noexcept {
  if constexpr (std::is_same_v<Meta, MetaF16>) {
    const std::size_t body = count - count % 8;
    for (std::size_t i = 0; i < body; i += 8) {
      std::uint16_t h[8];
      std::memcpy(h, meta + 2 * i, sizeof h);
      store8(out + i, detail::f16x8(vld1q_u16(h)));
    }
    for (std::size_t k = 0; k < count % 8; ++k) out[body + k] = detail::load_f16(meta + 2 * (body + k));
  } else {
    std::memcpy(out, meta, count * sizeof(float));
  }
}

/// Decodes one per-token row of n values (as kvpack::decode_row<C>); `tmp` holds >= 2n / 8 + 8 floats.
template <KvCodec C>
inline void decode_row(const std::byte* codes, const std::byte* meta, int n, float* out, float* tmp) noexcept {
  if constexpr (!simd::SimdDecodable<C>) {
    kvpack::decode_row<C>(codes, meta, n, out);
  } else if constexpr (C::grouped) {
    constexpr int G = C::group_size;
    constexpr int per = C::meta_bytes_per_group / C::meta_type::bytes;
    const int ng = n / G;
    load_meta_values<typename C::meta_type>(meta, static_cast<std::size_t>(ng * per), tmp);
    for (int g = 0; g < ng; ++g) {
      const F8 s = dup8(tmp[g * per]);
      const F8 z = dup8(per == 2 ? tmp[g * per + 1] : 0.f);
      for (int e = g * G; e < (g + 1) * G; e += 8) store8(out + e, decode8<C>(codes, static_cast<std::size_t>(e), s, z));
    }
  } else {
    int e = 0;
    const F8 none = dup8(0.f);
    for (; e + 8 <= n; e += 8) store8(out + e, decode8<C>(codes, static_cast<std::size_t>(e), none, none));
    for (; e < n; ++e) out[e] = C::decode_value(C::load_code(codes, static_cast<std::size_t>(e)), {});
  }
}

/// Decodes the per-channel metadata of one key token group into scale[n], zero[n]; tmp >= 2n + 8.
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

/// Decodes one key row of a per-channel group from the decoded channel parameters.
template <GroupedCodec C>
inline void decode_row_channels(const std::byte* codes, const float* scale, const float* zero, int n,
                                float* out) noexcept {
  int e = 0;
  if constexpr (simd::SimdDecodable<C>) {
    for (; e + 8 <= n; e += 8)
      store8(out + e, decode8<C>(codes, static_cast<std::size_t>(e), load8(scale + e), load8(zero + e)));
  }
  for (; e < n; ++e) out[e] = C::decode_value(C::load_code(codes, static_cast<std::size_t>(e)), {scale[e], zero[e]});
}

/// Decodes n codes that all share one GroupParams p.
template <KvCodec C>
inline void decode_codes(const std::byte* codes, std::size_t n, GroupParams p, float* out) noexcept {
  std::size_t e = 0;
  if constexpr (simd::SimdDecodable<C>) {
    const F8 s = dup8(p.scale), z = dup8(p.zero);
    for (; e < n - n % 8; e += 8) store8(out + e, decode8<C>(codes, e, s, z));
  }
  for (std::size_t k = 0; k < n - e; ++k) out[e + k] = C::decode_value(C::load_code(codes, e + k), p);
}

/// Encodes n values under one GroupParams p, bit-identical to the scalar store_code(encode_value).
/// Integer codecs only; for INT4, n is even and whole bytes are written; INT3/INT2 write 3 / 2
/// bytes per 8 values and the tail (n % 8 values) through store_code.
template <simd::IntCodecFamily C>
inline void encode_codes(const float* x, std::size_t n, GroupParams p, std::byte* codes) noexcept {
  const float32x4_t s = vdupq_n_f32(p.scale), z = vdupq_n_f32(p.zero);
  const float32x4_t lo = vdupq_n_f32(static_cast<float>(C::qmin)), hi = vdupq_n_f32(static_cast<float>(C::qmax));
  auto level = [&](float32x4_t t) {
    if constexpr (C::asymmetric) t = vsubq_f32(t, z);
    t = vdivq_f32(t, s);
    t = vminq_f32(vmaxq_f32(t, lo), hi);  // clamp first (std::clamp order), never wraps
    int32x4_t q = vcvtq_s32_f32(vrndnq_f32(t));
    if constexpr (C::sub_byte) q = vsubq_s32(q, vdupq_n_s32(C::qmin));  // stored: q - qmin
    return q;
  };
  const std::size_t body = n - n % 8;
  if constexpr (C::bits == 2 || C::bits == 3) {
    const int32x4x2_t sh = detail::packed_shifts<C::bits>();
    for (std::size_t i = 0; i < body; i += 8) {
      // u_j << (Bits * j); the fields are disjoint, so the lane sum is their OR.
      const uint32x4_t a = vreinterpretq_u32_s32(vshlq_s32(level(vld1q_f32(x + i)), sh.val[0]));
      const uint32x4_t b = vreinterpretq_u32_s32(vshlq_s32(level(vld1q_f32(x + i + 4)), sh.val[1]));
      const std::uint32_t w = vaddvq_u32(vorrq_u32(a, b));
      std::memcpy(codes + i * C::bits / 8, &w, C::bits);  // little-endian: the low Bits bytes
    }
  } else {
    for (std::size_t i = 0; i < body; i += 8) {
      const int16x8_t w = vcombine_s16(vmovn_s32(level(vld1q_f32(x + i))), vmovn_s32(level(vld1q_f32(x + i + 4))));
      if constexpr (C::bits == 8) {
        const uint8x8_t b = C::asymmetric ? vmovn_u16(vreinterpretq_u16_s16(w)) : vreinterpret_u8_s8(vmovn_s16(w));
        const std::uint64_t v = vget_lane_u64(vreinterpret_u64_u8(b), 0);
        std::memcpy(codes + i, &v, sizeof v);
      } else {
        const uint8x8_t u = vmovn_u16(vreinterpretq_u16_s16(w));
        const uint8x8_t b = vorr_u8(vuzp1_u8(u, u), vshl_n_u8(vuzp2_u8(u, u), 4));
        const std::uint32_t v = vget_lane_u32(vreinterpret_u32_u8(b), 0);
        std::memcpy(codes + i / 2, &v, sizeof v);
      }
    }
  }
  for (std::size_t k = 0; k < n % 8; ++k) C::store_code(codes, body + k, C::encode_value(x[body + k], p));
}

/// Encodes one per-token row of n values (as kvpack::encode_row<C>).
template <simd::IntCodecFamily C>
inline void encode_row(const float* x, int n, std::byte* codes, std::byte* meta) noexcept {
  constexpr int G = C::group_size;
  for (int g = 0; g < n / G; ++g) {
    std::byte* m = meta + g * C::meta_bytes_per_group;
    C::store_params(C::derive(x + g * G, 1, G), m);
    encode_codes<C>(x + g * G, G, C::load_params(m), codes + C::code_bytes(static_cast<std::size_t>(g * G)));
  }
}

}  // namespace kvpack::kernels::neon

#endif  // KVPACK_HAS_NEON
