// bfloat16 conversions (include/kvpack/numeric/bf16.hpp) against the float64 reference:
// every code, every midpoint, directed rounding, saturation (no Inf from finite input),
// fp32 subnormals, a sweep over every fp32 exponent, and exhaustive windows of floats.
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

const kvpack::test::Codec& bf16_codec() {
  static const kvpack::test::Codec c{
      "bf16",
      kvpack::test::bf16_ref(),
      [](float x, Rounding r) -> std::uint32_t { return kvpack::bf16_from_float(x, r); },
      [](std::uint32_t code) { return kvpack::bf16_to_float(static_cast<std::uint16_t>(code)); },
      {Rounding::nearest_even, Rounding::toward_pos_inf, Rounding::toward_neg_inf}};
  return c;
}

static_assert(kvpack::bf16_from_float(1.0f) == 0x3F80);
static_assert(kvpack::bf16_from_float(3.14159265f) == 0x4049);  // 3.140625
static_assert(kvpack::bf16_from_float(3.14159265f, Rounding::toward_pos_inf) == 0x404A);
static_assert(kvpack::bf16_to_float(0x7F7F) == kvpack::kBf16Max);
static_assert(kvpack::bf16_to_float(0x0001) == 0x1p-133f);

TEST(NumericBf16, FormatConstants) {
  EXPECT_EQ(kvpack::kBf16Max, static_cast<float>(std::ldexp(255.0, 120)));
  EXPECT_EQ(kvpack::bf16_from_float(kvpack::kBf16Max), 0x7F7F);
  EXPECT_EQ(kvpack::bf16_from_float(kvpack::kBf16MinNormal), 0x0080);
  EXPECT_EQ(kvpack::bf16_from_float(kvpack::kBf16MinSubnormal), 0x0001);
  EXPECT_EQ(kvpack::bf16_to_float(0xFF80), -std::numeric_limits<float>::infinity());
}

TEST(NumericBf16, DecodeEveryCodeMatchesBitFieldTable) {
  kvpack::test::check_decode_all(bf16_codec());
  // Decoding is exact widening: NaN codes keep payload and quiet/signalling bit.
  EXPECT_EQ(float_bits(kvpack::bf16_to_float(0x7F81)), 0x7F810000u);
  EXPECT_EQ(float_bits(kvpack::bf16_to_float(0xFFC0)), 0xFFC00000u);
}

TEST(NumericBf16, EncodeOfDecodeIsIdentityForEveryNonNanCode) {
  kvpack::test::check_roundtrip_all(bf16_codec());
}

TEST(NumericBf16, EveryMidpointTiesToEvenAndDirectedModesBracket) {
  EXPECT_EQ(kvpack::test::check_midpoints_all(bf16_codec()), 2u * 0x7F7Fu);
}

TEST(NumericBf16, FiniteSaturatesInfStaysInfNanStaysQuietNan) {
  kvpack::test::check_specials(bf16_codec());
  // IEEE-style rounding would give Inf from 0x1.FF8p127 up (the tie goes to the "even" Inf).
  EXPECT_EQ(kvpack::bf16_from_float(0x1.FF8p127f), 0x7F7F);
  EXPECT_EQ(kvpack::bf16_from_float(std::numeric_limits<float>::max()), 0x7F7F);
  EXPECT_EQ(kvpack::bf16_from_float(-std::numeric_limits<float>::max()), 0xFF7F);
  EXPECT_EQ(kvpack::bf16_from_float(0x1.FF8p127f, Rounding::toward_pos_inf), 0x7F7F);
  const float inf = std::numeric_limits<float>::infinity();
  for (Rounding r : {Rounding::nearest_even, Rounding::toward_pos_inf, Rounding::toward_neg_inf}) {
    EXPECT_EQ(kvpack::bf16_from_float(inf, r), 0x7F80);
    EXPECT_EQ(kvpack::bf16_from_float(-inf, r), 0xFF80);
  }
  EXPECT_EQ(kvpack::bf16_from_float(bits_float(0x7fc00000u)), 0x7FC0);
  EXPECT_EQ(kvpack::bf16_from_float(bits_float(0x7f800001u)), 0x7FC0);  // signalling -> quiet
  EXPECT_EQ(kvpack::bf16_from_float(bits_float(0x7f810000u)), 0x7FC1);  // payload kept
  EXPECT_EQ(kvpack::bf16_from_float(bits_float(0xffffffffu)), 0xFFFF);
}

TEST(NumericBf16, Fp32SubnormalsGiveBf16Subnormals) {
  EXPECT_EQ(kvpack::bf16_from_float(0x1p-133f), 0x0001);
  EXPECT_EQ(kvpack::bf16_from_float(0x1p-134f), 0x0000);     // tie -> even 0
  EXPECT_EQ(kvpack::bf16_from_float(0x1.8p-133f), 0x0002);   // tie 1.5 -> 2
  EXPECT_EQ(kvpack::bf16_from_float(-0x1.4p-132f), 0x8002);  // tie 2.5 -> 2
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(kvpack::bf16_from_float(tiny), 0x0000);
  EXPECT_EQ(kvpack::bf16_from_float(tiny, Rounding::toward_pos_inf), 0x0001);
  EXPECT_EQ(kvpack::bf16_from_float(-tiny, Rounding::toward_neg_inf), 0x8001);
  EXPECT_EQ(kvpack::bf16_from_float(0x1p-126f - 0x1p-134f), 0x0080);  // tie -> even normal
  EXPECT_EQ(kvpack::bf16_to_float(0x007F), 0x1p-126f - 0x1p-133f);
}

TEST(NumericBf16, DirectedRoundingBracketsExactly) {
  EXPECT_EQ(kvpack::bf16_from_float(std::nextafter(1.f, 2.f), Rounding::toward_pos_inf), 0x3F81);
  EXPECT_EQ(kvpack::bf16_from_float(std::nextafter(1.f, 2.f), Rounding::toward_neg_inf), 0x3F80);
  EXPECT_EQ(kvpack::bf16_from_float(-std::nextafter(1.f, 2.f), Rounding::toward_neg_inf), 0xBF81);
  EXPECT_EQ(kvpack::bf16_from_float(-std::nextafter(1.f, 2.f), Rounding::toward_pos_inf), 0xBF80);
  EXPECT_EQ(kvpack::bf16_from_float(4367.2f, Rounding::toward_pos_inf), 0x4589);  // 4384
  EXPECT_EQ(kvpack::bf16_from_float(4367.2f, Rounding::toward_neg_inf), 0x4588);  // 4352
}

TEST(NumericBf16, SweepOverEveryFp32ExponentAndRandomInputs) {
  EXPECT_GT(kvpack::test::check_sweep(bf16_codec(), 1u << 17, 1602u), 500000u);
}

// 2^20 consecutive floats around: the fp32 subnormal/normal border, the smallest bf16
// subnormal, 1, and the top of the range (kBf16Max .. FLT_MAX).
TEST(NumericBf16, ExhaustiveWindowsOfConsecutiveFloats) {
  EXPECT_GE(kvpack::test::check_windows(bf16_codec(), {0x1p-126f, 0x1p-133f, 1.0f, 0x1.FF8p127f}),
            4u << 20);
}

}  // namespace
