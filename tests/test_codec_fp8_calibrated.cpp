// Unscaled FP8 codes (codec/fp8_unscaled.hpp) and Calibrated<Cache> (calibration/calibrated_cache.hpp):
//  * the codec: every code decodes and re-encodes to itself (NaN codes aside), values round to the
//    nearest code within 2^-4 (E4M3) / 2^-3 (E5M2) relative in the normal range and half a
//    subnormal step below it, finite values beyond the max saturate; AVX2/NEON row decode equals
//    the scalar decode bit for bit; its stored identity differs from the grouped FP8 codecs';
//  * Calibrated caches: the kernel adds no error of its own (float64 on the cache's read_back
//    plus the exact current chunk, to 1e-5) at chunks of 1, 31, 33, 95 tokens, per-head and
//    per-channel scales, scalar and the build's best backend, with GQA, sinks and a residual window,
//    keys only, and under Rotated<> and PreRope<>; every read-back value lies within the codec's
//    bound at its calibrated scale (|x̂ - x| <= 2^-4 |x| + 2^-10 s); scales follow the documented
//    rule (max * 4 / 448, channel floor max_head / 16);
//  * values beyond the headroom saturate (finite, counted); set_scales validates its input and
//    survives reset, data scales do not; a failed append calibrates nothing;
//  * 8.0 bits per value: the inner blocks hold codes only; memory adds 4 bytes per scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/cache_harness.hpp"
#include "support/reference.hpp"
#if KVPACK_HAS_AVX2
#include "kvpack/kernels/avx2/codes.hpp"
#endif
#if KVPACK_HAS_NEON
#include "kvpack/kernels/neon/codes.hpp"
#endif

namespace codec_fp8_calibrated_test {

using namespace kvpack;  // NOLINT: test file

// ---- the codec ----

template <class C>
void codec_round_trip(double rel, double sub_half_step, double min_normal) {
  using F = typename C::format;
  for (unsigned u = 0; u < 256; ++u) {
    const float x = C::decode_value(u);
    if (!std::isfinite(x)) continue;  // E4M3FN: NaN codes; E5M2: also ±Inf
    EXPECT_EQ(C::encode_value(x), u == 0x80 ? 0x80u : u) << "code " << u;  // -0 stays -0
  }
  const auto xs = kvtest::normal(4096, 7, 30.f);
  for (float x : xs) {
    const double y = C::decode_value(C::encode_value(x));
    const double bound = std::abs(x) >= min_normal ? rel * std::abs(x) : sub_half_step;
    ASSERT_LE(std::abs(y - x), bound * (1 + 1e-12)) << x;
  }
  EXPECT_EQ(C::decode_value(C::encode_value(1e30f)), F::max);
  EXPECT_EQ(C::decode_value(C::encode_value(-1e30f)), -F::max);
  EXPECT_EQ(C::bits_per_value, 8.0);
}

TEST(Fp8Unscaled, RoundTripWithinFormatBound) {
  codec_round_trip<Fp8E4M3Unscaled>(0x1p-4, 0x1p-10, 0x1p-6);
  codec_round_trip<Fp8E5M2Unscaled>(0x1p-3, 0x1p-17, 0x1p-14);
  EXPECT_NE(codec_descriptor<Fp8E4M3Unscaled>(), codec_descriptor<Fp8E4M3<>>());
  EXPECT_NE(codec_descriptor<Fp8E4M3Unscaled>(), codec_descriptor<Fp8E5M2Unscaled>());
  EXPECT_NE(codec_descriptor<Fp8E4M3Unscaled>(), codec_descriptor<Int8<>>());
}

template <class C>
void simd_decode_equals_scalar() {
  for (int n : {8, 31, 64, 80, 130}) {
    std::vector<std::byte> codes(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) codes[static_cast<std::size_t>(i)] = static_cast<std::byte>((i * 37 + 11) % 256 == 0x7F ? 1 : (i * 37 + 11) % 256);
    std::vector<float> want(static_cast<std::size_t>(n)), got(want.size()), tmp(want.size() + 64);
    decode_row<C>(codes.data(), nullptr, n, want.data());
#if KVPACK_HAS_AVX2
    kernels::avx2::decode_row<C>(codes.data(), nullptr, n, got.data(), tmp.data());
#elif KVPACK_HAS_NEON
    kernels::neon::decode_row<C>(codes.data(), nullptr, n, got.data(), tmp.data());
#else
    got = want;
#endif
    for (int i = 0; i < n; ++i) {
      if (std::isnan(want[static_cast<std::size_t>(i)])) continue;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(i)]), std::bit_cast<std::uint32_t>(want[static_cast<std::size_t>(i)]))
          << "n=" << n << " i=" << i;
    }
  }
}

