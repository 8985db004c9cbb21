// CASES C1: outliers beyond the fp16 range.
//
// The group: x[0] = -125000, x[i] = -1 + 5 (i - 1) / 30 for i = 1..31 (so -1..4).
//  * fp32 metadata, INT4 asymmetric: step = 125004 / 15 = 8333.6, every |x̂ - x| <= 4166.8;
//  * fp16 metadata, INT4 asymmetric: extremes clamped to ±65504 before the scale is derived:
//    step = 65508 / 15 = 4367.2 -> stored 4368, x̂[0] = -65504, |x̂[i] - x[i]| <= 2183.6 (1 + 2^-10);
//  * INT8 asymmetric likewise (step 125004 / 255, and 65508 / 255 -> 257 with fp16);
//  * INT8 symmetric, INT4 symmetric and FP8 per-group: finite (and the small values still within
//    half a step);
// as K-like and V-like data: per-token rows (groups along head_dim: V, per-token K) and
// per-channel groups (groups along tokens: KIVI K). The family: group sizes 32/64/128, the
// outlier at several positions, and the mirrored group (+125000 with -4..1).
// Then through KVCache (sinks, residual window, quantized blocks, per-token and per-channel keys):
// nothing non-finite anywhere, the full-precision rows bit-exact, the quantized rows within the
// bounds above, attention outputs finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/int_codec.hpp"
#include "kvpack/codec/rows.hpp"
#include "kvpack/kv_cache.hpp"
#include "support/codec_bounds.hpp"

