// Bad input gets a clear error and loses nothing: shapes, layers, capacity, NaN/Inf, queries.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file
using Cache = KVCache<Keys<Int4<>>, Values<Int8<>>, Residual<4>>;
const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 40};

struct Snapshot {
  int64_t tokens;
  size_t bytes;
  std::vector<float> k, v;
};
Snapshot snap(const Cache& c, int layer) {
  auto rb = c.read_back(layer, 1).value();
  return {c.tokens(layer), c.memory_bytes(), rb.k, rb.v};
}
void expect_unchanged(const Cache& c, int layer, const Snapshot& s) {
  const Snapshot now = snap(c, layer);
  EXPECT_EQ(now.tokens, s.tokens);
  EXPECT_EQ(now.bytes, s.bytes);
  EXPECT_EQ(now.k, s.k);
  EXPECT_EQ(now.v, s.v);
}

class KVCacheErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cache.append(0, kvtest::normal(30 * 128, 1), kvtest::normal(30 * 128, 2), kvtest::iota_positions(0, 30)));
  }
  Cache cache = Cache::create(kShape).value();
};

TEST_F(KVCacheErrors, CreateRejectsBadShapes) {
  auto expect_bad = [](ModelShape s, const char* needle) {
    auto r = Cache::create(s);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  };
  expect_bad({.layers = 0, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 8}, "positive");
  expect_bad({.layers = 1, .q_heads = 5, .kv_heads = 2, .head_dim = 64, .max_tokens = 8}, "multiple of kv_heads");
  expect_bad({.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 48, .max_tokens = 8}, "group size 32");
  expect_bad({.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = int64_t{1} << 33}, "2^31");
  expect_bad({.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 8, .attn_scale = NAN}, "attn_scale");
}

TEST_F(KVCacheErrors, WrongShapesAndLayers) {
  const Snapshot s = snap(cache, 0);
  auto st = cache.append(0, kvtest::normal(127, 3), kvtest::normal(128, 4), kvtest::iota_positions(30, 1));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
  EXPECT_NE(st.error().message.find("kv_heads * head_dim"), std::string::npos) << st.error().message;
  st = cache.append(2, kvtest::normal(128, 3), kvtest::normal(128, 4), kvtest::iota_positions(30, 1));
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("layer 2 out of range"), std::string::npos);
  st = cache.append(-1, kvtest::normal(128, 3), kvtest::normal(128, 4), kvtest::iota_positions(30, 1));
  EXPECT_FALSE(st);
  std::vector<float> q(4 * 64), out(4 * 64), small(10);
  EXPECT_FALSE(cache.attend(2, q, out));
  EXPECT_FALSE(cache.attend(0, small, small));
  EXPECT_FALSE(cache.attend(0, q, small));
  std::vector<float> q31(31 * 4 * 64), out31(q31.size());
  st = cache.attend(0, q31, out31);  // the latest append held 30 tokens
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("latest append held 30"), std::string::npos) << st.error().message;
  EXPECT_FALSE(cache.attend(1, q, out)) << "layer 1 holds no tokens yet";
  expect_unchanged(cache, 0, s);
}

TEST_F(KVCacheErrors, CapacityExceededWritesNothing) {
  const Snapshot s = snap(cache, 0);
  auto st = cache.append(0, kvtest::normal(11 * 128, 5), kvtest::normal(11 * 128, 6), kvtest::iota_positions(30, 11));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::capacity_exceeded);
  EXPECT_NE(st.error().message.find("max_tokens = 40"), std::string::npos) << st.error().message;
  expect_unchanged(cache, 0, s);
  EXPECT_TRUE(cache.append(0, kvtest::normal(10 * 128, 5), kvtest::normal(10 * 128, 6), kvtest::iota_positions(30, 10)));
  EXPECT_EQ(cache.tokens(0), 40);
}

TEST_F(KVCacheErrors, NonFiniteKeysOrValuesAreRejectedWithTheirLocation) {
  const Snapshot s = snap(cache, 0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (bool in_v : {false, true}) {
      auto k = kvtest::normal(3 * 128, 7), v = kvtest::normal(3 * 128, 8);
      (in_v ? v : k)[2 * 128 + 64 + 5] = bad;  // token 2 of the chunk, kv head 1, channel 5
      auto st = cache.append(0, k, v, kvtest::iota_positions(30, 3));
      ASSERT_FALSE(st);
      EXPECT_EQ(st.error().code, Errc::non_finite);
      const std::string& m = st.error().message;
      EXPECT_NE(m.find(in_v ? "non-finite V" : "non-finite K"), std::string::npos) << m;
      EXPECT_NE(m.find("layer 0, kv head 1, token 2 of the chunk (cache index 32), channel 5"), std::string::npos) << m;
      expect_unchanged(cache, 0, s);
    }
  }
  // The cache is still usable and attention stays finite.
  ASSERT_TRUE(cache.append(0, kvtest::normal(128, 9), kvtest::normal(128, 10), kvtest::iota_positions(30, 1)));
  std::vector<float> q = kvtest::normal(4 * 64, 11), out(4 * 64);
  ASSERT_TRUE(cache.attend(0, q, out));
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
}

TEST_F(KVCacheErrors, ResetZeroesAndRestarts) {
  ASSERT_GT(cache.memory_bytes(), 0u);
  cache.reset();
  EXPECT_EQ(cache.memory_bytes(), 0u);
  EXPECT_EQ(cache.tokens(0), 0);
  EXPECT_TRUE(cache.blocks(0, 0).empty());
  std::vector<float> q(4 * 64), out(4 * 64);
  EXPECT_FALSE(cache.attend(0, q, out)) << "nothing appended since reset";
  ASSERT_TRUE(cache.append(0, kvtest::normal(5 * 128, 12), kvtest::normal(5 * 128, 13), kvtest::iota_positions(0, 5)));
  EXPECT_EQ(cache.tokens(0), 5);
}

}  // namespace
