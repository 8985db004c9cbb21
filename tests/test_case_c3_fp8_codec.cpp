// CASES C3, codec level: the FP8 codecs' per-group scale.
//
// (The per-format items -- all 256 codes, ties, saturation of the bare conversions -- live in
// tests/test_numeric_fp8.cpp. Here the conversions are used only through the codecs.)
//
//  * s = amax / format_max, rounded UP to the metadata grid (float64 reference);
//  * encode DIVIDES by s: code == RNE_fp8(x / s), checked against a float64 encoder, and on
//    inputs x = m * s where m is an exact midpoint between two FP8 values -- a division returns m
//    exactly and the tie goes to the even code, whereas multiplying by a rounded 1/s misses the
//    tie for some scales;
//  * decode MULTIPLIES: x̂ == fl(value(code) * s) for every finite code;
//  * a group with amax 1e5 (beyond the fp16 range) reconstructs finite with relative error
//    <= 2^-4 (E4M3) / 2^-3 (E5M2) wherever x / s is in the format's normal range, for fp16 and
//    fp32 metadata, per-token rows and per-channel groups.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/rows.hpp"
#include "support/codec_bounds.hpp"

namespace test_case_c3_fp8_codec {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file
namespace ref = kvpack::codec_ref;

template <class C>
class C3Fp8Codec : public ::testing::Test {};
using Fp8Codecs = ::testing::Types<Fp8E4M3<MetaF16>, Fp8E4M3<MetaF32>, Fp8E5M2<MetaF16>, Fp8E5M2<MetaF32>>;
struct Names {
  template <class C>
  static std::string GetName(int) {
    return ref::codec_name<C>();
  }
};
TYPED_TEST_SUITE(C3Fp8Codec, Fp8Codecs, Names);

/// True for the codes a finite input may produce (not NaN, not E5M2's Inf).
template <class C>
bool finite_code(unsigned c) {
  constexpr ref::Fp8Ref f = ref::fp8_ref<C>();
  return (c & 0x7Fu) <= f.max_code();
}

TYPED_TEST(C3Fp8Codec, ScaleIsAmaxOverFormatMaxRoundedUp) {
  using C = TypeParam;
  constexpr ref::Fp8Ref f = ref::fp8_ref<C>();
  constexpr ref::Grid g = ref::meta_grid<C>();
  std::mt19937_64 rng(3);
  std::normal_distribution<double> nd;
  for (double mag : {1e-3, 0.37, 1.0, 37.0, 1e4}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> x(32);
      for (float& v : x) v = static_cast<float>(mag * nd(rng));
      const ref::Range r = ref::range_of(x.data(), 1, 32);
      const GroupParams p = C::derive(x.data(), 1, 32);
      EXPECT_EQ(p.scale, static_cast<float>(ref::round_up(g, r.amax() / f.max()))) << "amax " << r.amax();
      EXPECT_GE(static_cast<double>(p.scale) * f.max(), r.amax());  // no element saturates
      EXPECT_EQ(p.zero, 0.f);
    }
  }
  // The documented special groups: all zero -> scale 1; constant v -> scale |v| (decodes exactly).
  std::vector<float> z(32, 0.f);
  EXPECT_EQ(C::derive(z.data(), 1, 32).scale, 1.f);
  std::vector<float> c(32, -3.5f);
  EXPECT_EQ(C::derive(c.data(), 1, 32).scale, 3.5f);
}