namespace test_case_c1_outliers {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file
namespace ref = kvpack::codec_ref;

constexpr double kOutlier = 125000.0;

/// The C1 group generalised to group size n: the outlier -125000 at `pos`, the other n - 1 values
/// -1 + 5 j / (n - 2), j = 0..n-2, in order; `sign` -1 mirrors everything. n = 32, pos = 0,
/// sign = 1 is CASES C1 exactly.
std::vector<float> c1_group(int n, int pos, double sign) {
  std::vector<float> x(static_cast<std::size_t>(n));
  for (int i = 0, j = 0; i < n; ++i)
    x[static_cast<std::size_t>(i)] = static_cast<float>(sign * (i == pos ? -kOutlier : -1.0 + 5.0 * j++ / (n - 2)));
  return x;
}

enum class Layout { per_token_row, per_channel };
const char* layout_name(Layout l) { return l == Layout::per_token_row ? "per-token row" : "per-channel group"; }

/// Round trip of the group g through the codec, embedded in a larger input:
///  per-token: a row of 2 G values, group 0 = g, group 1 = N(0,1);
///  per-channel: G tokens x 4 channels, channel 1 = g along the tokens, the others N(0,1).
/// Returns x̂ of the group and its stored params.
template <class C>
std::vector<float> round_trip(const std::vector<float>& g, Layout layout, GroupParams& p) {
  constexpr int G = C::group_size;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> xh(G);
  if (layout == Layout::per_token_row) {
    std::vector<float> row(2 * G);
    for (int i = 0; i < G; ++i) {
      row[static_cast<std::size_t>(i)] = g[static_cast<std::size_t>(i)];
      row[static_cast<std::size_t>(G + i)] = nd(rng);
    }
    std::vector<std::byte> codes(C::code_bytes(2 * G)), meta(row_meta_bytes<C>(2 * G));
    encode_row<C>(row.data(), 2 * G, codes.data(), meta.data());
    std::vector<float> out(2 * G);
    decode_row<C>(codes.data(), meta.data(), 2 * G, out.data());
    p = C::load_params(meta.data());
    for (int i = 0; i < G; ++i) xh[static_cast<std::size_t>(i)] = out[static_cast<std::size_t>(i)];
  } else {
    constexpr int D = 4;
    std::vector<float> x(static_cast<std::size_t>(G * D));
    for (int t = 0; t < G; ++t)
      for (int c = 0; c < D; ++c) x[static_cast<std::size_t>(t * D + c)] = c == 1 ? g[static_cast<std::size_t>(t)] : nd(rng);
    const std::size_t rb = C::code_bytes(D);
    std::vector<std::byte> codes(rb * G), meta(D * C::meta_bytes_per_group);
    encode_channels<C>(x.data(), D, D, codes.data(), rb, meta.data());
    std::vector<float> row(D);
    for (int t = 0; t < G; ++t) {
      decode_row_channels<C>(codes.data() + t * rb, meta.data(), D, row.data());
      xh[static_cast<std::size_t>(t)] = row[1];
    }
    p = C::load_params(meta.data() + C::meta_bytes_per_group);
  }
  return xh;
}

constexpr Layout kLayouts[] = {Layout::per_token_row, Layout::per_channel};

// --- CASES C1 exactly as written --------------------------------------------------------------

TEST(C1Outliers, Int4AsymmetricFp32MetadataExact) {
  using C = Int4<Asymmetric, MetaF32>;
  for (Layout l : kLayouts) {
    const std::vector<float> x = c1_group(32, 0, 1);
    ASSERT_EQ(x[0], -125000.f);
    ASSERT_EQ(x[1], -1.f);
    ASSERT_EQ(x[31], 4.f);
    GroupParams p;
    const std::vector<float> xh = round_trip<C>(x, l, p);
    SCOPED_TRACE(layout_name(l));
    EXPECT_EQ(p.zero, -125000.f);
    EXPECT_NEAR(p.scale, 8333.6, 1e-3);  // step = 125004 / 15
    EXPECT_EQ(p.scale, static_cast<float>(ref::round_up(ref::kF32Grid, 125004.0 / 15)));
    for (int i = 0; i < 32; ++i) {
      ASSERT_TRUE(std::isfinite(xh[static_cast<std::size_t>(i)]));
      EXPECT_LE(std::fabs(static_cast<double>(xh[static_cast<std::size_t>(i)]) - x[static_cast<std::size_t>(i)]), 4166.8)
          << "i " << i << " x " << x[static_cast<std::size_t>(i)] << " x̂ " << xh[static_cast<std::size_t>(i)];
    }
  }
}

TEST(C1Outliers, Int4AsymmetricFp16MetadataClampsBeforeDerivingScale) {
  using C = Int4<Asymmetric, MetaF16>;
  for (Layout l : kLayouts) {
    const std::vector<float> x = c1_group(32, 0, 1);
    GroupParams p;
    const std::vector<float> xh = round_trip<C>(x, l, p);
    SCOPED_TRACE(layout_name(l));
    EXPECT_EQ(p.zero, -65504.f);
    EXPECT_EQ(p.scale, 4368.f);  // 65508 / 15 = 4367.2, rounded up on the fp16 grid (spacing 4)
    EXPECT_EQ(xh[0], -65504.f);
    for (int i = 1; i < 32; ++i) {
      ASSERT_TRUE(std::isfinite(xh[static_cast<std::size_t>(i)]));
      EXPECT_LE(std::fabs(static_cast<double>(xh[static_cast<std::size_t>(i)]) - x[static_cast<std::size_t>(i)]),
                2183.6 * (1 + 0x1p-10))
          << "i " << i << " x " << x[static_cast<std::size_t>(i)] << " x̂ " << xh[static_cast<std::size_t>(i)];
    }
  }
}

TEST(C1Outliers, Int8AsymmetricExact) {
  for (Layout l : kLayouts) {
    SCOPED_TRACE(layout_name(l));
    const std::vector<float> x = c1_group(32, 0, 1);
    {
      GroupParams p;
      const std::vector<float> xh = round_trip<Int8<Asymmetric, MetaF32>>(x, l, p);
      EXPECT_EQ(p.zero, -125000.f);
      EXPECT_EQ(p.scale, static_cast<float>(ref::round_up(ref::kF32Grid, 125004.0 / 255)));
      for (int i = 0; i < 32; ++i)
        EXPECT_LE(std::fabs(static_cast<double>(xh[static_cast<std::size_t>(i)]) - x[static_cast<std::size_t>(i)]), 125004.0 / 255 / 2)
            << "fp32 i " << i;
    }
    {
      GroupParams p;
      const std::vector<float> xh = round_trip<Int8<Asymmetric, MetaF16>>(x, l, p);
      EXPECT_EQ(p.zero, -65504.f);
      EXPECT_EQ(p.scale, 257.f);  // 65508 / 255 = 256.89, rounded up on the fp16 grid (spacing 0.25)
      EXPECT_EQ(xh[0], -65504.f);
      for (int i = 1; i < 32; ++i)
        EXPECT_LE(std::fabs(static_cast<double>(xh[static_cast<std::size_t>(i)]) - x[static_cast<std::size_t>(i)]),
                  65508.0 / 255 / 2 * (1 + 0x1p-10))
            << "fp16 i " << i;
    }
  }
}

// --- the family: group sizes, outlier positions, mirrored sign -----------------------------------

/// Asymmetric integer codecs: the CASES bounds for any group size / position / sign.
/// step_ref = (max - min) / qmax over the group, clamped to ±65504 first with fp16 metadata; the
/// stored step is step_ref rounded up (at most 1 + 2^-10 larger with fp16, 1 + 2^-23 with fp32);
/// small values err by at most half the stored step, and the outlier reconstructs within half a
/// step of its clamped value (-65504 exactly for the negative outlier).
template <class C>
void check_asymmetric_family() {
  constexpr bool f16 = std::is_same_v<typename C::meta_type, MetaF16>;
  constexpr int G = C::group_size;
  for (double sign : {1.0, -1.0})
    for (int pos : {0, 1, G / 2, G - 1})
      for (Layout l : kLayouts) {
        const std::vector<float> x = c1_group(G, pos, sign);
        const ref::Range r = ref::range_of(x.data(), 1, G);
        const double lim = f16 ? 65504.0 : 1e300;
        const double lo = std::max(r.lo, -lim), hi = std::min(r.hi, lim);
        const ref::Grid g = ref::meta_grid<C>();
        const double step_ref = (hi - lo) / C::qmax;  // lo (-65504, -125000, -4) is on both grids
        GroupParams p;
        const std::vector<float> xh = round_trip<C>(x, l, p);
        const std::string what = ref::codec_name<C>() + " " + layout_name(l) + " outlier " +
                                 std::to_string(sign * -kOutlier) + " at " + std::to_string(pos);
        EXPECT_EQ(p.zero, static_cast<float>(lo)) << what;
        EXPECT_EQ(p.scale, static_cast<float>(ref::round_up(g, step_ref))) << what;
        const double half = p.scale / 2.0 + 4.0 * FLT_EPSILON * r.amax();
        EXPECT_LE(half, step_ref / 2 * (1 + ref::rel_ulp(g)) + 4.0 * FLT_EPSILON * r.amax()) << what;
        for (int i = 0; i < G; ++i) {
          const double xi = x[static_cast<std::size_t>(i)], yi = xh[static_cast<std::size_t>(i)];
          ASSERT_TRUE(std::isfinite(yi)) << what;
          const double target = std::clamp(xi, -lim, lim);
          EXPECT_LE(std::fabs(yi - target), half) << what << " element " << i << " x " << xi << " x̂ " << yi;
        }
        if (f16 && sign > 0) {
          EXPECT_EQ(xh[static_cast<std::size_t>(pos)], -65504.f) << what;
        }
      }
}

template <class C>
class C1AsymmetricFamily : public ::testing::Test {};
using AsymCodecs =
    ::testing::Types<Int4<Asymmetric, MetaF16, Group<32>>, Int4<Asymmetric, MetaF32, Group<32>>,
                     Int4<Asymmetric, MetaF16, Group<64>>, Int4<Asymmetric, MetaF32, Group<128>>,
                     Int8<Asymmetric, MetaF16, Group<32>>, Int8<Asymmetric, MetaF32, Group<32>>,
                     Int8<Asymmetric, MetaF16, Group<128>>, Int8<Asymmetric, MetaF32, Group<64>>>;
struct Names {
  template <class C>
  static std::string GetName(int) {
    return ref::codec_name<C>();
  }
};
TYPED_TEST_SUITE(C1AsymmetricFamily, AsymCodecs, Names);
TYPED_TEST(C1AsymmetricFamily, BoundsForEverySizePositionAndSign) { check_asymmetric_family<TypeParam>(); }

/// Symmetric integer and FP8 codecs: finite everywhere; the small values (|x| <= 4) within half a
/// step (integer) or the FP8 bound; the outlier keeps its sign. Where no clamp is involved
/// (fp32 metadata, and FP8, which stores only amax / format_max) the whole group meets the
/// codec's bound against the float64 reference metadata.
template <class C>
void check_finite_family() {
  constexpr bool f16 = std::is_same_v<typename C::meta_type, MetaF16>;
  constexpr int G = C::group_size;
  for (double sign : {1.0, -1.0})
    for (int pos : {0, G / 2, G - 1})
      for (Layout l : kLayouts) {
        const std::vector<float> x = c1_group(G, pos, sign);
        GroupParams p;
        const std::vector<float> xh = round_trip<C>(x, l, p);
        const std::string what = ref::codec_name<C>() + " " + layout_name(l) + " outlier " +
                                 std::to_string(sign * -kOutlier) + " at " + std::to_string(pos);
        ASSERT_TRUE(std::isfinite(p.scale) && p.scale > 0) << what;
        for (int i = 0; i < G; ++i) ASSERT_TRUE(std::isfinite(xh[static_cast<std::size_t>(i)])) << what << " element " << i;
        EXPECT_EQ(std::signbit(xh[static_cast<std::size_t>(pos)]), sign > 0) << what;
        if constexpr (ref::is_fp8_v<C> || !f16) {
          ref::Report rep;
          ref::check_group<C>(x.data(), xh.data(), 1, G, p, [&] { return what; }, rep);
          EXPECT_EQ(rep.failures, 0) << rep.first.str();
        } else {
          // fp16 symmetric: amax clamped to 65504, scale = 65504 / qmax rounded up.
          EXPECT_EQ(p.scale, static_cast<float>(ref::round_up(ref::kF16Grid, 65504.0 / C::qmax))) << what;
          for (int i = 0; i < G; ++i) {
            if (i == pos) continue;
            EXPECT_LE(std::fabs(static_cast<double>(xh[static_cast<std::size_t>(i)]) - x[static_cast<std::size_t>(i)]),
                      p.scale / 2.0)
                << what << " element " << i;
          }
        }
      }
}

template <class C>
class C1FiniteFamily : public ::testing::Test {};
using FiniteCodecs =
    ::testing::Types<Int8<Symmetric, MetaF16>, Int8<Symmetric, MetaF32>, Int4<Symmetric, MetaF16>,
                     Int4<Symmetric, MetaF32, Group<64>>, Fp8E4M3<MetaF16>, Fp8E4M3<MetaF32>, Fp8E5M2<MetaF16>,
                     Fp8E5M2<MetaF32, Group<128>>, Fp8E4M3<MetaF16, Group<128>>>;
TYPED_TEST_SUITE(C1FiniteFamily, FiniteCodecs, Names);
TYPED_TEST(C1FiniteFamily, FiniteAndSmallValuesBounded) { check_finite_family<TypeParam>(); }

// --- through KVCache ---------------------------------------------------------------------------

/// Cache under test: sinks 4, residual 16, the given key codec/axis and value codec.
template <class K, class Axis, class V>
using Cache = KVCache<Keys<K, Axis>, Values<V>, Sinks<4>, Residual<16>>;

template <class T>
class C1ThroughKVCache : public ::testing::Test {};
using Caches = ::testing::Types<
    Cache<Int4<Asymmetric, MetaF16>, PerToken, Int4<Asymmetric, MetaF16>>,
    Cache<Int4<Asymmetric, MetaF16>, PerChannel, Int4<Asymmetric, MetaF16>>,
    Cache<Int4<Asymmetric, MetaF32>, PerToken, Int4<Asymmetric, MetaF32>>,
    Cache<Int4<Asymmetric, MetaF32>, PerChannel, Int4<Asymmetric, MetaF32>>,
    Cache<Int8<Asymmetric, MetaF16>, PerChannel, Int8<Asymmetric, MetaF16>>,
    Cache<Int8<Symmetric, MetaF16>, PerToken, Int8<Symmetric, MetaF16>>,
    Cache<Int8<Symmetric, MetaF16>, PerChannel, Int4<Symmetric, MetaF16>>,
    Cache<Fp8E4M3<MetaF16>, PerChannel, Fp8E5M2<MetaF16>>, Cache<Fp8E5M2<MetaF16>, PerToken, Fp8E4M3<MetaF16>>>;
TYPED_TEST_SUITE(C1ThroughKVCache, Caches);

/// The CASES bound of one quantized value of an asymmetric integer codec whose group is a
/// permutation of the (possibly mirrored) C1 group of 32.
template <class C>
void expect_c1_bound(double x, double xh, const std::string& what) {
  constexpr bool f16 = std::is_same_v<typename C::meta_type, MetaF16>;
  const ref::Grid g = ref::meta_grid<C>();
  const double step = ref::round_up(g, (f16 ? 65508.0 : 125004.0) / C::qmax);
  const double target = f16 ? std::clamp(x, -65504.0, 65504.0) : x;
  EXPECT_LE(std::fabs(xh - target), step / 2 + 4.0 * FLT_EPSILON * kOutlier) << what << ": x " << x << " x̂ " << xh;
}

TYPED_TEST(C1ThroughKVCache, NoNonFiniteAnywhereAndBoundsHold) {
  using KC = TypeParam;
  using KCodec = typename KC::key_codec;
  using VCodec = typename KC::value_codec;
  constexpr int kHeads = 2, kD = 64, kPrefill = 84, kDecode = 12, kT = kPrefill + kDecode;
  auto created = KC::create(ModelShape{1, 4, kHeads, kD, 256, 0.f});
  ASSERT_TRUE(created) << created.error().message;
  KC& cache = *created;

  // K[t][h][c] = s_h * g[(t + c) % 32], V[t][h][c] = s_h * g[(t + 3c) % 32] with g the C1 group
  // and s_h = +1 (head 0) / -1 (head 1): every per-token group (32 consecutive channels) and every
  // per-channel group (32 consecutive tokens) is a permutation of the C1 group, so each holds
  // exactly one ±125000 outlier; sinks and residual rows hold outliers too.
  const std::vector<float> g = c1_group(32, 0, 1);
  auto kval = [&](int t, int h, int c) { return (h == 0 ? 1.f : -1.f) * g[static_cast<std::size_t>((t + c) % 32)]; };
  auto vval = [&](int t, int h, int c) { return (h == 0 ? 1.f : -1.f) * g[static_cast<std::size_t>((t + 3 * c) % 32)]; };
  auto rows = [&](int t0, int n, std::vector<float>& k, std::vector<float>& v, std::vector<std::int32_t>& pos) {
    k.clear(), v.clear(), pos.clear();
    for (int t = t0; t < t0 + n; ++t) {
      pos.push_back(t);
      for (int h = 0; h < kHeads; ++h)
        for (int c = 0; c < kD; ++c) k.push_back(kval(t, h, c)), v.push_back(vval(t, h, c));
    }
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  auto attend_finite = [&](int n_q, const std::string& what) {
    std::vector<float> q(static_cast<std::size_t>(n_q * 4 * kD)), out(q.size());
    for (float& v : q) v = nd(rng);
    ASSERT_TRUE(cache.attend(0, q, out)) << what;
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out[i])) << what << " output " << i;
  };

