// The fused kernel adds no error of its own: attention through every codec equals the float64
// reference run on the cache's own dequantized K/V (plus the exact current chunk) to 1e-5
// relative, for decode and causal prefill, GQA, odd token counts and several head_dims.
#include <gtest/gtest.h>

#include "kvpack/kvpack.hpp"
#include "support/cache_harness.hpp"
#include "support/sweep.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

template <class Cache>
class AttentionVsRef64 : public ::testing::Test {};

using Caches = ::testing::Types<
    KVCache<>, KVCache<Keys<Fp16>, Values<Fp16>>, KVCache<Keys<Int8<>>, Values<Int8<>>>,
    KVCache<Keys<Int8<Asymmetric, MetaF32>>, Values<Int8<Asymmetric>>>, KVCache<Keys<Int4<>>, Values<Int4<>>>,
    KVCache<Keys<Int4<Symmetric, Group<32>>>, Values<Int4<Symmetric>>>,
    KVCache<Keys<Fp8E4M3<>>, Values<Fp8E4M3<>>>, KVCache<Keys<Fp8E5M2<MetaF32>>, Values<Fp8E5M2<>>>,
    KVCache<Keys<Int4<>, PerChannel>, Values<Int4<>>, Residual<16>>,
    KVCache<Keys<Int8<Group<32>>, PerChannel>, Values<Int4<>>, Sinks<4>, Residual<8>, Blocks<32>>,
    KVCache<Keys<Int8<>>, Values<Int4<>>, Sinks<3>, Residual<5>, Blocks<16>>,
    KVCache<Keys<Int2<>, PerChannel>, Values<Int2<>>, Residual<16>>, KVCache<Keys<Int3<>>, Values<Int3<Group<16>>>>>;
TYPED_TEST_SUITE(AttentionVsRef64, Caches);

// Prefill in odd chunks, then decode steps; every attend is checked.
TYPED_TEST(AttentionVsRef64, OddChunksThenDecode) {
  for (int D : {64, 96, 128, 256}) {
    if (D % 32 != 0) continue;
    const ModelShape shape{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = D, .max_tokens = 2048};
    kvtest::Harness<TypeParam> h(shape);
    uint32_t seed = 1;
    // A short sweep (support/sweep.hpp) stops after the odd sizes and one decode step.
    const std::vector<int> chunks = kvtest::short_sweep() ? std::vector<int>{1, 31, 33, 95, 1}
                                                          : std::vector<int>{1, 31, 33, 95, 1, 1, 64, 1};
    for (int n : chunks) {
      const auto k = kvtest::normal(static_cast<size_t>(n) * h.row(), seed++);
      const auto v = kvtest::normal(static_cast<size_t>(n) * h.row(), seed++);
      h.append(1, k, v);
      const auto q = kvtest::normal(static_cast<size_t>(n) * h.qrow(), seed++);
      EXPECT_LE(h.attend_error(1, q), 1e-5) << "D=" << D << " chunk=" << n << " tokens=" << h.tokens();
    }
    // A query subset: only the last 7 tokens of a 40-token chunk.
    const auto k40 = kvtest::normal(40 * h.row(), seed++);
    const auto v40 = kvtest::normal(40 * h.row(), seed++);
    h.append(1, k40, v40);
    EXPECT_LE(h.attend_error(1, kvtest::normal(7 * h.qrow(), seed)), 1e-5);
  }
}

// A long decode over 1000 tokens with heavy-tailed keys.
TYPED_TEST(AttentionVsRef64, ThousandTokensHeavyTailed) {
  const ModelShape shape{.layers = 1, .q_heads = 9, .kv_heads = 3, .head_dim = 64, .max_tokens = 1100};
  kvtest::Harness<TypeParam> h(shape);
  std::mt19937 rng(7);
  std::student_t_distribution<float> t3(3.f);
  std::vector<float> k(1000 * h.row()), v(1000 * h.row());
  for (auto& x : k) x = t3(rng);
  for (auto& x : v) x = t3(rng);
  h.append(0, k, v);
  h.append(0, kvtest::normal(h.row(), 3), kvtest::normal(h.row(), 4));
  EXPECT_LE(h.attend_error(0, kvtest::normal(h.qrow(), 5, 0.5f)), 1e-5);
}

}  // namespace
