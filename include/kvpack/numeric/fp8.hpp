// OCP 8-bit floating point (FP8 E4M3FN and E5M2) <-> fp32 conversions.
//
// Specification: Open Compute Project, "OCP 8-bit Floating Point Specification (OFP8)",
// revision 1.0, 2023-06-20. The same formats as CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2 and
// the "float8_e4m3fn" / "float8_e5m2" types of ML frameworks.
//
// E4M3 (OCP "E4M3", often written E4M3FN: finite + NaN, no Inf):
//   1 sign, 4 exponent (bias 7), 3 mantissa bits. The all-ones exponent holds normal values
//   except the one NaN magnitude 1111.111.
//   max finite      0x7E = S.1111.110 = 1.75 * 2^8 = 448
//   min normal      0x08 = 2^-6
//   min subnormal   0x01 = 2^-9
//   NaN             0x7F / 0xFF (the only NaN codes); no Inf codes.
// E5M2 (IEEE-754-like):
//   1 sign, 5 exponent (bias 15), 2 mantissa bits.
//   max finite      0x7B = S.11110.11 = 1.75 * 2^15 = 57344
//   min normal      0x04 = 2^-14
//   min subnormal   0x01 = 2^-16
//   +-Inf           0x7C / 0xFC
//   NaN             0x7D..0x7F / 0xFD..0xFF
//
// Encoding policy (both formats; OFP8 defines a saturating and a non-saturating conversion
// mode, and kvpack uses the saturating one, which CUDA calls __NV_SATFINITE):
// round-half-to-even, subnormals produced, finite magnitudes that round beyond max and
// +-Inf saturate to +-max; NaN -> 0x7F (positive) / 0xFF (negative). So no input other than
// NaN ever encodes to a non-finite code: an FP8 KV cache never holds Inf.
#pragma once

#include <cstdint>

#include "kvpack/config.hpp"
#include "kvpack/numeric/minifloat.hpp"

namespace kvpack {

/// Largest finite E4M3 value, 448 (code 0x7E).
inline constexpr float kE4M3Max = 448.f;
/// Smallest positive subnormal E4M3 value, 2^-9 (code 0x01).
inline constexpr float kE4M3MinSubnormal = 0x1p-9f;
/// Largest finite E5M2 value, 57344 (code 0x7B).
inline constexpr float kE5M2Max = 57344.f;
/// Smallest positive subnormal E5M2 value, 2^-16 (code 0x01).
inline constexpr float kE5M2MinSubnormal = 0x1p-16f;

namespace detail {
/// E4M3FN in the conversion engine: saturating, Inf -> max, NaN -> 0x7F.
using E4M3Format = MiniFormat<4, 3, 7, Special::fn, /*max*/ 0x7Eu, /*inf*/ 0x7Eu,
                              /*NaN*/ 0x7Fu, /*keep payload*/ false>;
/// E5M2 in the conversion engine: saturating, Inf -> max, NaN -> 0x7F.
using E5M2Format = MiniFormat<5, 2, 15, Special::ieee, /*max*/ 0x7Bu, /*inf*/ 0x7Bu,
                              /*NaN*/ 0x7Fu, /*keep payload*/ false>;
}  // namespace detail

/// fp32 -> OCP E4M3FN code: round-half-to-even, saturating.
/// Finite |x| that rounds above 448 (that is |x| > 464; 464 itself ties to the even 448)
/// and +-Inf give +-448 (0x7E / 0xFE); NaN gives 0x7F / 0xFF (sign kept); a finite input
/// never gives NaN. Magnitudes up to 2^-10 (half the smallest subnormal) give +-0.
/// Examples: 17 -> 16 (0x58), 19 -> 20 (0x5A), 288 -> 0x79, 1.5 * 2^-9 -> 2^-8 (0x02).
/// Host and CUDA device code; constant-evaluable; integer arithmetic only.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr std::uint8_t e4m3_from_float(float x) noexcept {
  return static_cast<std::uint8_t>(
      detail::float_to_mini<detail::E4M3Format>(x, Rounding::nearest_even));
}

/// OCP E4M3FN code -> fp32, exact for every code; 0x7F / 0xFF give a quiet NaN with that
/// sign. Host and CUDA device code; constant-evaluable.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr float e4m3_to_float(std::uint8_t code) noexcept {
  return detail::mini_to_float<detail::E4M3Format>(code);
}

/// fp32 -> OCP E5M2 code: round-half-to-even, saturating.
/// Finite |x| that rounds above 57344 (|x| > 61440; 61440 ties to the even 57344) and
/// +-Inf give +-57344 (0x7B / 0xFB) -- E5M2 has Inf codes, but kvpack never produces them,
/// as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2) does not. NaN gives
/// 0x7F / 0xFF (sign kept). Magnitudes up to 2^-17 give +-0.
/// Host and CUDA device code; constant-evaluable; integer arithmetic only.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr std::uint8_t e5m2_from_float(float x) noexcept {
  return static_cast<std::uint8_t>(
      detail::float_to_mini<detail::E5M2Format>(x, Rounding::nearest_even));
}

/// OCP E5M2 code -> fp32, exact for every code: 0x7C / 0xFC give +-Inf, 0x7D..0x7F and
/// 0xFD..0xFF a quiet NaN of that sign. Host and CUDA device code; constant-evaluable.
/// Note: e5m2_from_float(e5m2_to_float(0x7C)) is 0x7B (Inf saturates), the only non-NaN
/// codes that do not round-trip.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr float e5m2_to_float(std::uint8_t code) noexcept {
  return detail::mini_to_float<detail::E5M2Format>(code);
}

}  // namespace kvpack