  std::vector<float> k, v;
  std::vector<std::int32_t> pos;
  rows(0, kPrefill, k, v, pos);
  ASSERT_TRUE(cache.append(0, k, v, pos));
  attend_finite(kPrefill, "prefill");
  for (int t = kPrefill; t < kT; ++t) {
    rows(t, 1, k, v, pos);
    ASSERT_TRUE(cache.append(0, k, v, pos));
    attend_finite(1, "decode " + std::to_string(t));
  }
  const std::int64_t quantized = cache.quantized_tokens(0);
  ASSERT_GE(quantized, 64);  // at least two whole groups of 32 tokens went through the codecs
  ASSERT_LE(quantized, kT - 4 - 16);

  for (int h = 0; h < kHeads; ++h) {
    auto back = cache.read_back(0, h);
    ASSERT_TRUE(back) << back.error().message;
    ASSERT_EQ(back->positions.size(), static_cast<std::size_t>(kT));
    for (int i = 0; i < kT; ++i) {
      const int t = back->positions[static_cast<std::size_t>(i)];
      ASSERT_EQ(t, i);
      const bool exact = i < 4 || i >= 4 + quantized;  // sinks, then the full-precision residual rows
      for (int c = 0; c < kD; ++c) {
        const std::size_t j = static_cast<std::size_t>(i) * kD + static_cast<std::size_t>(c);
        const float kx = kval(t, h, c), vx = vval(t, h, c);
        const float kh = back->k[j], vh = back->v[j];
        ASSERT_TRUE(std::isfinite(kh) && std::isfinite(vh)) << "head " << h << " token " << t << " channel " << c;
        const std::string what = "head " + std::to_string(h) + " token " + std::to_string(t) + " channel " + std::to_string(c);
        if (exact) {
          ASSERT_EQ(kh, kx) << what << " (full-precision K)";
          ASSERT_EQ(vh, vx) << what << " (full-precision V)";
          continue;
        }
        if constexpr (!ref::is_fp8_v<KCodec> && KCodec::asymmetric) expect_c1_bound<KCodec>(kx, kh, what + " K");
        if constexpr (!ref::is_fp8_v<VCodec> && VCodec::asymmetric) expect_c1_bound<VCodec>(vx, vh, what + " V");
      }
    }
  }
}

}  // namespace
}  // namespace test_case_c1_outliers
