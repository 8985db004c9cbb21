// OCP FP8 conversions (include/kvpack/numeric/fp8.hpp), E4M3FN and E5M2, against the float64
// reference: CASES C3 literally, every code, every midpoint, saturation (finite never NaN,
// never Inf), NaN codes, per-group scaling, a sweep over every fp32 exponent, and exhaustive
// windows of consecutive floats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvpack/numeric.hpp"
#include "support/minifloat_checks.hpp"
#include "support/minifloat_ref.hpp"

namespace {

using kvpack::Rounding;
using kvpack::test::bits_float;
using kvpack::test::float_bits;

const kvpack::test::Codec& e4m3_codec() {
  static const kvpack::test::Codec c{
      "e4m3",
      kvpack::test::e4m3_ref(),
      [](float x, Rounding) -> std::uint32_t { return kvpack::e4m3_from_float(x); },
      [](std::uint32_t code) { return kvpack::e4m3_to_float(static_cast<std::uint8_t>(code)); },
      {Rounding::nearest_even}};
  return c;
}

const kvpack::test::Codec& e5m2_codec() {
  static const kvpack::test::Codec c{
      "e5m2",
      kvpack::test::e5m2_ref(),
      [](float x, Rounding) -> std::uint32_t { return kvpack::e5m2_from_float(x); },
      [](std::uint32_t code) { return kvpack::e5m2_to_float(static_cast<std::uint8_t>(code)); },
      {Rounding::nearest_even}};
  return c;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// CASES C3, at compile time as well.
static_assert(kvpack::e4m3_from_float(17.f) == 0x58);
static_assert(kvpack::e4m3_from_float(19.f) == 0x5A);
static_assert(kvpack::e4m3_from_float(288.f) == 0x79);
static_assert(kvpack::e4m3_from_float(464.f) == 0x7E);
static_assert(kvpack::e4m3_to_float(0x7E) == kvpack::kE4M3Max);
static_assert(kvpack::e5m2_to_float(0x7B) == kvpack::kE5M2Max);

// ---------------------------------------------------------------------------- E4M3FN

TEST(NumericE4M3, CasesC3TiesToEven) {
  EXPECT_EQ(kvpack::e4m3_from_float(17.f), 0x58);  // 17 -> 16
  EXPECT_EQ(kvpack::e4m3_to_float(0x58), 16.f);
  EXPECT_EQ(kvpack::e4m3_from_float(19.f), 0x5A);  // 19 -> 20
  EXPECT_EQ(kvpack::e4m3_to_float(0x5A), 20.f);
  EXPECT_EQ(kvpack::e4m3_from_float(1.5f * 0x1p-9f), 0x02);  // 1.5 * 2^-9 -> 2^-8
  EXPECT_EQ(kvpack::e4m3_to_float(0x02), 0x1p-8f);
  EXPECT_EQ(kvpack::e4m3_from_float(-17.f), 0xD8);
  EXPECT_EQ(kvpack::e4m3_from_float(-19.f), 0xDA);
  EXPECT_EQ(kvpack::e4m3_from_float(0.5f * 0x1p-9f), 0x00);  // half the smallest subnormal -> 0
  EXPECT_EQ(kvpack::e4m3_from_float(-0.5f * 0x1p-9f), 0x80);
}

TEST(NumericE4M3, CasesC3ExactAndSaturating) {
  EXPECT_EQ(kvpack::e4m3_from_float(288.f), 0x79);
  EXPECT_EQ(kvpack::e4m3_to_float(0x79), 288.f);
  EXPECT_EQ(kvpack::e4m3_from_float(448.f), 0x7E);
  EXPECT_EQ(kvpack::e4m3_from_float(464.f), 0x7E);  // tie between 448 and (NaN slot) 480
  for (float x : {465.f, 480.f, 1e10f, std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(kvpack::e4m3_from_float(x), 0x7E) << x;
    EXPECT_EQ(kvpack::e4m3_from_float(-x), 0xFE) << -x;
    EXPECT_EQ(kvpack::e4m3_to_float(kvpack::e4m3_from_float(-x)), -448.f);
  }
  EXPECT_EQ(kvpack::e4m3_from_float(bits_float(0x7fc00000u)), 0x7F);
  EXPECT_EQ(kvpack::e4m3_from_float(bits_float(0x7f800001u)), 0x7F);
  EXPECT_EQ(kvpack::e4m3_from_float(bits_float(0xffc00000u)), 0xFF);
}

TEST(NumericE4M3, FiniteInputNeverEncodesToNan) {
  // Every fp32 exponent field with assorted mantissas, both signs, plus random patterns.
  std::uint64_t n = 0;
  std::mt19937 rng(3);
  for (std::uint32_t e = 0; e < 255; ++e) {
    for (std::uint32_t i = 0; i < 512; ++i) {
      const std::uint32_t man = i < 2 ? (i == 0 ? 0u : 0x7fffffu) : rng() & 0x7fffffu;
      for (std::uint32_t s : {0u, 0x80000000u}) {
        const std::uint8_t code = kvpack::e4m3_from_float(bits_float(s | (e << 23) | man));
        ASSERT_NE(code & 0x7F, 0x7F) << std::hex << (s | (e << 23) | man);
        ++n;
      }
    }
  }
  EXPECT_EQ(n, 255u * 512u * 2u);
}

TEST(NumericE4M3, DecodeEveryCodeMatchesBitFieldTable) {
  kvpack::test::check_decode_all(e4m3_codec());
  // Spot values from the OCP spec's table.
  EXPECT_EQ(kvpack::e4m3_to_float(0x01), 0x1p-9f);    // min subnormal
  EXPECT_EQ(kvpack::e4m3_to_float(0x07), 0x1.Cp-7f);  // max subnormal 0.875 * 2^-6
  EXPECT_EQ(kvpack::e4m3_to_float(0x08), 0x1p-6f);    // min normal
  EXPECT_EQ(kvpack::e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(kvpack::e4m3_to_float(0x78), 256.f);  // exponent 1111 holds normals in E4M3FN
  EXPECT_EQ(kvpack::e4m3_to_float(0xFE), -448.f);
  EXPECT_TRUE(std::isnan(kvpack::e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(kvpack::e4m3_to_float(0xFF)));
  EXPECT_TRUE(std::signbit(kvpack::e4m3_to_float(0xFF)));
  EXPECT_TRUE(std::signbit(kvpack::e4m3_to_float(0x80)));
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c)
    nan_codes += std::isnan(kvpack::e4m3_to_float(static_cast<std::uint8_t>(c)));
  EXPECT_EQ(nan_codes, 2);
}

TEST(NumericE4M3, EncodeOfDecodeIsIdentityForEveryNonNanCode) {
  kvpack::test::check_roundtrip_all(e4m3_codec());
}

TEST(NumericE4M3, EveryMidpointTiesToEven) {
  EXPECT_EQ(kvpack::test::check_midpoints_all(e4m3_codec()), 2u * 0x7Eu);
}

TEST(NumericE4M3, SaturationInfAndNan) { kvpack::test::check_specials(e4m3_codec()); }

TEST(NumericE4M3, SweepOverEveryFp32ExponentAndRandomInputs) {
  EXPECT_GT(kvpack::test::check_sweep(e4m3_codec(), 1u << 17, 8431u), 500000u);
}

// 2^20 consecutive floats around: 2^-10 (half the smallest subnormal), the subnormal/normal
// border, 1, 17 and 19 (C3 ties) and 464 (the saturation tie).
TEST(NumericE4M3, ExhaustiveWindowsOfConsecutiveFloats) {
  EXPECT_GE(kvpack::test::check_windows(e4m3_codec(), {0x1p-10f, 0x1p-6f, 1.0f, 17.f, 19.f, 464.f}),
            6u << 21);
}

// ---------------------------------------------------------------------------- E5M2

TEST(NumericE5M2, TiesToEvenAndSubnormals) {
  // [1, 2) has steps of 0.25: 1.0 = 0x3C, 1.25 = 0x3D, 1.5 = 0x3E.
  EXPECT_EQ(kvpack::e5m2_from_float(1.125f), 0x3C);
  EXPECT_EQ(kvpack::e5m2_from_float(1.375f), 0x3E);
  EXPECT_EQ(kvpack::e5m2_from_float(std::nextafter(1.125f, 2.f)), 0x3D);
  // [16, 32) has steps of 4: 17 -> 16, 18 -> 16 (tie), 22 -> 24 (tie), 19 -> 20.
  EXPECT_EQ(kvpack::e5m2_from_float(17.f), 0x4C);
  EXPECT_EQ(kvpack::e5m2_from_float(18.f), 0x4C);
  EXPECT_EQ(kvpack::e5m2_from_float(22.f), 0x4E);
  EXPECT_EQ(kvpack::e5m2_from_float(19.f), 0x4D);
  EXPECT_EQ(kvpack::e5m2_to_float(0x4D), 20.f);
  EXPECT_EQ(kvpack::e5m2_from_float(1.5f * 0x1p-16f), 0x02);  // 1.5 * 2^-16 -> 2^-15
  EXPECT_EQ(kvpack::e5m2_from_float(0x1p-17f), 0x00);         // half the min subnormal -> 0
  EXPECT_EQ(kvpack::e5m2_from_float(-0x1p-17f), 0x80);
  EXPECT_EQ(kvpack::e5m2_from_float(std::nextafter(0x1p-17f, 1.f)), 0x01);
  // Tie between the largest subnormal 0.75 * 2^-14 (0x03) and the smallest normal 2^-14 (0x04).
  EXPECT_EQ(kvpack::e5m2_from_float(0x1.Cp-15f), 0x04);
  EXPECT_EQ(kvpack::e5m2_from_float(std::nextafter(0x1.Cp-15f, 0.f)), 0x03);
}

TEST(NumericE5M2, SaturatesFiniteAndInfNanStaysNan) {
  EXPECT_EQ(kvpack::e5m2_from_float(57344.f), 0x7B);
  EXPECT_EQ(kvpack::e5m2_from_float(61440.f), 0x7B);  // tie between 57344 and (Inf slot) 65536
  for (float x : {61441.f, 65536.f, 1e10f, std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(kvpack::e5m2_from_float(x), 0x7B) << x;
    EXPECT_EQ(kvpack::e5m2_from_float(-x), 0xFB) << -x;
  }
  EXPECT_EQ(kvpack::e5m2_from_float(bits_float(0x7fc00000u)), 0x7F);
  EXPECT_EQ(kvpack::e5m2_from_float(bits_float(0x7f800001u)), 0x7F);
  EXPECT_EQ(kvpack::e5m2_from_float(bits_float(0xffffffffu)), 0xFF);
  kvpack::test::check_specials(e5m2_codec());
}

TEST(NumericE5M2, DecodeEveryCodeMatchesBitFieldTable) {
  kvpack::test::check_decode_all(e5m2_codec());
  EXPECT_EQ(kvpack::e5m2_to_float(0x01), 0x1p-16f);
  EXPECT_EQ(kvpack::e5m2_to_float(0x03), 0x1.8p-15f);  // max subnormal 0.75 * 2^-14
  EXPECT_EQ(kvpack::e5m2_to_float(0x04), 0x1p-14f);
  EXPECT_EQ(kvpack::e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(kvpack::e5m2_to_float(0x7C), kInf);
  EXPECT_EQ(kvpack::e5m2_to_float(0xFC), -kInf);
  for (std::uint8_t c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) {
    EXPECT_TRUE(std::isnan(kvpack::e5m2_to_float(c))) << int{c};
    EXPECT_EQ(std::signbit(kvpack::e5m2_to_float(c)), c >= 0x80) << int{c};
  }
}

TEST(NumericE5M2, EncodeOfDecodeIsIdentityForEveryFiniteCode) {
  // Inf codes are the documented exception: Inf saturates to +-57344.
  kvpack::test::check_roundtrip_all(e5m2_codec());
  EXPECT_EQ(kvpack::e5m2_from_float(kvpack::e5m2_to_float(0x7C)), 0x7B);
  EXPECT_EQ(kvpack::e5m2_from_float(kvpack::e5m2_to_float(0xFC)), 0xFB);
}

TEST(NumericE5M2, EveryMidpointTiesToEven) {
  EXPECT_EQ(kvpack::test::check_midpoints_all(e5m2_codec()), 2u * 0x7Bu);
}

TEST(NumericE5M2, SweepOverEveryFp32ExponentAndRandomInputs) {
  EXPECT_GT(kvpack::test::check_sweep(e5m2_codec(), 1u << 17, 5231u), 500000u);
}

TEST(NumericE5M2, ExhaustiveWindowsOfConsecutiveFloats) {
  EXPECT_GE(kvpack::test::check_windows(e5m2_codec(), {0x1p-17f, 0x1p-14f, 1.0f, 61440.f}),
            4u << 21);
}

// ---------------------------------------------------------------------------- per-group scale

// CASES C3: per-group scale s = amax / max divides on encode and multiplies on decode.
// Returns the worst error relative to max(|x|, s * min_normal) over the group; every
// reconstruction must be finite. The bound of RNE with m mantissa bits is 2^-(m+1)
// relative in the normal range, and half the smallest subnormal (s * 2^-(m+1) *
// min_normal) below it, so relative to max(|x|, s * min_normal) it is 2^-(m+1) overall.
template <class Enc, class Dec>
double group_roundtrip_error(const std::vector<float>& x, float fmt_max, float min_normal, Enc enc,
                             Dec dec) {
  float amax = 0.f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float s = amax / fmt_max;
  double worst = 0.0;
  for (float v : x) {
    const float back = dec(enc(v / s)) * s;
    EXPECT_TRUE(std::isfinite(back)) << v;
    const double denom = std::max(std::fabs(static_cast<double>(v)),
                                  static_cast<double>(s) * static_cast<double>(min_normal));
    worst = std::max(worst, std::fabs(static_cast<double>(back) - static_cast<double>(v)) / denom);
  }
  return worst;
}

std::vector<std::vector<float>> scale_groups() {
  std::vector<std::vector<float>> groups;
  for (std::size_t n :
       {std::size_t{1}, std::size_t{31}, std::size_t{32}, std::size_t{33}, std::size_t{95}}) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) {  // amax exactly 1e5, magnitudes down to 1e5 * 2^-8
      const double mag = 1e5 * std::exp2(-8.0 * static_cast<double>(i) / static_cast<double>(n));
      g[i] = static_cast<float>(i % 2 == 0 ? mag : -mag);
    }
    groups.push_back(g);
  }
  std::vector<float> c1(32);  // CASES C1's outlier group: -125000, then -1 .. 4
  c1[0] = -125000.f;
  for (int i = 1; i < 32; ++i)
    c1[static_cast<std::size_t>(i)] = -1.f + 5.f * static_cast<float>(i - 1) / 30.f;
  groups.push_back(c1);
  return groups;
}

TEST(NumericFp8Scaling, E4M3GroupWithAmax1e5ReconstructsWithin2PowMinus4) {
  for (const auto& g : scale_groups()) {
    const double err = group_roundtrip_error(
        g, kvpack::kE4M3Max, 0x1p-6f, [](float v) { return kvpack::e4m3_from_float(v); },
        [](std::uint8_t c) { return kvpack::e4m3_to_float(c); });
    EXPECT_LE(err, 0x1p-4) << "group of " << g.size();
    if (g.size() > 1) {  // a group of one is its own amax: exact by construction
      EXPECT_GT(err, 0.0) << "group of " << g.size() << ": inputs are all exactly representable";
    } else {
      EXPECT_EQ(err, 0.0);
    }
  }
}

TEST(NumericFp8Scaling, E5M2GroupWithAmax1e5ReconstructsWithin2PowMinus3) {
  for (const auto& g : scale_groups()) {
    const double err = group_roundtrip_error(
        g, kvpack::kE5M2Max, 0x1p-14f, [](float v) { return kvpack::e5m2_from_float(v); },
        [](std::uint8_t c) { return kvpack::e5m2_to_float(c); });
    EXPECT_LE(err, 0x1p-3) << "group of " << g.size();
  }
}

}  // namespace