TYPED_TEST(C3Fp8Codec, EncodeDividesDecodeMultipliesRandomGroups) {
  using C = TypeParam;
  constexpr ref::Fp8Ref f = ref::fp8_ref<C>();
  std::mt19937_64 rng(4);
  std::normal_distribution<double> nd;
  std::student_t_distribution<double> td(3.0);
  long checked = 0, ambiguous = 0;
  for (double mag : {1e-2, 1.0, 300.0}) {
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<float> x(64);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(mag * (i % 2 ? nd(rng) : td(rng)));
      std::vector<std::byte> codes(64), meta(row_meta_bytes<C>(64));
      encode_row<C>(x.data(), 64, codes.data(), meta.data());
      std::vector<float> xh(64);
      decode_row<C>(codes.data(), meta.data(), 64, xh.data());
      for (int i = 0; i < 64; ++i) {
        const double s = C::load_params(meta.data() + (i / 32) * C::meta_bytes_per_group).scale;
        const unsigned code = C::load_code(codes.data(), static_cast<std::size_t>(i));
        const double t = static_cast<double>(x[static_cast<std::size_t>(i)]) / s;
        // The library divides in fp32 (one rounding of t, <= 2^-24 relative) before rounding to
        // FP8; where that can move t across an FP8 tie, either neighbour is correct.
        const unsigned lo = f.encode(t * (1 - 0x1p-22)), hi = f.encode(t * (1 + 0x1p-22));
        if (lo == hi) {
          EXPECT_EQ(code, lo) << "x " << x[static_cast<std::size_t>(i)] << " s " << s;
        } else {
          ++ambiguous;
          EXPECT_TRUE(code == lo || code == hi);
        }
        ++checked;
        EXPECT_EQ(xh[static_cast<std::size_t>(i)], static_cast<float>(f.value(code) * s))
            << "decode must be fl(value(code) * s)";
      }
    }
  }
  EXPECT_LT(ambiguous, checked / 1000);
}

TYPED_TEST(C3Fp8Codec, DecodeEveryFiniteCodeTimesScale) {
  using C = TypeParam;
  constexpr ref::Fp8Ref f = ref::fp8_ref<C>();
  // Scales representable in the metadata (fp16 values are also fp32 values).
  for (float s : {1.f, 0.099975586f, 3.f, 223.25f, 1.744140625f, 65504.f, 0x1p-24f}) {
    for (unsigned c = 0; c < 256; ++c) {
      if (!finite_code<C>(c)) continue;
      // fp8 value (<= 4 significant bits) * s (<= 24 bits) is exact in double; one rounding to fp32.
      EXPECT_EQ(C::decode_value(c, GroupParams{s, 0.f}), static_cast<float>(f.value(c) * s)) << "code " << c << " s " << s;
    }
  }
}