TEST(Fp8Unscaled, SimdDecodeEqualsScalar) {
  simd_decode_equals_scalar<Fp8E4M3Unscaled>();
  simd_decode_equals_scalar<Fp8E5M2Unscaled>();
}

// ---- Calibrated caches: the kernel is exact on what is stored ----

using E4 = Fp8E4M3Unscaled;
using HeadCache = Calibrated<KVCache<Keys<E4>, Values<E4>>>;
using ChannelCache = Calibrated<KVCache<Keys<E4>, Values<E4>>, Calibrate<PerChannelScale>>;

template <class Cache>
void kernel_exact_on_read_back(int D) {
  const ModelShape shape{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = D, .max_tokens = 512};
  kvtest::Harness<Cache> h(shape);
  std::uint32_t seed = 11u + static_cast<std::uint32_t>(D);
  for (int n : {1, 31, 33, 95, 1, 1}) {
    SCOPED_TRACE("D=" + std::to_string(D) + " chunk=" + std::to_string(n));
    auto k = kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed++, 3.f);
    for (std::size_t i = 5; i < k.size(); i += static_cast<std::size_t>(D)) k[i] *= 12.f;  // an outlier channel
    h.append(1, k, kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed++, 0.05f));
    EXPECT_LE(h.attend_error(1, kvtest::normal(static_cast<std::size_t>(n) * h.qrow(), seed++)), 1e-5);
  }
  const auto& cal = [&]() -> const auto& {
    if constexpr (requires { h.cache().inner().calibrated(0); }) return h.cache().inner();  // Rotated<Calibrated<>>
    else return h.cache();
  }();
  EXPECT_TRUE(cal.calibrated(1));  // from one token: later chunks may saturate (counted); the kernel stays exact
  EXPECT_FALSE(cal.calibrated(0));
}

TEST(CalibratedCache, KernelExactOnReadBack) {
  for (int D : {64, 80}) {
    kernel_exact_on_read_back<HeadCache>(D);
    kernel_exact_on_read_back<ChannelCache>(D);
    kernel_exact_on_read_back<Calibrated<KVCache<Keys<E4>, Values<E4>, Backend<Scalar>>, Calibrate<PerChannelScale>>>(D);
    kernel_exact_on_read_back<Calibrated<KVCache<Keys<E4>, Values<E4>, Sinks<2>, Residual<8>>>>(D);
    kernel_exact_on_read_back<Calibrated<KVCache<Keys<E4>, Values<Int4<Group<16>>>>, Calibrate<PerChannelScale, 1>>>(D);
    kernel_exact_on_read_back<Calibrated<KVCache<Keys<Fp8E5M2Unscaled>, Values<E4>>>>(D);
    kernel_exact_on_read_back<Rotated<Calibrated<KVCache<Keys<E4>, Values<E4>>>>>(D);
  }
}

