// The one conversion engine behind every narrow float format in kvpack (fp16, bf16, FP8).
//
// Public here: kvpack::Rounding. Everything else lives in kvpack::detail and is used by
// numeric/fp16.hpp, numeric/bf16.hpp and numeric/fp8.hpp, which hold the public API and
// the per-format documentation. Include kvpack/numeric.hpp rather than this file.
//
// Why integer bit arithmetic and not float tricks: the result must be identical on the
// host (any -ffast-math / FTZ / DAZ setting), in CUDA device code (-ftz=true included) and
// in constant evaluation. Only integer operations touch the input; the one float operation
// (decoding an fp16/FP8 subnormal) converts its small integer mantissa to float and scales
// it by a power of two, all normal fp32 numbers, which is exact under every flush mode.
#pragma once

#include <cstdint>

#include "kvpack/config.hpp"

namespace kvpack {

/// Rounding mode of a float -> narrow-format conversion (IEEE 754-2019, section 4.3).
///
/// - nearest_even:   round to nearest, ties to the code with an even last mantissa bit
///                   (roundTiesToEven). The default everywhere in kvpack.
/// - toward_pos_inf: the least representable value >= x (roundTowardPositive).
/// - toward_neg_inf: the greatest representable value <= x (roundTowardNegative).
///
/// Every mode is exact (correctly rounded) inside the finite range of the target format.
/// Finite inputs beyond the largest finite value saturate to +-max in every mode (kvpack
/// never turns a finite number into Inf); see the per-format functions for details.
enum class Rounding { nearest_even, toward_pos_inf, toward_neg_inf };

namespace detail {

/// Bit-level reinterpretation usable in constant expressions, host code and CUDA device
/// code (std::bit_cast is a host-only function under nvcc without --expt-relaxed-constexpr;
/// the builtin behind it is accepted by g++ >= 11, clang++ >= 9 and nvcc).
template <class To, class From>
[[nodiscard]] KVPACK_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs types of the same size");
  return __builtin_bit_cast(To, from);
}

/// How a format spends its all-ones exponent field.
enum class Special : std::uint8_t {
  ieee,  ///< all-ones exponent: mantissa 0 = Inf, otherwise NaN (fp16, bf16, E5M2)
  fn,    ///< "finite, NaN": no Inf; only the all-ones magnitude code is NaN (E4M3FN)
};

/// A binary floating-point format with 1 sign bit, `exp_bits` exponent bits (bias `bias`)
/// and `man_bits` stored mantissa bits, at most 16 bits wide. Codes are sign | magnitude,
/// where the magnitude code (exponent field << man_bits | mantissa) grows with the value.
///
/// Conversion policy (kvpack-wide, see DESIGN.md section 3):
/// - finite input: correctly rounded in the requested mode; magnitudes that round beyond
///   `max_code` saturate to `max_code` (never Inf, never NaN); subnormals are produced;
/// - +-Inf input: the magnitude `inf_code` (Inf itself, or `max_code` to saturate);
/// - NaN input: `nan_quiet_bit` | payload (top bits of the fp32 payload) when
///   `nan_keeps_payload`, else the fixed magnitude code `nan_code`; the sign is kept.
template <int ExpBits, int ManBits, int Bias, Special Kind, std::uint32_t MaxCode,
          std::uint32_t InfCode, std::uint32_t NanCode, bool NanKeepsPayload>
struct MiniFormat {
  static constexpr int exp_bits = ExpBits;
  static constexpr int man_bits = ManBits;
  static constexpr int bias = Bias;
  static constexpr Special kind = Kind;
  static constexpr std::uint32_t max_code = MaxCode;
  static constexpr std::uint32_t inf_code = InfCode;
  static constexpr std::uint32_t nan_code = NanCode;
  static constexpr bool nan_keeps_payload = NanKeepsPayload;

