// IEEE 754 binary16 ("fp16", "half") <-> fp32 conversions.
//
// Format (IEEE 754-2019, section 3.6, binary16): 1 sign, 5 exponent (bias 15), 10 mantissa
// bits.
//   max finite      0x7BFF = 65504 = (2 - 2^-10) * 2^15
//   min normal      0x0400 = 2^-14
//   min subnormal   0x0001 = 2^-24
//   +-Inf           0x7C00 / 0xFC00
//   NaN             exponent 31, mantissa != 0 (0x7C01..0x7FFF and 0xFC01..0xFFFF);
//                   quiet NaNs have mantissa bit 9 (0x0200) set.
#pragma once

#include <cstdint>

#include "kvpack/config.hpp"
#include "kvpack/numeric/minifloat.hpp"

namespace kvpack {

/// Largest finite fp16 value, 65504 (code 0x7BFF).
inline constexpr float kFp16Max = 65504.f;
/// Smallest positive normal fp16 value, 2^-14 (code 0x0400).
inline constexpr float kFp16MinNormal = 0x1p-14f;
/// Smallest positive subnormal fp16 value, 2^-24 (code 0x0001).
inline constexpr float kFp16MinSubnormal = 0x1p-24f;

namespace detail {
/// binary16 in the conversion engine: Inf stays Inf, NaN keeps its payload and is quieted.
using Fp16Format = MiniFormat<5, 10, 15, Special::ieee, /*max*/ 0x7BFFu, /*inf*/ 0x7C00u,
                              /*quiet NaN*/ 0x7E00u, /*keep payload*/ true>;
}  // namespace detail

/// fp32 -> fp16 code, correctly rounded in mode `r` (default round-half-to-even).
///
/// - Finite x: the fp16 value nearest to x (ties to even mantissa), or the bracketing one
///   for the directed modes; subnormal results are produced, never flushed to zero.
///   A finite x whose rounded magnitude would exceed 65504 SATURATES to +-65504 (0x7BFF /
///   0xFBFF) in every mode, unlike IEEE 754 (which gives Inf from |x| >= 65520 under
///   nearest-even). Consequence for directed modes: inside [-65504, 65504] the result
///   brackets x exactly (e.g. 4367.2 toward_pos_inf -> 4368 = 0x6C44); beyond it the result
///   is +-65504, so clamp x to +-kFp16Max first when an upper/lower bound must hold.
/// - +-Inf -> +-Inf (0x7C00 / 0xFC00) in every mode.
/// - NaN -> quiet NaN of the same sign, keeping the top 9 payload bits (0x7E00 | payload),
///   as x86 F16C does.
/// Host and CUDA device code; constant-evaluable; integer arithmetic only, no branches
/// beyond selects.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr std::uint16_t fp16_from_float(
    float x, Rounding r = Rounding::nearest_even) noexcept {
  return static_cast<std::uint16_t>(detail::float_to_mini<detail::Fp16Format>(x, r));
}

/// fp16 code -> fp32, exact for every code (fp16 subnormals are fp32 normals).
/// Inf codes give +-Inf; NaN codes give a quiet fp32 NaN with the same sign, the fp16
/// mantissa as the top payload bits and the quiet bit set.
/// Host and CUDA device code; constant-evaluable.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr float fp16_to_float(std::uint16_t bits) noexcept {
  return detail::mini_to_float<detail::Fp16Format>(bits);
}

}  // namespace kvpack