TEST(CalibratedCache, PreRopeWithPerHeadScales) {
  using Cache = Calibrated<KVCache<Keys<E4>, Values<E4>, PreRope<>, Backend<Scalar>>>;
  using Exact = KVCache<Keys<Fp32>, Values<Fp32>, PreRope<>, Backend<Scalar>>;
  ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 256};
  auto c = Cache::create(shape).value();
  auto e = Exact::create(shape).value();
  std::uint32_t seed = 40;
  std::vector<float> k, v;
  int last = 0;
  for (int n : {33, 1, 31}) {
    const auto kn = kvtest::normal(static_cast<std::size_t>(n) * 128, seed++, 2.f);
    const auto vn = kvtest::normal(static_cast<std::size_t>(n) * 128, seed++, 0.1f);
    ASSERT_TRUE(c.append(0, kn, vn, kvtest::iota_positions(static_cast<std::int64_t>(k.size() / 128), n)));
    k.insert(k.end(), kn.begin(), kn.end());
    v.insert(v.end(), vn.begin(), vn.end());
    last = n;
  }
  // The exact cache gets what c attends over: its read-back rows (pre-RoPE, dequantized, scaled
  // back) for all but the current chunk, which attention reads exact.
  const int T = static_cast<int>(k.size() / 128);
  for (int h = 0; h < 2; ++h) {
    const auto rb = c.read_back(0, h);
    ASSERT_TRUE(rb);
    for (int t = 0; t < T - last; ++t)
      for (int d = 0; d < 64; ++d) {
        const std::size_t dst = (static_cast<std::size_t>(t) * 2 + static_cast<std::size_t>(h)) * 64 + static_cast<std::size_t>(d);
        k[dst] = rb->k[static_cast<std::size_t>(t) * 64 + static_cast<std::size_t>(d)];
        v[dst] = rb->v[static_cast<std::size_t>(t) * 64 + static_cast<std::size_t>(d)];
      }
  }
  ASSERT_TRUE(e.append(0, k, v, kvtest::iota_positions(0, T)));
  const auto q = kvtest::normal(4 * 64, seed++);
  std::vector<float> out(q.size()), want(q.size());
  ASSERT_TRUE(c.attend(0, q, out));
  ASSERT_TRUE(e.attend(0, q, want));
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5 * (1 + std::abs(want[i])));
}

// ---- the codec's bound at the calibrated scale, and the scale rule ----

TEST(CalibratedCache, ReadBackWithinBoundAndScalesFollowTheRule) {
  const ModelShape shape{.layers = 1, .q_heads = 2, .kv_heads = 2, .head_dim = 64, .max_tokens = 256};
  auto head = HeadCache::create(shape).value();
  auto chan = ChannelCache::create(shape).value();
  auto k = kvtest::normal(95 * 128, 3, 2.f);
  for (std::size_t i = 9; i < k.size(); i += 64) k[i] *= 20.f;                        // outlier channel 9
  for (std::size_t i = 17; i < k.size(); i += 64) k[i] = 1e-4f * (i % 3 == 0 ? 1.f : -1.f);  // quiet channel 17
  const auto v = kvtest::normal(95 * 128, 4, 0.02f);
  const auto pos = kvtest::iota_positions(0, 95);
  ASSERT_TRUE(head.append(0, k, v, pos));
  ASSERT_TRUE(chan.append(0, k, v, pos));
  for (int h = 0; h < 2; ++h) {
    double amax = 0, vmax = 0, cmax9 = 0;
    for (int t = 0; t < 95; ++t)
      for (int d = 0; d < 64; ++d) {
        const std::size_t i = (static_cast<std::size_t>(t) * 2 + static_cast<std::size_t>(h)) * 64 + static_cast<std::size_t>(d);
        amax = std::max<double>(amax, std::abs(k[i]));
        vmax = std::max<double>(vmax, std::abs(v[i]));
        if (d == 9) cmax9 = std::max<double>(cmax9, std::abs(k[i]));
      }
    EXPECT_FLOAT_EQ(head.key_scales(0)[static_cast<std::size_t>(h)], static_cast<float>(amax * 4 / 448));
    EXPECT_FLOAT_EQ(head.value_scales(0)[static_cast<std::size_t>(h)], static_cast<float>(vmax * 4 / 448));
    const auto cs = chan.key_scales(0).subspan(static_cast<std::size_t>(h) * 64, 64);
    EXPECT_FLOAT_EQ(cs[9], static_cast<float>(cmax9 * 4 / 448));
    EXPECT_FLOAT_EQ(cs[17], static_cast<float>(amax / 16 * 4 / 448));  // floored
    for (int which = 0; which < 2; ++which) {
      const auto rb = which == 0 ? head.read_back(0, h) : chan.read_back(0, h);
      ASSERT_TRUE(rb);
      const auto ks = which == 0 ? head.key_scales(0) : chan.key_scales(0);
      const auto vs = which == 0 ? head.value_scales(0) : chan.value_scales(0);
      const std::size_t per = which == 0 ? 1 : 64;
      for (int t = 0; t < 95; ++t)
        for (int d = 0; d < 64; ++d) {
          const std::size_t i = (static_cast<std::size_t>(t) * 2 + static_cast<std::size_t>(h)) * 64 + static_cast<std::size_t>(d);
          const std::size_t r = static_cast<std::size_t>(t) * 64 + static_cast<std::size_t>(d);
          const std::size_t si = static_cast<std::size_t>(h) * per + (per == 1 ? 0 : static_cast<std::size_t>(d));
          const double kb = 0x1p-4 * std::abs(k[i]) + 0x1p-10 * ks[si], vb = 0x1p-4 * std::abs(v[i]) + 0x1p-10 * vs[si];
          ASSERT_LE(std::abs(rb->k[r] - k[i]), kb * (1 + 1e-6)) << "which " << which << " t " << t << " d " << d;
          ASSERT_LE(std::abs(rb->v[r] - v[i]), vb * (1 + 1e-6)) << "which " << which << " t " << t << " d " << d;
        }
    }
  }
  // 8.0 bits: the blocks hold codes only; the scales add 4 bytes each.
  EXPECT_EQ(HeadCache::key_bits_per_value, 8.0);
  EXPECT_EQ(head.memory_bytes() - head.inner().memory_bytes(), 2u * 2u * sizeof(float));
  EXPECT_EQ(chan.memory_bytes() - chan.inner().memory_bytes(), 2u * 2u * 64u * sizeof(float));
  auto grouped = KVCache<Keys<Fp8E4M3<Group<32>>>, Values<Fp8E4M3<Group<32>>>>::create(shape).value();
  ASSERT_TRUE(grouped.append(0, k, v, pos));
  // Same layout but for the metadata: grouped FP8 stores 2 bytes per 32 values of K and V more.
  EXPECT_EQ(grouped.memory_bytes() - head.inner().memory_bytes(), 95u * 2u * 2u * (64u / 32u) * 2u);
}

