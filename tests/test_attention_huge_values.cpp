// Issue 23 item 4: values near the fp32 limit. With every value 1e37 (weights near uniform) the
// exact output is 1e37 in every channel; the kernels used to sum p * v unnormalized and overflow
// (l * 1e37 > 3.4e38 past ~34 tokens) into a non_finite error. Now the accumulation is normalized
// as it goes, so any finite input whose exact output is finite gets it, on every backend (scalar,
// the build's SIMD backend through Backend<Auto>, the keyframe kernel) and through split-K,
// compared with the float64 reference at odd sizes (1, 31, 33, 95 tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kvpack/kvpack.hpp"
#include "support/cache_harness.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

template <class Cache>
class HugeValues : public ::testing::Test {};

using HugeValueCaches =
    ::testing::Types<KVCache<Backend<Scalar>>, KVCache<Backend<Auto>>, KVCache<Keys<Fp16>, Values<Fp32>, Backend<Auto>>,
                     KVCache<Keys<Keyframe<8, Int8<>, Int8<>>>, Values<Fp32>>, KVCache<Sinks<2>, Blocks<16>>>;
TYPED_TEST_SUITE(HugeValues, HugeValueCaches);

std::vector<float> huge_values_filled(std::size_t n, float x) { return std::vector<float>(n, x); }

std::vector<float> huge_values_uniform(std::size_t n, std::uint32_t seed, float bound) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-bound, bound);  // double: bound - (-bound) overflows float
  std::vector<float> x(n);
  for (auto& e : x) e = static_cast<float>(u(rng));
  return x;
}

// The input: V = 1e37 everywhere, small random q, normal K; prefill then decode.
TYPED_TEST(HugeValues, AllValues1e37GiveThemBack) {
  for (const bool split : {false, true}) {
    const ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 512};
    kvtest::Harness<TypeParam> h(shape);
    if (split) h.cache().set_executor(thread_executor(2), 3);
    std::uint32_t seed = 11;
    for (int n : {1, 31, 33, 95, 1}) {
      const auto k = kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed++);
      h.append(0, k, huge_values_filled(static_cast<std::size_t>(n) * h.row(), 1e37f));
      const auto q = kvtest::normal(static_cast<std::size_t>(n) * h.qrow(), seed++, 0.05f);
      std::vector<float> out(q.size());
      auto st = h.cache().attend(0, q, out);
      ASSERT_TRUE(st) << st.error().message << " (tokens " << h.tokens() << ", split " << split << ")";
      for (float x : out) ASSERT_NEAR(x / 1e37f, 1.f, 1e-5f) << "tokens " << h.tokens();
    }
  }
}

// Mixed-sign values up to 3e38 (sums of a few already overflow fp32) against the float64 reference.
TYPED_TEST(HugeValues, ValuesNearFloatMaxMatchFloat64) {
  for (const bool split : {false, true}) {
    const ModelShape shape{.layers = 1, .q_heads = 6, .kv_heads = 3, .head_dim = 32, .max_tokens = 512};
    kvtest::Harness<TypeParam> h(shape);
    if (split) h.cache().set_executor(thread_executor(2), 2);
    std::uint32_t seed = 101;
    for (int n : {1, 31, 33, 95, 1, 1}) {
      const auto k = kvtest::normal(static_cast<std::size_t>(n) * h.row(), seed++);
      const auto v = huge_values_uniform(static_cast<std::size_t>(n) * h.row(), seed++, 3e38f);
      h.append(0, k, v);
      const auto q = kvtest::normal(static_cast<std::size_t>(n) * h.qrow(), seed++, 0.3f);
      EXPECT_LE(h.attend_error(0, q), 1e-5) << "tokens " << h.tokens() << ", split " << split;
    }
  }
}

// A logit beyond fp32 is still a clear error (documented), not a silent wrong answer.
TEST(HugeValuesLogits, OverflowingLogitIsNonFinite) {
  auto c = KVCache<>::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 8, .max_tokens = 8});
  ASSERT_TRUE(c);
  std::vector<float> k(8, 3e38f), v(8, 1.f), q(8, 3e38f), out(8);
  ASSERT_TRUE(c->append(0, k, v, std::vector<std::int32_t>{0}));
  auto st = c->attend(0, q, out);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::non_finite);
}

}  // namespace
