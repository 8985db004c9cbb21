// memory_bytes() equals the analytic size: bits per value x values + block headers + positions
// (+ full-precision rows for sinks and the residual window), from 1k to 64k tokens.
#include <gtest/gtest.h>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

template <class Cache>
class Memory : public ::testing::Test {};
using Caches = ::testing::Types<KVCache<>, KVCache<Keys<Fp16>, Values<Fp16>>, KVCache<Keys<Int8<>>, Values<Int8<>>>,
                                KVCache<Keys<Int4<>>, Values<Int4<>>>, KVCache<Keys<Int4<Group<64>>>, Values<Int4<Group<64>>>>,
                                KVCache<Keys<Fp8E4M3<>>, Values<Int4<>>>, KVCache<Keys<Int4<>, PerChannel>, Values<Int4<>>>>;
TYPED_TEST_SUITE(Memory, Caches);

TYPED_TEST(Memory, MatchesAnalyticSize) {
  const ModelShape shape{.layers = 2, .q_heads = 8, .kv_heads = 2, .head_dim = 64, .max_tokens = 65536};
  auto c = TypeParam::create(shape).value();
  const size_t row = 2 * 64;
  const auto chunk = kvtest::normal(1024 * row, 1);
  int64_t t = 0;
  for (int64_t target : {1000, 4096, 16384, 65535}) {
    while (t < target) {
      const int64_t n = std::min<int64_t>(1024, target - t);
      const std::vector<float> k(chunk.begin(), chunk.begin() + n * static_cast<int64_t>(row));
      for (int l = 0; l < 2; ++l) ASSERT_TRUE(c.append(l, k, k, kvtest::iota_positions(t, n)));
      t += n;
    }
    // Analytic: quantized tokens at the codecs' bits/value, pending tokens at fp32, 16 bytes of
    // header per block, and the positions: 4 bytes per token and KV head in slot-position caches,
    // else one run per layer (consecutive positions).
    const double q = static_cast<double>(c.quantized_tokens(0));
    const double pending = static_cast<double>(t) - q;
    const double values_per_token = 2.0 * 64;  // kv_heads x head_dim
    const double blocks = std::ceil(q / TypeParam::block_tokens) * 2;
    double per_layer = q * values_per_token * (TypeParam::key_bits_per_value + TypeParam::value_bits_per_value) / 8 +
                       pending * (values_per_token * 8 + 4) + blocks * sizeof(BlockHeader) +
                       (TypeParam::slot_positions ? q * 2 * 4 : (q > 0 ? sizeof(PositionRuns::Run) : 0));
    const double analytic = 2 * per_layer;
    const double measured = static_cast<double>(c.memory_bytes());
    EXPECT_NEAR(measured / analytic, 1.0, 0.01) << "tokens " << t;
    EXPECT_EQ(measured, analytic) << "tokens " << t << " (exact up to rounding)";
    // Allocation exceeds use by less than one block per (layer, head) plus working copies.
    EXPECT_GE(c.allocated_bytes(), c.memory_bytes());
  }
}

}  // namespace
