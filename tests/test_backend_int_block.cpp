// The AVX2 block path (kernels/avx2/int_block.hpp) against the float64 reference: per-token
// INT4/INT8 keys scored from their codes with an int16 query, values folded (INT4/INT8) or
// decoded (FP16, FP8, NF4), in every shape the path branches on: key groups of 32/64/128 channels
// (1, 2 or 4 groups per vphaddd batch, two batches at head_dim 256), fp16 and fp32 metadata,
// symmetric and asymmetric codes, block sizes that are not multiples of its 64-token chunk, GQA
// groups of 1-8 query heads (odd state counts take the 3-state value pass), several decode
// queries at once, and more than kBlockMaxStates states (the tile path). On other backends the
// same checks run the fp32 kernels. Tolerance: the harness's bound of the int16 query
// (kernels::query_int8_group) plus 1e-5 relative.
#include <gtest/gtest.h>

#include "kvpack/kvpack.hpp"
#include "support/cache_harness.hpp"
#include "support/sweep.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

template <class Cache>
class IntBlockPath : public ::testing::Test {};

using IntBlockCaches = ::testing::Types<
    KVCache<Keys<Int4<Group<64>>>, Values<Fp16>>,                                         // 2 groups per batch, decoded V
    KVCache<Keys<Int4<Symmetric, Group<128>>>, Values<Nf4<>>>,                            // 1 group per batch, codebook V
    KVCache<Keys<Int8<Asymmetric, Group<128>>>, Values<Int8<Asymmetric, Group<64>>>, Blocks<128>>,
    KVCache<Keys<Int8<Group<64>, MetaF32>>, Values<Int4<Group<64>, MetaF32>>, Blocks<16>>,  // fp32 metadata
    KVCache<Keys<Int4<>>, Values<Fp8E4M3<>>, Blocks<100>>,                                 // 64 + 36-token chunks
    KVCache<Keys<Int4<Symmetric>>, Values<Int4<Symmetric, Group<128>>>>,
    KVCache<Keys<Int8<>>, Values<Int8<>>, Sinks<2>, Residual<3>>>;
TYPED_TEST_SUITE(IntBlockPath, IntBlockCaches);

// Odd prefill chunks, then decode; GQA groups of 1, 3, 4 and 8 query heads; head_dim 64-256.
TYPED_TEST(IntBlockPath, MatchesReferenceAcrossShapes) {
  struct Case {
    int q_heads, kv_heads, D;
  };
  const Case cases[] = {{2, 2, 64}, {9, 3, 64}, {8, 2, 128}, {16, 2, 128}, {12, 4, 256}};
  uint32_t seed = 11;
  for (const Case& c : cases) {
    if (c.D % TypeParam::key_codec::group_size != 0 || c.D % TypeParam::value_codec::group_size != 0) continue;
    const ModelShape shape{.layers = 1, .q_heads = c.q_heads, .kv_heads = c.kv_heads, .head_dim = c.D, .max_tokens = 1024};
    kvtest::Harness<TypeParam> h(shape);
    const std::vector<int> chunks = kvtest::short_sweep() ? std::vector<int>{1, 31, 33, 95, 1}
                                                          : std::vector<int>{1, 31, 33, 95, 1, 130, 1, 1};
    for (int n : chunks) {
      const auto k = kvtest::normal(static_cast<size_t>(n) * h.row(), seed++);
      const auto v = kvtest::normal(static_cast<size_t>(n) * h.row(), seed++, 2.f);
      h.append(0, k, v);
      EXPECT_LE(h.attend_error(0, kvtest::normal(h.qrow(), seed++)), 1e-5)
          << "G=" << c.q_heads / c.kv_heads << " D=" << c.D << " tokens=" << h.tokens();
    }
    // Three decode queries at once (speculative verification): committed blocks stay fully visible.
    const auto k3 = kvtest::normal(3 * h.row(), seed++);
    const auto v3 = kvtest::normal(3 * h.row(), seed++);
    h.append(0, k3, v3);
    EXPECT_LE(h.attend_error(0, kvtest::normal(3 * h.qrow(), seed++)), 1e-5) << "3 queries, D=" << c.D;
  }
}

// 8 queries x a GQA group of 8 = 64 states, above kBlockMaxStates: the tile path; then one query.
TYPED_TEST(IntBlockPath, ManyStatesTakeTheTilePath) {
  const int D = 128;
  if (D % TypeParam::key_codec::group_size != 0 || D % TypeParam::value_codec::group_size != 0) GTEST_SKIP();
  const ModelShape shape{.layers = 1, .q_heads = 16, .kv_heads = 2, .head_dim = D, .max_tokens = 512};
  kvtest::Harness<TypeParam> h(shape);
  h.append(0, kvtest::normal(200 * h.row(), 1), kvtest::normal(200 * h.row(), 2));
  h.append(0, kvtest::normal(8 * h.row(), 3), kvtest::normal(8 * h.row(), 4));
  EXPECT_LE(h.attend_error(0, kvtest::normal(8 * h.qrow(), 5)), 1e-5);
  h.append(0, kvtest::normal(h.row(), 6), kvtest::normal(h.row(), 7));
  EXPECT_LE(h.attend_error(0, kvtest::normal(h.qrow(), 8)), 1e-5);
}

// Keys with one large channel and a query concentrated on it: logits spread over tens of units,
// so the softmax is peaked and the per-chunk max and rescale are exercised.
TYPED_TEST(IntBlockPath, PeakedSoftmax) {
  const int D = 128;
  if (D % TypeParam::key_codec::group_size != 0 || D % TypeParam::value_codec::group_size != 0) GTEST_SKIP();
  const ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = 1, .head_dim = D, .max_tokens = 512};
  kvtest::Harness<TypeParam> h(shape);
  auto k = kvtest::normal(300 * h.row(), 21);
  for (size_t t = 0; t < 300; ++t) k[t * h.row() + 5] = 6.f * std::sin(0.37f * static_cast<float>(t));
  h.append(0, k, kvtest::normal(300 * h.row(), 22));
  h.append(0, kvtest::normal(h.row(), 23), kvtest::normal(h.row(), 24));
  auto q = kvtest::normal(h.qrow(), 25, 0.2f);
  for (int hq = 0; hq < 4; ++hq) q[static_cast<size_t>(hq * D + 5)] = 8.f;
  EXPECT_LE(h.attend_error(0, q), 1e-5);
}

}  // namespace
