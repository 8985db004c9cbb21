// The F16C paths of codec/meta.hpp (AVX2 builds: meta_round_up / meta_round_down / store_meta /
// load_meta with MetaF16 use the hardware conversion) against the integer emulation of
// numeric/fp16.hpp that the scalar codecs and the CUDA device code use: bit-identical on every
// fp16 code, on fp16 boundaries +- one fp32 ulp, on subnormals, and on random magnitudes over
// the whole fp16 range, so an AVX2 build writes the same metadata bytes as any other backend.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvpack/codec/meta.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// What meta.hpp computes without F16C.
float emulated_round(double d, bool up) {
  const float f = up ? detail::f32_round_up(d) : detail::f32_round_down(d);
  return fp16_to_float(fp16_from_float(f, up ? Rounding::toward_pos_inf : Rounding::toward_neg_inf));
}

// Values where directed rounding to fp16 can go wrong: every finite fp16 value, its fp32
// neighbours, midpoints, subnormal and overflow edges, and random magnitudes 2^-30 .. 2^16.
std::vector<double> probes() {
  std::vector<double> out;
  for (std::uint32_t h = 0; h < 0x7C00u; ++h) {
    const float f = fp16_to_float(static_cast<std::uint16_t>(h));
    for (const float g : {f, detail::next_up(f), detail::next_down(f)}) {
      out.push_back(g);
      out.push_back(-static_cast<double>(g));
    }
    if (h + 1 < 0x7C00u) out.push_back(0.5 * (static_cast<double>(f) + fp16_to_float(static_cast<std::uint16_t>(h + 1))));
  }
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> expo(-30.0, 16.0), mant(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) out.push_back((i % 2 ? -1.0 : 1.0) * mant(rng) * std::exp2(std::floor(expo(rng))));
  for (const double d : {0.0, -0.0, 65504.0, -65504.0, 65503.99, -65503.99, 0x1p-24, -0x1p-24, 0x1p-25, 0x1p-14})
    out.push_back(d);
  return out;
}

TEST(MetaF16c, DirectedRoundingMatchesTheEmulation) {
  if (!KVPACK_HAS_AVX2) GTEST_SKIP() << "no F16C path in this build: meta.hpp uses the emulation only";
  int checked = 0;
  for (const double d : probes()) {
    if (!(d <= kFp16Max && d >= -kFp16Max)) continue;  // callers clamp to the fp16 range first
    ASSERT_EQ(bits(detail::meta_round_up<MetaF16>(d)), bits(emulated_round(d, true))) << "round up of " << d;
    ASSERT_EQ(bits(detail::meta_round_down<MetaF16>(d)), bits(emulated_round(d, false))) << "round down of " << d;
    ++checked;
  }
  EXPECT_GT(checked, 300000);
}

TEST(MetaF16c, StoreAndLoadMatchTheEmulation) {
  if (!KVPACK_HAS_AVX2) GTEST_SKIP() << "no F16C path in this build: meta.hpp uses the emulation only";
  for (std::uint32_t h = 0; h <= 0xFFFFu; ++h) {  // every code, Inf and NaN included
    std::byte raw[2];
    const auto code = static_cast<std::uint16_t>(h);
    std::memcpy(raw, &code, 2);
    ASSERT_EQ(bits(detail::load_meta<MetaF16>(raw)), bits(fp16_to_float(code))) << "code " << h;
  }
  for (const double d : probes()) {
    const auto f = static_cast<float>(d);
    std::byte raw[2];
    detail::store_meta<MetaF16>(f, raw);
    std::uint16_t got;
    std::memcpy(&got, raw, 2);
    ASSERT_EQ(got, fp16_from_float(f)) << "store of " << f;
  }
  for (const float f : {70000.f, -70000.f, 1e30f, -1e30f}) {  // beyond fp16: saturates, as the emulation
    std::byte raw[2];
    detail::store_meta<MetaF16>(f, raw);
    std::uint16_t got;
    std::memcpy(&got, raw, 2);
    EXPECT_EQ(got, fp16_from_float(f)) << f;
  }
}

}  // namespace
