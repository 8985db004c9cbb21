// Fast unpacking of one chunk of 8 stored codes into floats for the decode kernel's inner loop:
// integer codes by the magic-number trick of the INT4 GEMM kernels (the code ORed into the
// mantissa of the fp16 1024: one LOP3 or PRMT per two codes, one HADD2 per two codes to remove
// the 1024, then the exact fp16 -> fp32 widening; no I2F), FP8 E5M2 as the high byte of fp16, FP8
// E4M3 by the hardware fp8x2 -> half2 conversion. What comes out is a "unit value" u; the
// reconstruction is zero_eff + scale * u with effective_params() (symmetric codes' +8 or +128 are
// folded into zero_eff), so the scoring loop factors scale and zero out of the dot product per
// group.
//
// __host__ __device__; the same byte_perm code runs on the host, where
// tests/test_cuda_helpers.cpp checks every byte value against the host codecs.
#pragma once

#include <cstdint>

#include "kvpack/kernels/cuda/helpers.cuh"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace kvpack::cuda {

/// PRMT (CUDA __byte_perm): byte i of the result is byte s_i (selector nibble i, 0..7) of the
/// 8 bytes {y:x} (x = bytes 0-3, y = bytes 4-7).
[[nodiscard]] KVPACK_HOST_DEVICE inline std::uint32_t byte_perm(std::uint32_t x, std::uint32_t y, unsigned s) noexcept {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const std::uint64_t v = (static_cast<std::uint64_t>(y) << 32) | x;
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<std::uint32_t>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
#endif
}

/// (x & mask) | magic in one LOP3 (the compiler splits it into two when both are immediates).
template <std::uint32_t Mask, std::uint32_t Magic>
[[nodiscard]] KVPACK_HOST_DEVICE inline std::uint32_t and_or(std::uint32_t x) noexcept {
#if defined(__CUDA_ARCH__)
  std::uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(x), "n"(Mask), "n"(Magic));
  return r;
#else
  return (x & Mask) | Magic;
#endif
}

/// Two fp16 values (bits) as floats.
KVPACK_HOST_DEVICE inline void half2_bits_to_float2(std::uint32_t h, float& lo, float& hi) noexcept {
#if defined(__CUDA_ARCH__)
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  lo = f.x;
  hi = f.y;
#else
  lo = fp16_to_float(static_cast<std::uint16_t>(h & 0xFFFFu));
  hi = fp16_to_float(static_cast<std::uint16_t>(h >> 16));
#endif
}

/// Integer codes c0, c1 held as the fp16 values 1024 + c (bits) -> floats c0, c1: the 1024 is
/// subtracted in fp16 (exact: HADD2), then widened (HADD2.F32). Subtracting after widening would
/// cost the same, and folding it into the zero-point would cancel ~7 bits of the dot product.
KVPACK_HOST_DEVICE inline void magic_half2_to_float2(std::uint32_t h, float& lo, float& hi) noexcept {
#if defined(__CUDA_ARCH__)
  const __half2 x = __hsub2(*reinterpret_cast<const __half2*>(&h), __half2(__half(1024.f), __half(1024.f)));
  const float2 f = __half22float2(x);
  lo = f.x;
  hi = f.y;
#else
  half2_bits_to_float2(h, lo, hi);
  lo -= 1024.f;
  hi -= 1024.f;
#endif
}

/// Unit values u[0..7] of a chunk (codes as load_chunk reads them: INT4 in w[0], 8-bit codes in
/// w[0], w[1]). Integer codes come out as c: the nibble (0..15), the asymmetric byte, or q + 128
/// for symmetric INT8 (effective_params() folds the +8 / +128 into the zero-point); the code is
/// placed in the mantissa of the fp16 1024 (LOP3 / PRMT, two codes per instruction), 1024 is
/// subtracted in fp16 and the result widened to fp32, all exact. FP8: the element value.
template <class DC>
KVPACK_HOST_DEVICE inline void unpack_units(const ChunkCodes& c, float* u) noexcept {
  if constexpr (DC::bits == 4) {
    // nibbles e and e + 4 sit at bits 4e and 4e + 16 of (w >> 4e)
    magic_half2_to_float2(and_or<0x000F000Fu, 0x64006400u>(c.w[0]), u[0], u[4]);
    magic_half2_to_float2(and_or<0x000F000Fu, 0x64006400u>(c.w[0] >> 4), u[1], u[5]);
    magic_half2_to_float2(and_or<0x000F000Fu, 0x64006400u>(c.w[0] >> 8), u[2], u[6]);
    magic_half2_to_float2(and_or<0x000F000Fu, 0x64006400u>(c.w[0] >> 12), u[3], u[7]);
  } else if constexpr (DC::kind == CodeKind::e5m2) {
    for (int h = 0; h < 2; ++h) {
      half2_bits_to_float2(byte_perm(c.w[h], 0u, 0x1404u), u[4 * h], u[4 * h + 1]);
      half2_bits_to_float2(byte_perm(c.w[h], 0u, 0x3424u), u[4 * h + 2], u[4 * h + 3]);
    }
  } else if constexpr (DC::kind == CodeKind::e4m3) {
    for (int h = 0; h < 2; ++h) {
#if defined(__CUDA_ARCH__)
      const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(c.w[h] & 0xFFFFu), __NV_E4M3);
      const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(c.w[h] >> 16), __NV_E4M3);
      half2_bits_to_float2(static_cast<std::uint32_t>(a.x) | (static_cast<std::uint32_t>(a.y) << 16), u[4 * h], u[4 * h + 1]);
      half2_bits_to_float2(static_cast<std::uint32_t>(b.x) | (static_cast<std::uint32_t>(b.y) << 16), u[4 * h + 2],
                           u[4 * h + 3]);
#else
      for (int e = 0; e < 4; ++e) u[4 * h + e] = e4m3_to_float(static_cast<std::uint8_t>(c.w[h] >> (8 * e)));
#endif
    }
  } else {
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t w = DC::asymmetric ? c.w[h] : c.w[h] ^ 0x80808080u;  // int8 q -> q + 128
      magic_half2_to_float2(byte_perm(w, 0x64u, 0x4140u), u[4 * h], u[4 * h + 1]);
      magic_half2_to_float2(byte_perm(w, 0x64u, 0x4342u), u[4 * h + 2], u[4 * h + 3]);
    }
  }
}

/// Offset of unpack_units' value to the integer level: 8 (INT4) or 128 (INT8) for symmetric
/// codes, 0 otherwise.
template <class DC>
inline constexpr float kUnitOffset = DC::is_fp8 || DC::asymmetric ? 0.f : static_cast<float>(1 << (DC::bits - 1));

/// Effective parameters for unit values: value = zero + scale * u, i.e. zero_eff = zero -
/// kUnitOffset * scale (symmetric integers: zero_eff = -8 s or -128 s, exact).
/// Read from a group's metadata (fp16 metadata as one native half2 load when there is a zero-point).
template <class DC>
[[nodiscard]] KVPACK_HOST_DEVICE inline GroupParams effective_params(const std::uint8_t* meta) noexcept {
  GroupParams p;
  if constexpr (DC::meta_f16 && DC::asymmetric) {
#if defined(__CUDA_ARCH__)
    half2_bits_to_float2(*reinterpret_cast<const std::uint32_t*>(meta), p.scale, p.zero);
#else
    half2_bits_to_float2(load_le32(meta), p.scale, p.zero);
#endif
  } else {
    p = load_group_params<DC>(meta);
  }
  if constexpr (!DC::is_fp8) p.zero -= kUnitOffset<DC> * p.scale;
  return p;
}

}  // namespace kvpack::cuda