  static_assert(ExpBits >= 2 && ExpBits <= 8 && ManBits >= 1 && ManBits <= 10);
  static_assert(Bias >= 1 && Bias <= 127 && ExpBits + ManBits <= 15);
  static_assert(MaxCode < (1u << (ExpBits + ManBits)) && InfCode < (1u << (ExpBits + ManBits)));
};

/// Correctly rounded, saturating fp32 -> Fmt conversion; returns the code in the low
/// 1 + exp_bits + man_bits bits (sign on top).
///
/// Method: in fp32 bits, a value that is normal in the target needs only a re-bias of the
/// exponent and a right shift by (23 - man_bits); a value below the target's smallest
/// normal is its 24-bit significand shifted further right. Both are "add a rounding
/// increment, then shift", and the carry of that add moves into the exponent (or from
/// subnormal to normal) by itself because the magnitude code is monotonic in the value.
template <class Fmt>
[[nodiscard]] KVPACK_HOST_DEVICE constexpr std::uint32_t float_to_mini(float x,
                                                                      Rounding r) noexcept {
  constexpr std::uint32_t kShift = 23u - static_cast<std::uint32_t>(Fmt::man_bits);
  // fp32 exponent field of the target's smallest normal, 2^(1 - bias).
  constexpr std::uint32_t kMinNormalField = 128u - static_cast<std::uint32_t>(Fmt::bias);
  constexpr std::uint32_t kRebias = (127u - static_cast<std::uint32_t>(Fmt::bias)) << 23;
  constexpr std::uint32_t kSignShift = static_cast<std::uint32_t>(Fmt::exp_bits + Fmt::man_bits);
  constexpr std::uint32_t kInfBits = 0x7f800000u;

  const std::uint32_t u = bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = u >> 31;
  const std::uint32_t a = u & 0x7fffffffu;
  const std::uint32_t e = a >> 23;

  // Target-subnormal range: shift the significand (implicit bit included for fp32 normals;
  // fp32 subnormals behave as exponent field 1 without it). Shifts past 31 would be
  // undefined; 31 gives the same result because the significand is below 2^24.
  const bool sub = e < kMinNormalField;
  const std::uint32_t e_eff = e + (e == 0u ? 1u : 0u);
  const std::uint32_t sig = (a & 0x007fffffu) | (e != 0u ? 0x00800000u : 0u);
  const std::uint32_t sub_shift = kShift + kMinNormalField - (sub ? e_eff : kMinNormalField);
  const std::uint32_t s = sub_shift < 31u ? sub_shift : 31u;
  const std::uint32_t v = sub ? sig : a - kRebias;

  const std::uint32_t mask = 0xffffffffu >> (32u - s);  // the s bits shifted out
  const std::uint32_t lsb = (v >> s) & 1u;
  const bool away = (r == Rounding::toward_pos_inf && sign == 0u) ||
                    (r == Rounding::toward_neg_inf && sign != 0u);
  const std::uint32_t add = r == Rounding::nearest_even ? (mask >> 1) + lsb : (away ? mask : 0u);
  std::uint32_t mag = (v + add) >> s;
  mag = mag < Fmt::max_code ? mag : Fmt::max_code;  // finite input saturates

  std::uint32_t nan = Fmt::nan_code;
  if constexpr (Fmt::nan_keeps_payload) {
    nan |= (a & 0x007fffffu) >> kShift;
  }
  mag = a == kInfBits ? Fmt::inf_code : mag;
  mag = a > kInfBits ? nan : mag;
  return (sign << kSignShift) | mag;
}

/// Exact Fmt -> fp32 conversion of the code in the low 1 + exp_bits + man_bits bits
/// (higher bits are ignored). Every code of a format narrower than fp32 is representable.
/// NaN codes decode to a quiet fp32 NaN with the same sign (and the mantissa bits as the
/// top payload bits for ieee formats).
template <class Fmt>
[[nodiscard]] KVPACK_HOST_DEVICE constexpr float mini_to_float(std::uint32_t code) noexcept {
  constexpr std::uint32_t kManBits = static_cast<std::uint32_t>(Fmt::man_bits);
  constexpr std::uint32_t kShift = 23u - kManBits;
  constexpr std::uint32_t kMagBits = static_cast<std::uint32_t>(Fmt::exp_bits) + kManBits;
  constexpr std::uint32_t kMagMask = (1u << kMagBits) - 1u;
  constexpr std::uint32_t kExpAllOnes = (1u << Fmt::exp_bits) - 1u;
  constexpr std::uint32_t kRebias = (127u - static_cast<std::uint32_t>(Fmt::bias)) << 23;

  const std::uint32_t sign = ((code >> kMagBits) & 1u) << 31;
  const std::uint32_t mag = code & kMagMask;
  const std::uint32_t ex = mag >> kManBits;
  const std::uint32_t m = mag & ((1u << kManBits) - 1u);

  std::uint32_t bits = (mag << kShift) + kRebias;  // normal codes
  if constexpr (Fmt::bias != 127) {
    // Subnormal codes are normal in fp32: m * 2^(1 - bias - man_bits), exact. (With
    // bias 127, as in bf16, they are fp32 subnormals and the normal formula above holds.)
    static_assert(128 - Fmt::bias - Fmt::man_bits >= 1, "narrow subnormals must be fp32 normals");
    constexpr float kSubUnit =  // 2^(1 - bias - man_bits), the smallest subnormal
        bit_cast<float>(static_cast<std::uint32_t>(128 - Fmt::bias - Fmt::man_bits) << 23);
    const std::uint32_t sub_bits = bit_cast<std::uint32_t>(static_cast<float>(m) * kSubUnit);
    bits = ex == 0u ? sub_bits : bits;
  }
  if constexpr (Fmt::kind == Special::ieee) {
    const std::uint32_t special = 0x7f800000u | (m << kShift) | (m != 0u ? 0x00400000u : 0u);
    bits = ex == kExpAllOnes ? special : bits;
  } else {
    bits = mag == kMagMask ? 0x7fc00000u : bits;
  }
  return bit_cast<float>(sign | bits);
}

}  // namespace detail
}  // namespace kvpack