// ---- saturation, set_scales, reset, failures ----

TEST(CalibratedCache, BeyondHeadroomSaturatesAndIsCounted) {
  const ModelShape shape{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 64, .max_tokens = 64};
  auto c = HeadCache::create(shape).value();
  std::vector<float> k(64, 1.f), v(64, 1.f);
  ASSERT_TRUE(c.append(0, k, v, kvtest::iota_positions(0, 1)));
  EXPECT_FLOAT_EQ(c.key_scales(0)[0], 4.f / 448);
  k[3] = 3.9f;   // within 4x headroom
  k[4] = 10.f;   // beyond: saturates to 448 * scale = 4
  v[5] = -50.f;  // beyond
  ASSERT_TRUE(c.append(0, k, v, kvtest::iota_positions(1, 1)));
  EXPECT_EQ(c.saturated_values(), 2);
  const auto rb = c.read_back(0, 0);
  ASSERT_TRUE(rb);
  EXPECT_NEAR(rb->k[64 + 3], 3.9f, 3.9 * 0x1p-4);
  EXPECT_FLOAT_EQ(rb->k[64 + 4], 4.f);
  EXPECT_FLOAT_EQ(rb->v[64 + 5], -4.f);
  c.reset();
  EXPECT_EQ(c.saturated_values(), 0);
  EXPECT_FALSE(c.calibrated(0));
  EXPECT_FLOAT_EQ(c.key_scales(0)[0], 1.f);
}

