// IEEE binary16 conversions (include/kvpack/numeric/fp16.hpp) against the float64 reference:
// every code, every midpoint, directed rounding for scale metadata (CASES C1), saturation,
// subnormals, a sweep over every fp32 exponent, and exhaustive windows of consecutive floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kvpack/numeric.hpp"
#include "support/minifloat_checks.hpp"
#include "support/minifloat_ref.hpp"

namespace {

using kvpack::Rounding;
using kvpack::test::bits_float;
using kvpack::test::float_bits;

const kvpack::test::Codec& fp16_codec() {
  static const kvpack::test::Codec c{
      "fp16",
      kvpack::test::fp16_ref(),
      [](float x, Rounding r) -> std::uint32_t { return kvpack::fp16_from_float(x, r); },
      [](std::uint32_t code) { return kvpack::fp16_to_float(static_cast<std::uint16_t>(code)); },
      {Rounding::nearest_even, Rounding::toward_pos_inf, Rounding::toward_neg_inf}};
  return c;
}

// Constant evaluation gives the same answers (the functions are constexpr).
static_assert(kvpack::fp16_from_float(1.0f) == 0x3C00);
static_assert(kvpack::fp16_from_float(-2.0f) == 0xC000);
static_assert(kvpack::fp16_from_float(65504.f) == 0x7BFF);
static_assert(kvpack::fp16_from_float(4367.2f, Rounding::toward_pos_inf) == 0x6C44);
static_assert(kvpack::fp16_to_float(0x0001) == 0x1p-24f);
static_assert(kvpack::fp16_to_float(0x7BFF) == kvpack::kFp16Max);

TEST(NumericFp16, FormatConstants) {
  EXPECT_EQ(kvpack::kFp16Max, 65504.f);
  EXPECT_EQ(kvpack::fp16_from_float(kvpack::kFp16Max), 0x7BFF);
  EXPECT_EQ(kvpack::fp16_from_float(kvpack::kFp16MinNormal), 0x0400);
  EXPECT_EQ(kvpack::fp16_from_float(kvpack::kFp16MinSubnormal), 0x0001);
  EXPECT_EQ(kvpack::fp16_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(kvpack::fp16_to_float(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(kvpack::fp16_to_float(0x8000)));
  EXPECT_EQ(kvpack::fp16_to_float(0x8000), 0.0f);
}

TEST(NumericFp16, DecodeEveryCodeMatchesBitFieldTable) {
  kvpack::test::check_decode_all(fp16_codec());
}

TEST(NumericFp16, EncodeOfDecodeIsIdentityForEveryNonNanCode) {
  kvpack::test::check_roundtrip_all(fp16_codec());
}

TEST(NumericFp16, EveryMidpointTiesToEvenAndDirectedModesBracket) {
  // 0x7BFF positive magnitude codes above zero, so 0x7BFF midpoints per sign.
  EXPECT_EQ(kvpack::test::check_midpoints_all(fp16_codec()), 2u * 0x7BFFu);
}

TEST(NumericFp16, FiniteSaturatesInfStaysInfNanStaysQuietNan) {
  kvpack::test::check_specials(fp16_codec());
  // Literal policy: IEEE would give Inf from 65520 up; kvpack saturates.
  EXPECT_EQ(kvpack::fp16_from_float(65519.f), 0x7BFF);
  EXPECT_EQ(kvpack::fp16_from_float(65520.f), 0x7BFF);
  EXPECT_EQ(kvpack::fp16_from_float(-1e30f), 0xFBFF);
  EXPECT_EQ(kvpack::fp16_from_float(1e6f, Rounding::toward_pos_inf), 0x7BFF);
  EXPECT_EQ(kvpack::fp16_from_float(-1e6f, Rounding::toward_neg_inf), 0xFBFF);
  const float inf = std::numeric_limits<float>::infinity();
  for (Rounding r : {Rounding::nearest_even, Rounding::toward_pos_inf, Rounding::toward_neg_inf}) {
    EXPECT_EQ(kvpack::fp16_from_float(inf, r), 0x7C00);
    EXPECT_EQ(kvpack::fp16_from_float(-inf, r), 0xFC00);
  }
  // NaN: quiet bit set, top payload bits kept, sign kept (as x86 F16C does).
  EXPECT_EQ(kvpack::fp16_from_float(bits_float(0x7fc00000u)), 0x7E00);
  EXPECT_EQ(kvpack::fp16_from_float(bits_float(0x7f800001u)), 0x7E00);  // signalling -> quiet
  EXPECT_EQ(kvpack::fp16_from_float(bits_float(0x7fa02000u)), 0x7F01);
  EXPECT_EQ(kvpack::fp16_from_float(bits_float(0xffc00000u)), 0xFE00);
  EXPECT_TRUE(std::isnan(kvpack::fp16_to_float(0x7C01)));
  EXPECT_EQ(float_bits(kvpack::fp16_to_float(0x7C01)), 0x7fc02000u);  // quieted, payload kept
  EXPECT_EQ(float_bits(kvpack::fp16_to_float(0xFE00)), 0xffc00000u);
}

TEST(NumericFp16, SubnormalsAreProducedAndDecodedNotFlushed) {
  EXPECT_EQ(kvpack::fp16_from_float(0x1p-24f), 0x0001);
  EXPECT_EQ(kvpack::fp16_from_float(0x1p-25f), 0x0000);                       // tie -> even 0
  EXPECT_EQ(kvpack::fp16_from_float(std::nextafter(0x1p-25f, 1.f)), 0x0001);  // above the tie
  EXPECT_EQ(kvpack::fp16_from_float(0x1.8p-24f), 0x0002);                     // tie 1.5 -> 2
  EXPECT_EQ(kvpack::fp16_from_float(0x1.4p-23f), 0x0002);                     // tie 2.5 -> 2
  EXPECT_EQ(kvpack::fp16_from_float(-0x1.8p-24f), 0x8002);
  EXPECT_EQ(kvpack::fp16_from_float(0x1p-14f - 0x1p-24f), 0x03FF);  // largest subnormal
  EXPECT_EQ(kvpack::fp16_from_float(0x1p-14f - 0x1p-25f), 0x0400);  // tie -> even normal
  EXPECT_EQ(kvpack::fp16_to_float(0x03FF), 0x1p-14f - 0x1p-24f);
  EXPECT_EQ(kvpack::fp16_to_float(0x8001), -0x1p-24f);
  // fp32 subnormals: zero under nearest, the smallest subnormal away from zero when directed.
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(kvpack::fp16_from_float(tiny), 0x0000);
  EXPECT_EQ(kvpack::fp16_from_float(-tiny), 0x8000);
  EXPECT_EQ(kvpack::fp16_from_float(tiny, Rounding::toward_pos_inf), 0x0001);
  EXPECT_EQ(kvpack::fp16_from_float(tiny, Rounding::toward_neg_inf), 0x0000);
  EXPECT_EQ(kvpack::fp16_from_float(-tiny, Rounding::toward_neg_inf), 0x8001);
  EXPECT_EQ(kvpack::fp16_from_float(-tiny, Rounding::toward_pos_inf), 0x8000);
  EXPECT_EQ(kvpack::fp16_from_float(1e-30f, Rounding::toward_pos_inf), 0x0001);
}

// CASES C1: fp16 scale metadata is rounded in a known direction, exactly.
TEST(NumericFp16, DirectedRoundingForScaleMetadata) {
  // fp16 spacing in [4096, 8192) is 4: 4367.2 lies between 4364 (0x6C43) and 4368 (0x6C44).
  EXPECT_EQ(kvpack::fp16_from_float(4367.2f, Rounding::toward_pos_inf), 0x6C44);
  EXPECT_EQ(kvpack::fp16_to_float(0x6C44), 4368.f);
  EXPECT_EQ(kvpack::fp16_from_float(4367.2f, Rounding::toward_neg_inf), 0x6C43);
  EXPECT_EQ(kvpack::fp16_to_float(0x6C43), 4364.f);
  EXPECT_EQ(kvpack::fp16_from_float(4367.2f), 0x6C44);
  EXPECT_EQ(kvpack::fp16_from_float(-4367.2f, Rounding::toward_pos_inf), 0xEC43);
  EXPECT_EQ(kvpack::fp16_from_float(-4367.2f, Rounding::toward_neg_inf), 0xEC44);
  // Exact values stay put in every mode; the smallest step above 1 is 2^-10.
  EXPECT_EQ(kvpack::fp16_from_float(4368.f, Rounding::toward_pos_inf), 0x6C44);
  EXPECT_EQ(kvpack::fp16_from_float(std::nextafter(1.f, 2.f), Rounding::toward_pos_inf), 0x3C01);
  EXPECT_EQ(kvpack::fp16_from_float(std::nextafter(1.f, 0.f), Rounding::toward_neg_inf), 0x3BFF);
  // Bracketing on random values in range: down <= x <= up, and they are adjacent codes
  // (or equal when x is exact).
  std::uint64_t n = 0;
  for (std::uint32_t i = 0; i < 20000; ++i) {
    const float x =
        std::ldexp(1.0f + static_cast<float>(i) / 20000.f, static_cast<int>(i % 40) - 24);
    const float up = kvpack::fp16_to_float(kvpack::fp16_from_float(x, Rounding::toward_pos_inf));
    const float dn = kvpack::fp16_to_float(kvpack::fp16_from_float(x, Rounding::toward_neg_inf));
    if (x > kvpack::kFp16Max) continue;
    ASSERT_LE(dn, x) << x;
    ASSERT_GE(up, x) << x;
    const std::uint16_t cu = kvpack::fp16_from_float(up), cd = kvpack::fp16_from_float(dn);
    ASSERT_EQ(cu - cd, up == dn ? 0 : 1) << x;
    ++n;
  }
  EXPECT_GT(n, 19000u);
}

TEST(NumericFp16, SweepOverEveryFp32ExponentAndRandomInputs) {
  EXPECT_GT(kvpack::test::check_sweep(fp16_codec(), 1u << 17, 1601u), 500000u);
}

// 2^20 consecutive floats around: the smallest subnormal and half of it, the largest
// subnormal / smallest normal, 1, and the top of the range (65504 .. 65520 and beyond).
TEST(NumericFp16, ExhaustiveWindowsOfConsecutiveFloats) {
  EXPECT_GE(
      kvpack::test::check_windows(fp16_codec(), {0x1p-25f, 0x1p-24f, 0x1p-14f, 1.0f, 65520.f}),
      5u << 21);
}

}  // namespace
