// CASES C2: constant and near-constant groups (head_dim 128, group 32; INT8 and INT4, symmetric
// and asymmetric, fp16 and fp32 metadata), per-token rows and per-channel token groups.
//
//  * constant groups 100.0, 0.0, -3.5 -- and the family of constants representable in the
//    metadata precision, down to the smallest subnormal -- reconstruct exactly, next to
//    non-constant groups in the same row; the metadata is the documented one (symmetric:
//    scale |v|, or 1 for 0; asymmetric: zero-point v, scale 1);
//  * values alternating 100.0 and 100.0 + 2^-10 (and similar adjacent pairs): finite metadata,
//    error <= one stored step;
//  * x = 1e-6 N(0,1) (and smaller): no NaN/Inf, no scale of 0, |x̂ - x| <= step/2 with the
//    scale on the metadata grid (fp16 subnormal scales included). kvpack does NOT flush such
//    groups to zero: most values reconstruct non-zero.
// (The offload round trip of these groups is tested with the offload code.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kvpack/codec/int_codec.hpp"
#include "kvpack/codec/rows.hpp"
#include "support/codec_bounds.hpp"

namespace test_case_c2_constant_groups {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file
namespace ref = kvpack::codec_ref;

constexpr int kD = 128, kG = 32;

template <class C>
class C2ConstantGroups : public ::testing::Test {};
using Codecs = ::testing::Types<Int8<Symmetric, MetaF16>, Int8<Symmetric, MetaF32>, Int8<Asymmetric, MetaF16>,
                                Int8<Asymmetric, MetaF32>, Int4<Symmetric, MetaF16>, Int4<Symmetric, MetaF32>,
                                Int4<Asymmetric, MetaF16>, Int4<Asymmetric, MetaF32>>;
struct Names {
  template <class C>
  static std::string GetName(int) {
    return ref::codec_name<C>();
  }
};
TYPED_TEST_SUITE(C2ConstantGroups, Codecs, Names);

/// Constants that must reconstruct exactly: the CASES values first, then the family: every one is
/// representable in the metadata precision (kvpack's documented condition for exactness).
template <class C>
std::vector<float> exact_constants() {
  std::vector<float> v = {100.f, 0.f, -3.5f, 1.f, -1.f, 0.5f, 7.f, -128.f, 65504.f, -65504.f, 0x1p-24f, -0x1p-24f,
                          0.099975586f /* fp16(0.1) */, 1000.f};
  if constexpr (std::is_same_v<typename C::meta_type, MetaF32>) {
    v.insert(v.end(), {0.1f, -1e-30f, 3e38f, -3e38f, std::numeric_limits<float>::denorm_min(),
                       std::numeric_limits<float>::min(), 123456.789f});
  }
  return v;
}

/// Per-token: encode/decode one row of kD values; returns x̂, and the stored params per group.
template <class C>
std::vector<float> round_trip_row(const std::vector<float>& x, std::vector<GroupParams>& params) {
  std::vector<std::byte> codes(C::code_bytes(kD)), meta(row_meta_bytes<C>(kD));
  encode_row<C>(x.data(), kD, codes.data(), meta.data());
  std::vector<float> xh(kD);
  decode_row<C>(codes.data(), meta.data(), kD, xh.data());
  params.clear();
  for (int g = 0; g < kD / kG; ++g) params.push_back(C::load_params(meta.data() + g * C::meta_bytes_per_group));
  return xh;
}

/// Per-channel: kG tokens x kD channels, grouped along tokens; returns x̂ ([kG][kD]) and the stored
/// params per channel.
template <class C>
std::vector<float> round_trip_channels(const std::vector<float>& x, std::vector<GroupParams>& params) {
  const std::size_t rb = C::code_bytes(kD);
  std::vector<std::byte> codes(rb * kG), meta(static_cast<std::size_t>(kD) * C::meta_bytes_per_group);
  encode_channels<C>(x.data(), kD, kD, codes.data(), rb, meta.data());
  std::vector<float> xh(static_cast<std::size_t>(kG * kD));
  for (int t = 0; t < kG; ++t)
    decode_row_channels<C>(codes.data() + t * rb, meta.data(), kD, xh.data() + static_cast<std::ptrdiff_t>(t) * kD);
  params.clear();
  for (int c = 0; c < kD; ++c) params.push_back(C::load_params(meta.data() + c * C::meta_bytes_per_group));
  return xh;
}

/// The documented metadata of a constant group of value v.
template <class C>
void expect_constant_meta(float v, GroupParams p, const std::string& what) {
  if constexpr (C::asymmetric) {
    EXPECT_EQ(p.zero, v) << what;
    EXPECT_EQ(p.scale, 1.f) << what;
  } else {
    EXPECT_EQ(p.scale, v == 0.f ? 1.f : std::fabs(v)) << what;
  }
}

TYPED_TEST(C2ConstantGroups, ConstantGroupsExactPerToken) {
  using C = TypeParam;
  std::mt19937_64 rng(21);
  std::normal_distribution<float> nd;
  const std::vector<float> consts = exact_constants<C>();
  // Rows of four groups: three constants and one N(0,1) group, the constant slots rotating so
  // every constant sits in every group position; plus rows made of one constant only.
  for (std::size_t k = 0; k < consts.size(); ++k) {
    for (int rot = 0; rot < 4; ++rot) {
      const float vals[3] = {consts[k], consts[(k + 1) % consts.size()], consts[(k + 2) % consts.size()]};
      std::vector<float> x(kD);
      int random_group = rot;
      for (int g = 0; g < 4; ++g)
        for (int i = 0; i < kG; ++i)
          x[static_cast<std::size_t>(g * kG + i)] = g == random_group ? nd(rng) : vals[(g - rot + 4) % 4 - 1];
      std::vector<GroupParams> p;
      const std::vector<float> xh = round_trip_row<C>(x, p);
      ref::Report rep;
      for (int g = 0; g < 4; ++g) {
        const float* xg = x.data() + g * kG;
        const std::string what = "row of constants " + std::to_string(k) + " rotation " + std::to_string(rot) +
                                 " group " + std::to_string(g) + " value " + std::to_string(xg[0]);
        if (g == random_group) {
          ref::check_group<C>(xg, xh.data() + g * kG, 1, kG, p[static_cast<std::size_t>(g)], [&] { return what; }, rep);
          continue;
        }
        expect_constant_meta<C>(xg[0], p[static_cast<std::size_t>(g)], what);
        for (int i = 0; i < kG; ++i) ASSERT_EQ(xh[static_cast<std::size_t>(g * kG + i)], xg[0]) << what << " element " << i;
      }
      EXPECT_EQ(rep.failures, 0) << rep.first.str();
    }
    const std::vector<float> all(kD, consts[k]);
    std::vector<GroupParams> p;
    EXPECT_EQ(round_trip_row<C>(all, p), all) << "row of " << consts[k];
  }
}

TYPED_TEST(C2ConstantGroups, ConstantGroupsExactPerChannel) {
  using C = TypeParam;
  std::mt19937_64 rng(22);
  std::normal_distribution<float> nd;
  const std::vector<float> consts = exact_constants<C>();
  // Channel c holds constant consts[c % n] over the group's tokens, except every 5th channel
  // (N(0,1)); so constant and non-constant channels share every token row.
  std::vector<float> x(static_cast<std::size_t>(kG * kD));
  for (int t = 0; t < kG; ++t)
    for (int c = 0; c < kD; ++c)
      x[static_cast<std::size_t>(t * kD + c)] = c % 5 == 4 ? nd(rng) : consts[static_cast<std::size_t>(c) % consts.size()];
  std::vector<GroupParams> p;
  const std::vector<float> xh = round_trip_channels<C>(x, p);
  ref::Report rep;
  for (int c = 0; c < kD; ++c) {
    const std::string what = "channel " + std::to_string(c) + " value " + std::to_string(x[static_cast<std::size_t>(c)]);
    if (c % 5 == 4) {
      ref::check_group<C>(x.data() + c, xh.data() + c, kD, kG, p[static_cast<std::size_t>(c)], [&] { return what; }, rep);
      continue;
    }
    expect_constant_meta<C>(x[static_cast<std::size_t>(c)], p[static_cast<std::size_t>(c)], what);
    for (int t = 0; t < kG; ++t)
      ASSERT_EQ(xh[static_cast<std::size_t>(t * kD + c)], x[static_cast<std::size_t>(t * kD + c)]) << what << " token " << t;
  }
  EXPECT_EQ(rep.failures, 0) << rep.first.str();
}

/// Adjacent pairs (a, b): groups alternate a, b, a, b, ... (the first CASES pair, then the family).
std::vector<std::pair<float, float>> near_constant_pairs() {
  return {{100.f, 100.f + 0x1p-10f}, {-100.f, -100.f - 0x1p-10f}, {100.f, std::nextafter(100.f, 200.f)},
          {-3.5f, -3.5f + 0x1p-20f},  {65472.f, 65504.f},             {0.f, 0x1p-24f}};
}

template <class C>
void check_near_constant(const float* x, const float* xh, std::ptrdiff_t stride, GroupParams p, const std::string& what) {
  ASSERT_TRUE(std::isfinite(p.scale) && p.scale > 0.f && std::isfinite(p.zero)) << what << " scale " << p.scale;
  for (int i = 0; i < kG; ++i) {
    const float a = x[i * stride], b = xh[i * stride];
    ASSERT_TRUE(std::isfinite(b)) << what;
    EXPECT_LE(std::fabs(static_cast<double>(b) - a), p.scale) << what << " element " << i << ": x " << a << " x̂ " << b;
  }
}

TYPED_TEST(C2ConstantGroups, AlternatingNearConstantWithinOneStep) {
  using C = TypeParam;
  for (const auto& [a, b] : near_constant_pairs()) {
    const std::string what = "pair (" + std::to_string(a) + ", " + std::to_string(b) + ")";
    // Per token: group g starts with a (g even) or b (g odd).
    std::vector<float> x(kD);
    for (int i = 0; i < kD; ++i) x[static_cast<std::size_t>(i)] = ((i + i / kG) % 2 == 0) ? a : b;
    std::vector<GroupParams> p;
    std::vector<float> xh = round_trip_row<C>(x, p);
    for (int g = 0; g < kD / kG; ++g)
      check_near_constant<C>(x.data() + g * kG, xh.data() + g * kG, 1, p[static_cast<std::size_t>(g)],
                             what + " per-token group " + std::to_string(g));
    // Per channel: token t of channel c holds a or b by (t + c) parity.
    std::vector<float> xc(static_cast<std::size_t>(kG * kD));
    for (int t = 0; t < kG; ++t)
      for (int c = 0; c < kD; ++c) xc[static_cast<std::size_t>(t * kD + c)] = (t + c) % 2 == 0 ? a : b;
    xh = round_trip_channels<C>(xc, p);
    for (int c = 0; c < kD; ++c)
      check_near_constant<C>(xc.data() + c, xh.data() + c, kD, p[static_cast<std::size_t>(c)],
                             what + " per-channel " + std::to_string(c));
  }
}

TYPED_TEST(C2ConstantGroups, TinyValuesFiniteWithinHalfStepNoFlush) {
  using C = TypeParam;
  std::mt19937_64 rng(23);
  std::normal_distribution<double> nd;
  for (double mag : {1e-6, 1e-9, 1e-30}) {
    const std::string what = std::to_string(mag) + " * N(0,1)";
    ref::Report rep;
    long nonzero = 0, total = 0;
    auto check_all = [&](const std::vector<float>& x, const std::vector<float>& xh, const std::vector<GroupParams>& p,
                         bool per_channel) {
      for (std::size_t g = 0; g < p.size(); ++g) {
        ASSERT_GT(p[g].scale, 0.f) << what;
        const std::ptrdiff_t off = per_channel ? static_cast<std::ptrdiff_t>(g) : static_cast<std::ptrdiff_t>(g) * kG;
        ref::check_group<C>(x.data() + off, xh.data() + off, per_channel ? kD : 1, kG, p[g],
                            [&] { return what + (per_channel ? " channel " : " group ") + std::to_string(g); }, rep);
      }
      for (float v : xh) {
        nonzero += v != 0.f ? 1 : 0;
        ++total;
      }
    };
    for (int row = 0; row < 33; ++row) {
      std::vector<float> x(kD);
      for (float& v : x) v = static_cast<float>(mag * nd(rng));
      std::vector<GroupParams> p;
      const std::vector<float> xh = round_trip_row<C>(x, p);
      check_all(x, xh, p, false);
    }
    std::vector<float> xc(static_cast<std::size_t>(kG * kD));
    for (float& v : xc) v = static_cast<float>(mag * nd(rng));
    std::vector<GroupParams> p;
    const std::vector<float> xh = round_trip_channels<C>(xc, p);
    check_all(xc, xh, p, true);
    EXPECT_EQ(rep.failures, 0) << what << ":\n" << rep.first.str();
    // No flush to zero where the metadata can represent the step: at 1e-6 the fp16 subnormal
    // grid (2^-24 ~ 6e-8) still resolves the group, so most values come back non-zero.
    if (mag == 1e-6 || std::is_same_v<typename C::meta_type, MetaF32>) {
      EXPECT_GT(nonzero, total / 2) << what << ": " << nonzero << " of " << total << " non-zero";
    }
  }
}

}  // namespace
}  // namespace test_case_c2_constant_groups