TEST(CalibratedCache, SetScalesValidatesAndSurvivesReset) {
  const ModelShape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 64};
  auto c = ChannelCache::create(shape).value();
  std::vector<float> ks(128, 0.5f), vs(128, 0.25f), few(127, 1.f);
  EXPECT_EQ(c.set_scales(2, ks, vs).error().code, Errc::invalid_argument);
  EXPECT_EQ(c.set_scales(0, few, vs).error().code, Errc::invalid_argument);
  EXPECT_EQ(c.set_scales(0, ks, {}).error().code, Errc::invalid_argument);
  ks[7] = NAN;
  EXPECT_EQ(c.set_scales(0, ks, vs).error().code, Errc::non_finite);
  ks[7] = 0.f;
  EXPECT_EQ(c.set_scales(0, ks, vs).error().code, Errc::invalid_argument);
  ks[7] = 0.5f;
  EXPECT_FALSE(c.calibrated(0));  // nothing changed
  EXPECT_FLOAT_EQ(c.key_scales(0)[7], 1.f);
  ASSERT_TRUE(c.set_scales(0, ks, vs));
  EXPECT_TRUE(c.calibrated(0));
  const auto k = kvtest::normal(3 * 128, 1, 8.f), v = kvtest::normal(3 * 128, 2, 8.f);
  ASSERT_TRUE(c.append(0, k, v, kvtest::iota_positions(0, 3)));
  ASSERT_TRUE(c.append(1, k, v, kvtest::iota_positions(0, 3)));
  EXPECT_FLOAT_EQ(c.key_scales(0)[5], 0.5f);  // the caller's, not the data's
  EXPECT_NE(c.key_scales(1)[5], 1.f);        // layer 1 calibrated from its data
  EXPECT_EQ(c.set_scales(0, ks, vs).error().code, Errc::invalid_argument);  // holds tokens
  c.reset();
  EXPECT_TRUE(c.calibrated(0));
  EXPECT_FLOAT_EQ(c.value_scales(0)[5], 0.25f);
  EXPECT_FALSE(c.calibrated(1));
  EXPECT_FLOAT_EQ(c.key_scales(1)[5], 1.f);
  // Keys-only scaling: the value role takes no scales.
  auto kc = Calibrated<KVCache<Keys<E4>, Values<Int8<>>>>::create(shape).value();
  EXPECT_TRUE(kc.value_scales(0).empty());
  std::vector<float> two(2, 1.f);
  EXPECT_EQ(kc.set_scales(0, two, two).error().code, Errc::invalid_argument);
  ASSERT_TRUE(kc.set_scales(0, two, {}));
}

TEST(CalibratedCache, ExtremeScalesStayFinite) {
  const ModelShape shape{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 64, .max_tokens = 64};
  // A first chunk of tiny values (its scale would be denormal): the head keeps scale 1, and a
  // later value of 1000 (beyond E4M3's 448) saturates, counted, instead of failing as Inf.
  auto tiny = HeadCache::create(shape).value();
  std::vector<float> k(64, 1e-37f), v(64, 1e-37f);
  ASSERT_TRUE(tiny.append(0, k, v, kvtest::iota_positions(0, 1)));
  EXPECT_FLOAT_EQ(tiny.key_scales(0)[0], 1.f);
  std::fill(k.begin(), k.end(), 1000.f);
  ASSERT_TRUE(tiny.append(0, k, v, kvtest::iota_positions(1, 1)));
  EXPECT_EQ(tiny.saturated_values(), 64);
  EXPECT_FLOAT_EQ(tiny.read_back(0, 0).value().k[64], 448.f);
  // set_scales refuses denormal scales and ones whose scaled queries could overflow.
  auto c = HeadCache::create(shape).value();
  for (const float bad : {1e-40f, 1e38f}) {
    const std::vector<float> s1{bad};
    EXPECT_EQ(c.set_scales(0, s1, s1).error().code, Errc::invalid_argument) << bad;
  }
  const std::vector<float> small{1e-30f};
  ASSERT_TRUE(c.set_scales(0, small, small));
  std::fill(k.begin(), k.end(), 1e10f);
  ASSERT_TRUE(c.append(0, k, v, kvtest::iota_positions(0, 1)));  // 1e10 / 1e-30 overflows: saturates, not Inf
  ASSERT_TRUE(c.append(0, v, v, kvtest::iota_positions(1, 1)));   // commits the first token
  EXPECT_EQ(c.saturated_values(), 64);
  EXPECT_FLOAT_EQ(c.read_back(0, 0).value().k[0], 448.f * 1e-30f);
  // E5M2: its max (57344) is the saturation point; never an Inf code.
  auto e5 = Calibrated<KVCache<Keys<Fp8E5M2Unscaled>, Values<Fp8E5M2Unscaled>>>::create(shape).value();
  std::fill(k.begin(), k.end(), 1.f);
  ASSERT_TRUE(e5.append(0, k, k, kvtest::iota_positions(0, 1)));
  std::fill(k.begin(), k.end(), 1e6f);
  ASSERT_TRUE(e5.append(0, k, k, kvtest::iota_positions(1, 1)));
  EXPECT_EQ(e5.saturated_values(), 128);
  const auto rb = e5.read_back(0, 0).value();
  EXPECT_FLOAT_EQ(rb.k[64], 57344.f * e5.key_scales(0)[0]);
  EXPECT_TRUE(std::isfinite(rb.v[64]));
}