TYPED_TEST(C3Fp8Codec, EncodeDividesExactTiesGoToEven) {
  using C = TypeParam;
  constexpr ref::Fp8Ref f = ref::fp8_ref<C>();
  // Midpoints between consecutive positive FP8 values in the normal range, with their even code.
  std::vector<double> mids;
  std::vector<unsigned> even;
  for (unsigned c = 0; c < f.max_code(); ++c) {
    if (f.value(c) < f.min_normal()) continue;
    mids.push_back((f.value(c) + f.value(c + 1)) / 2);
    even.push_back(c % 2 == 0 ? c : c + 1);
    ASSERT_EQ(f.encode(mids.back()), even.back());  // the reference agrees with the tie rule
  }
  // Every fp16 scale in [2^-3, 2^3): 6 binades x 1024 mantissas. mid * s has <= 16 significant
  // bits, so x = mid * s is exact in fp32 and x / s == mid exactly.
  long failures = 0;
  std::string first;
  for (int e = -3; e < 3; ++e) {
    for (int m = 0; m < 1024; ++m) {
      const float s = std::ldexp(static_cast<float>(1024 + m), e - 10);
      for (std::size_t k = 0; k < mids.size(); ++k) {
        for (double sign : {1.0, -1.0}) {
          const double exact = sign * mids[k] * s;
          const float x = static_cast<float>(exact);
          if (static_cast<double>(x) != exact) {
            ADD_FAILURE() << "test input not exact";
            return;
          }
          const unsigned want = even[k] | (sign < 0 ? 0x80u : 0u);
          const unsigned got = C::encode_value(x, GroupParams{s, 0.f});
          if (got != want && failures++ < 5)
            first += "x = " + std::to_string(x) + " = " + std::to_string(sign * mids[k]) + " * " + std::to_string(s) +
                     ": code " + std::to_string(got) + ", want " + std::to_string(want) + "\n";
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << first;
}

/// A group of `n` values with amax 1e5 at index `pos` (sign `sign`); the rest spread over
/// magnitudes 1e5 * 2^(-0.7 k) with alternating signs, so they cover the format's normal range and
/// reach below it.
std::vector<float> amax_1e5_group(int n, int pos, float sign) {
  std::vector<float> x(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>((i % 2 ? -1 : 1) * 1e5 * std::exp2(-0.7 * (i + 1)));
  x[static_cast<std::size_t>(pos)] = sign * 1e5f;
  return x;
}

/// Checks one reconstructed group: finite, scale == round_up(1e5 / max), relative bound in the
/// normal range, and the amax element itself within the relative bound.
template <class C>
void check_amax_group(const std::vector<float>& x, const std::vector<float>& xh, GroupParams p, const std::string& what) {
  constexpr ref::Fp8Ref f = ref::fp8_ref<C>();
  constexpr ref::Grid g = ref::meta_grid<C>();
  EXPECT_TRUE(std::isfinite(p.scale) && p.scale > 0) << what;
  EXPECT_EQ(p.scale, static_cast<float>(ref::round_up(g, 1e5 / f.max()))) << what << ": s must be amax / " << f.max();
  const double rel = std::ldexp(1.0, -(f.man_bits + 1));
  int normal = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(std::isfinite(xh[i])) << what << " element " << i;
    if (std::fabs(x[i]) / p.scale >= f.min_normal()) {
      ++normal;
      EXPECT_LE(std::fabs(static_cast<double>(xh[i]) - x[i]), rel * std::fabs(x[i]))
          << what << " element " << i << ": x " << x[i] << " x̂ " << xh[i] << " scale " << p.scale;
    }
  }
  EXPECT_GE(normal, 8) << what;
}

TYPED_TEST(C3Fp8Codec, Amax1e5ReconstructsWithinRelativeBoundPerToken) {
  using C = TypeParam;
  for (float sign : {1.f, -1.f}) {
    for (int pos : {0, 13, 31}) {
      const std::vector<float> x = amax_1e5_group(32, pos, sign);
      std::vector<std::byte> codes(32), meta(row_meta_bytes<C>(32));
      encode_row<C>(x.data(), 32, codes.data(), meta.data());
      std::vector<float> xh(32);
      decode_row<C>(codes.data(), meta.data(), 32, xh.data());
      check_amax_group<C>(x, xh, C::load_params(meta.data()),
                          "per-token, amax " + std::to_string(sign * 1e5f) + " at " + std::to_string(pos));
    }
  }
}

TYPED_TEST(C3Fp8Codec, Amax1e5ReconstructsWithinRelativeBoundPerChannel) {
  using C = TypeParam;
  constexpr int G = C::group_size, D = 4;
  // Channel c of G tokens holds an amax-1e5 group with its peak at token 7c; channel 3 is negative.
  std::vector<float> x(static_cast<std::size_t>(G * D));
  std::vector<std::vector<float>> cols(D);
  for (int c = 0; c < D; ++c) {
    cols[static_cast<std::size_t>(c)] = amax_1e5_group(G, 7 * c, c == 3 ? -1.f : 1.f);
    for (int t = 0; t < G; ++t) x[static_cast<std::size_t>(t * D + c)] = cols[static_cast<std::size_t>(c)][static_cast<std::size_t>(t)];
  }
  const std::size_t rb = C::code_bytes(D);
  std::vector<std::byte> codes(rb * G), meta(static_cast<std::size_t>(D) * C::meta_bytes_per_group);
  encode_channels<C>(x.data(), D, D, codes.data(), rb, meta.data());
  std::vector<float> row(D);
  std::vector<std::vector<float>> xh(D, std::vector<float>(G));
  for (int t = 0; t < G; ++t) {
    decode_row_channels<C>(codes.data() + t * rb, meta.data(), D, row.data());
    for (int c = 0; c < D; ++c) xh[static_cast<std::size_t>(c)][static_cast<std::size_t>(t)] = row[static_cast<std::size_t>(c)];
  }
  for (int c = 0; c < D; ++c)
    check_amax_group<C>(cols[static_cast<std::size_t>(c)], xh[static_cast<std::size_t>(c)],
                        C::load_params(meta.data() + c * C::meta_bytes_per_group), "per-channel c " + std::to_string(c));
}

}  // namespace
}  // namespace test_case_c3_fp8_codec
