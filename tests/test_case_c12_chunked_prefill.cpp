// CASES C12: chunked prefill over already-compressed chunks equals one-shot prefill followed by
// the same quantization: bit-identical codes, and every chunk's output equals ref64 over the
// earlier chunks' dequantized K/V plus the chunk's own exact K/V.
#include <gtest/gtest.h>

#include <cstring>

#include "kvpack/kvpack.hpp"
#include "support/cache_harness.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

template <class Cache>
class CaseC12 : public ::testing::Test {};
using Caches = ::testing::Types<KVCache<Keys<Int4<>>, Values<Int4<>>>, KVCache<Keys<Int8<>>, Values<Int8<Asymmetric>>>,
                                KVCache<Keys<Fp8E4M3<>>, Values<Fp8E5M2<>>>, KVCache<Keys<Fp16>, Values<Fp16>>,
                                KVCache<Keys<Int4<>, PerChannel>, Values<Int4<>>, Residual<32>, Sinks<4>>,
                                KVCache<Keys<Int8<>, PerChannel>, Values<Int8<>>, Blocks<32>>,
                                KVCache<Keys<Int4<>>, Values<Int8<>>, Sinks<4>, Blocks<16>>>;
TYPED_TEST_SUITE(CaseC12, Caches);

TYPED_TEST(CaseC12, ChunkedEqualsOneShot) {
  const ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 512};
  const size_t row = 2 * 64, qrow = 4 * 64;
  const auto K = kvtest::normal(300 * row, 1), V = kvtest::normal(300 * row, 2), Q = kvtest::normal(300 * qrow, 3);

  auto one_shot = TypeParam::create(shape).value();
  ASSERT_TRUE(one_shot.append(0, K, V, kvtest::iota_positions(0, 300)));

  kvtest::Harness<TypeParam> chunked(shape);
  int64_t t0 = 0;
  for (int64_t n : {64, 1, 100, 135}) {
    const std::vector<float> k(K.begin() + t0 * row, K.begin() + (t0 + n) * row);
    const std::vector<float> v(V.begin() + t0 * row, V.begin() + (t0 + n) * row);
    const std::vector<float> q(Q.begin() + t0 * qrow, Q.begin() + (t0 + n) * qrow);
    chunked.append(0, k, v);
    EXPECT_LE(chunked.attend_error(0, q), 1e-5) << "chunk at " << t0;
    t0 += n;
  }
  EXPECT_EQ(chunked.cache().quantized_tokens(0), one_shot.quantized_tokens(0));
  EXPECT_EQ(chunked.cache().memory_bytes(), one_shot.memory_bytes());
  const BlockLayout& L = one_shot.block_layout();
  for (int h = 0; h < 2; ++h) {
    const auto a = one_shot.blocks(0, h), b = chunked.cache().blocks(0, h);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].header.count, b[i].header.count);
      EXPECT_EQ(0, std::memcmp(a[i].data.get(), b[i].data.get(), L.used_bytes(a[i].header.count) > 0 ? L.bytes : 0))
          << "block " << i << " of head " << h << " differs";
    }
    const auto ra = one_shot.read_back(0, h).value(), rb = chunked.cache().read_back(0, h).value();
    EXPECT_EQ(ra.k, rb.k);
    EXPECT_EQ(ra.v, rb.v);
    EXPECT_EQ(ra.positions, rb.positions);
  }
}

}  // namespace