// Logits are unchanged by the scaling, so eviction keeps the same tokens: with power-of-two
// scales (exact division) an H2O cache and its Calibrated twin hold and output the same bits.
TEST(CalibratedCache, EvictionUnchangedUnderPowerOfTwoScales) {
  using Plain = KVCache<Keys<E4>, Values<E4>, H2O<16, 16, 2>, Backend<Scalar>>;
  const ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 256};
  auto plain = Plain::create(shape).value();
  auto cal = Calibrated<Plain>::create(shape).value();
  const std::vector<float> ks{0.25f, 4.f}, vs{2.f, 0.125f};
  ASSERT_TRUE(cal.set_scales(0, ks, vs));
  std::uint32_t seed = 70;
  for (int n : {33, 1, 31, 1, 1, 95}) {
    auto k = kvtest::normal(static_cast<std::size_t>(n) * 128, seed++), v = kvtest::normal(static_cast<std::size_t>(n) * 128, seed++);
    const auto pos = kvtest::iota_positions(plain.tokens(0), n);
    ASSERT_TRUE(plain.append(0, k, v, pos));
    ASSERT_TRUE(cal.append(0, k, v, pos));
    const auto q = kvtest::normal(static_cast<std::size_t>(n) * 256, seed++);
    std::vector<float> a(q.size()), b(q.size());
    ASSERT_TRUE(plain.attend(0, q, a));
    ASSERT_TRUE(cal.attend(0, q, b));
    // Not bit-equal: fp8(x / s) * s differs from fp8(x) where x / s crosses the subnormal range.
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3 * (1 + std::abs(a[i])));
  }
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(plain.read_back(0, h).value().indices, cal.read_back(0, h).value().indices) << "head " << h;
    EXPECT_EQ(plain.held_tokens(0, h), cal.held_tokens(0, h));
  }
  cal.clear();
  EXPECT_EQ(cal.tokens(0), 0);
  EXPECT_FLOAT_EQ(cal.key_scales(0)[1], 4.f);  // the caller's scales survive clear()
}

TEST(CalibratedCache, FailedAppendCalibratesNothing) {
  const ModelShape shape{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 64, .max_tokens = 4};
  auto c = HeadCache::create(shape).value();
  std::vector<float> k(64 * 5, 2.f), v(64 * 5, 2.f);
  EXPECT_EQ(c.append(0, k, v, kvtest::iota_positions(0, 5)).error().code, Errc::capacity_exceeded);
  EXPECT_FALSE(c.calibrated(0));
  k.resize(64);
  v.resize(64);
  k[1] = NAN;
  EXPECT_EQ(c.append(0, k, v, kvtest::iota_positions(0, 1)).error().code, Errc::non_finite);
  EXPECT_EQ(c.append(0, std::span<const float>(k.data(), 63), v, kvtest::iota_positions(0, 1)).error().code,
            Errc::invalid_argument);
  EXPECT_FALSE(c.calibrated(0));
  EXPECT_EQ(c.tokens(0), 0);
  k[1] = 1.f;
  ASSERT_TRUE(c.append(0, k, v, kvtest::iota_positions(0, 1)));
  EXPECT_FLOAT_EQ(c.key_scales(0)[0], 2.f * 4 / 448);
  std::vector<float> q(128, 0.5f), out(128);
  EXPECT_EQ(c.attend(0, std::span<const float>(q.data(), 127), out).error().code, Errc::invalid_argument);
  EXPECT_EQ(c.attend(3, q, out).error().code, Errc::invalid_argument);
  ASSERT_TRUE(c.attend(0, q, out));
  for (std::size_t i = 0; i < 64; ++i) EXPECT_NEAR(out[i], v[i], 2 * 0x1p-4);
  EXPECT_FALSE(HeadCache::create({0, 2, 1, 64, 16}));
}

}  // namespace codec_fp8_calibrated_test
