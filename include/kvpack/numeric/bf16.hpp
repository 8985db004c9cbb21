// bfloat16 ("bf16", brain floating point) <-> fp32 conversions.
//
// Format: the upper 16 bits of an IEEE 754 binary32 number: 1 sign, 8 exponent (bias 127),
// 7 mantissa bits (Intel, "BFLOAT16 - Hardware Numerics Definition", 2018, doc. 338302;
// the same layout as Google's TPUs and CUDA's __nv_bfloat16).
//   max finite      0x7F7F = (2 - 2^-7) * 2^127 ~= 3.3895e38
//   min normal      0x0080 = 2^-126
//   min subnormal   0x0001 = 2^-133
//   +-Inf           0x7F80 / 0xFF80
//   NaN             exponent 255, mantissa != 0; quiet NaNs have bit 6 (0x0040) set.
#pragma once

#include <cstdint>

#include "kvpack/config.hpp"
#include "kvpack/numeric/minifloat.hpp"

namespace kvpack {

/// Largest finite bf16 value, (2 - 2^-7) * 2^127 (code 0x7F7F).
inline constexpr float kBf16Max = 0x1.FEp127f;
/// Smallest positive normal bf16 value, 2^-126 (code 0x0080), the same as fp32's.
inline constexpr float kBf16MinNormal = 0x1p-126f;
/// Smallest positive subnormal bf16 value, 2^-133 (code 0x0001).
inline constexpr float kBf16MinSubnormal = 0x1p-133f;

namespace detail {
/// bf16 in the conversion engine: Inf stays Inf, NaN keeps its payload and is quieted.
using Bf16Format = MiniFormat<8, 7, 127, Special::ieee, /*max*/ 0x7F7Fu, /*inf*/ 0x7F80u,
                              /*quiet NaN*/ 0x7FC0u, /*keep payload*/ true>;
}  // namespace detail

/// fp32 -> bf16 code, correctly rounded in mode `r` (default round-half-to-even).
///
/// - Finite x: the bf16 value nearest to x (ties to even), or the bracketing one for the
///   directed modes; fp32 subnormals give bf16 subnormals (no flush to zero).
///   A finite x whose rounded magnitude would exceed kBf16Max (|x| >= 0x1.FF8p127 under
///   nearest-even) SATURATES to +-kBf16Max (0x7F7F / 0xFF7F) in every mode, where IEEE-style
///   rounding would give Inf. Directed modes bracket x exactly inside the finite range.
/// - +-Inf -> +-Inf (0x7F80 / 0xFF80) in every mode.
/// - NaN -> quiet NaN of the same sign keeping the top 6 payload bits (0x7FC0 | payload).
/// Host and CUDA device code; constant-evaluable; integer arithmetic only.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr std::uint16_t bf16_from_float(
    float x, Rounding r = Rounding::nearest_even) noexcept {
  return static_cast<std::uint16_t>(detail::float_to_mini<detail::Bf16Format>(x, r));
}

/// bf16 code -> fp32, exact for every code: the fp32 number whose upper 16 bits are `bits`
/// and lower 16 bits are zero. Subnormals, Inf and NaN codes (payload and quiet/signaling
/// bit included) carry over bit for bit.
/// Host and CUDA device code; constant-evaluable.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr float bf16_to_float(std::uint16_t bits) noexcept {
  return detail::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace kvpack
