// Cross-check of kvpack's numeric conversions (include/kvpack/numeric/) against the CUDA
// Toolkit's host-side implementations: cuda_fp16.h (__float2half_rn/_ru/_rd, __half2float),
// cuda_bf16.h (__float2bfloat16_rn/_ru/_rd, __bfloat162float) and cuda_fp8.h
// (__nv_cvt_float_to_fp8 with __NV_SATFINITE, __nv_cvt_fp8_to_halfraw), for E4M3 and E5M2.
//
// Built only where the CUDA headers exist (tests/CMakeLists.txt); compiled as ordinary host
// C++ by g++ or clang++, no GPU and no CUDA runtime needed.
//
// Expected differences, all documented kvpack policy and asserted here exactly:
// - fp16/bf16: where CUDA rounds a FINITE input to +-Inf (|x| >= 65520 for fp16 under _rn,
//   any |x| > max under _ru/_rd away from zero), kvpack saturates to +-max. Everything
//   else, including every subnormal and every tie, must be bit-identical.
// - NaN inputs: CUDA returns one canonical NaN (sign dropped); kvpack keeps the sign (and
//   for fp16/bf16 the top payload bits). Both must be NaN codes.
// - FP8 with __NV_SATFINITE: bit-identical for every non-NaN input, Inf included (both
//   saturate +-Inf to +-max).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvpack/numeric.hpp"
#include "support/minifloat_checks.hpp"

namespace {

using kvpack::Rounding;
using kvpack::test::bits_float;
using kvpack::test::describe;
using kvpack::test::float_bits;
using kvpack::test::Mismatches;

// ------------------------------------------------------------------ CUDA, host side, as codes

std::uint16_t cuda_fp16(float x, Rounding r) {
  const __half h = r == Rounding::nearest_even     ? __float2half_rn(x)
                   : r == Rounding::toward_pos_inf ? __float2half_ru(x)
                                                   : __float2half_rd(x);
  return static_cast<__half_raw>(h).x;
}
float cuda_fp16_decode(std::uint16_t code) {
  __half_raw raw;
  raw.x = code;
  return __half2float(__half(raw));
}
std::uint16_t cuda_bf16(float x, Rounding r) {
  const __nv_bfloat16 b = r == Rounding::nearest_even     ? __float2bfloat16_rn(x)
                          : r == Rounding::toward_pos_inf ? __float2bfloat16_ru(x)
                                                          : __float2bfloat16_rd(x);
  return static_cast<__nv_bfloat16_raw>(b).x;
}
float cuda_bf16_decode(std::uint16_t code) {
  __nv_bfloat16_raw raw;
  raw.x = code;
  return __bfloat162float(__nv_bfloat16(raw));
}
std::uint8_t cuda_fp8(float x, __nv_fp8_interpretation_t kind) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind);
}
float cuda_fp8_decode(std::uint8_t code, __nv_fp8_interpretation_t kind) {
  return cuda_fp16_decode(__nv_cvt_fp8_to_halfraw(code, kind).x);
}

/// One format: kvpack's encoder/decoder next to CUDA's, with the format's constants.
struct Pair {
  const char* name;
  std::uint32_t codes;     // number of codes (2^width)
  std::uint32_t sign_bit;  // sign bit of a code
  std::uint32_t max_code;  // positive max finite magnitude
  std::uint32_t inf_mag;   // magnitude code of Inf (0 when the format has none / never makes it)
  std::vector<Rounding> modes;
  std::uint32_t (*ours)(float, Rounding);
  std::uint32_t (*cuda)(float, Rounding);
  float (*ours_decode)(std::uint32_t);
  float (*cuda_decode)(std::uint32_t);
  bool (*is_nan_code)(std::uint32_t);
};

const std::vector<Pair>& pairs() {
  static const std::vector<Pair> p = {
      {"fp16",
       1u << 16,
       0x8000u,
       0x7BFFu,
       0x7C00u,
       {Rounding::nearest_even, Rounding::toward_pos_inf, Rounding::toward_neg_inf},
       [](float x, Rounding r) -> std::uint32_t { return kvpack::fp16_from_float(x, r); },
       [](float x, Rounding r) -> std::uint32_t { return cuda_fp16(x, r); },
       [](std::uint32_t c) { return kvpack::fp16_to_float(static_cast<std::uint16_t>(c)); },
       [](std::uint32_t c) { return cuda_fp16_decode(static_cast<std::uint16_t>(c)); },
       [](std::uint32_t c) { return (c & 0x7C00u) == 0x7C00u && (c & 0x03FFu) != 0u; }},
      {"bf16",
       1u << 16,
       0x8000u,
       0x7F7Fu,
       0x7F80u,
       {Rounding::nearest_even, Rounding::toward_pos_inf, Rounding::toward_neg_inf},
       [](float x, Rounding r) -> std::uint32_t { return kvpack::bf16_from_float(x, r); },
       [](float x, Rounding r) -> std::uint32_t { return cuda_bf16(x, r); },
       [](std::uint32_t c) { return kvpack::bf16_to_float(static_cast<std::uint16_t>(c)); },
       [](std::uint32_t c) { return cuda_bf16_decode(static_cast<std::uint16_t>(c)); },
       [](std::uint32_t c) { return (c & 0x7F80u) == 0x7F80u && (c & 0x007Fu) != 0u; }},
      {"e4m3",
       256u,
       0x80u,
       0x7Eu,
       0u,
       {Rounding::nearest_even},
       [](float x, Rounding) -> std::uint32_t { return kvpack::e4m3_from_float(x); },
       [](float x, Rounding) -> std::uint32_t { return cuda_fp8(x, __NV_E4M3); },
       [](std::uint32_t c) { return kvpack::e4m3_to_float(static_cast<std::uint8_t>(c)); },
       [](std::uint32_t c) { return cuda_fp8_decode(static_cast<std::uint8_t>(c), __NV_E4M3); },
       [](std::uint32_t c) { return (c & 0x7Fu) == 0x7Fu; }},
      {"e5m2",
       256u,
       0x80u,
       0x7Bu,
       0u,
       {Rounding::nearest_even},
       [](float x, Rounding) -> std::uint32_t { return kvpack::e5m2_from_float(x); },
       [](float x, Rounding) -> std::uint32_t { return cuda_fp8(x, __NV_E5M2); },
       [](std::uint32_t c) { return kvpack::e5m2_to_float(static_cast<std::uint8_t>(c)); },
       [](std::uint32_t c) { return cuda_fp8_decode(static_cast<std::uint8_t>(c), __NV_E5M2); },
       [](std::uint32_t c) { return (c & 0x7Fu) > 0x7Cu; }},
  };
  return p;
}

/// Inputs: every code value of every format (decoded by CUDA), the midpoints between
/// neighbours and the floats just around both; every fp32 exponent with rounding-bit
/// mantissa patterns; random bit patterns; windows of 2^16 consecutive floats around the
/// subnormal, tie and overflow borders of each format. Positive only (callers add -x).
const std::vector<float>& inputs() {
  static const std::vector<float> xs = [] {
    std::vector<float> v;
    for (const Pair& p : pairs()) {
      float prev = -1.f;
      for (std::uint32_t c = 0; c <= p.max_code; ++c) {
        const float x = p.cuda_decode(c);
        v.push_back(x);
        v.push_back(std::nextafter(x, 0.f));
        v.push_back(std::nextafter(x, 1e38f));
        if (prev >= 0.f) {
          const auto mid =
              static_cast<float>(0.5 * (static_cast<double>(prev) + static_cast<double>(x)));
          v.insert(v.end(), {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e38f)});
        }
        prev = x;
      }
    }
    for (std::uint32_t e = 0; e < 256; ++e) {
      for (std::uint32_t t = 0; t < 23; ++t) {
        for (std::uint32_t m : {(1u << t) - 1u, 1u << t, (1u << t) + 1u, 0x7fffffu ^ (1u << t)}) {
          v.push_back(bits_float((e << 23) | (m & 0x7fffffu)));
        }
      }
    }
    std::mt19937 rng(20240611u);
    for (int i = 0; i < (1 << 19); ++i)
      v.push_back(bits_float(static_cast<std::uint32_t>(rng()) & 0x7fffffffu));
    for (float centre : {0x1p-25f, 0x1p-14f, 1.0f, 65520.f, 0x1p-133f, 0x1p-126f, 0x1.FF8p127f,
                         0x1p-10f, 0x1p-6f, 17.f, 464.f, 0x1p-17f, 61440.f}) {
      const std::uint32_t u = float_bits(centre);
      for (std::uint32_t d = 0; d < (1u << 16); ++d) v.push_back(bits_float(u - (1u << 15) + d));
    }
    v.push_back(std::numeric_limits<float>::max());
    v.push_back(std::numeric_limits<float>::infinity());
    for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0x7fa01234u})
      v.push_back(bits_float(nan));
    return v;
  }();
  return xs;
}

TEST(NumericCudaCrosscheck, DecodeOfEveryCodeIsBitIdentical) {
  for (const Pair& p : pairs()) {
    Mismatches m(std::string(p.name) + " decode vs CUDA");
    for (std::uint32_t c = 0; c < p.codes; ++c) {
      m.checked();
      const float ours = p.ours_decode(c), cuda = p.cuda_decode(c);
      const bool ok = p.is_nan_code(c) ? std::isnan(ours) && std::isnan(cuda) &&
                                             std::signbit(ours) == ((c & p.sign_bit) != 0)
                                       : float_bits(ours) == float_bits(cuda);
      if (!ok) m.fail(std::string("code ") + std::to_string(c));
    }
    m.expect_none();
  }
}

TEST(NumericCudaCrosscheck, EncodeMatchesCudaUpToDocumentedSaturation) {
  ASSERT_GT(inputs().size(), 1500000u);
  for (const Pair& p : pairs()) {
    for (Rounding r : p.modes) {
      Mismatches m(std::string(p.name) + " encode vs CUDA");
      std::uint64_t saturated = 0;  // inputs where CUDA gives Inf and kvpack +-max
      for (float x0 : inputs()) {
        for (float x : {x0, -x0}) {
          m.checked();
          const std::uint32_t ours = p.ours(x, r), cuda = p.cuda(x, r);
          const std::uint32_t sign = std::signbit(x) ? p.sign_bit : 0u;
          std::uint32_t want = cuda;
          if (std::isnan(x)) {
            if (!p.is_nan_code(ours) || !p.is_nan_code(cuda) || (ours & p.sign_bit) != sign) {
              m.fail(describe(p.name, x, r, ours, cuda) + " (NaN with the input's sign expected)");
            }
            continue;
          }
          if (std::isfinite(x) && p.inf_mag != 0u && (cuda & ~p.sign_bit) == p.inf_mag) {
            want = sign | p.max_code;  // kvpack: finite input never becomes Inf
            ++saturated;
          }
          if (ours != want) m.fail(describe(p.name, x, r, ours, want));
        }
      }
      m.expect_none();
      // For fp16/bf16 the saturation zone must have been exercised by the inputs (both signs,
      // so in every mode one side rounds away from zero).
      if (p.inf_mag != 0u) {
        EXPECT_GT(saturated, 0u) << p.name << " " << kvpack::test::mode_name(r);
      }
    }
  }
}

}  // namespace
