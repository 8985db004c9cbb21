// SnapKV: CASES C10 (GQA-aware selection, per KV head; mean vs max aggregation), the selection
// rule on hand-written scores, compaction, and decoding over the compressed cache.
#include <gtest/gtest.h>

#include <cmath>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace test_eviction_snapkv {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

TEST(SnapKVSelect, MaxPoolingThenRawThenOldest) {
  // Kernel 1: plain top-k, ties to the older token.
  EXPECT_EQ(eviction::snapkv_select({0.1f, 0.5f, 0.2f, 0.5f}, 1, 2), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(eviction::snapkv_select({0.3f, 0.3f, 0.3f}, 1, 2), (std::vector<int64_t>{0, 1}));
  // Kernel 3: neighbours of a spike inherit its pooled score; the spike itself wins on raw score,
  // then the older neighbour.
  EXPECT_EQ(eviction::snapkv_select({0.f, 0.f, 0.9f, 0.1f, 0.f, 0.f}, 3, 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(eviction::snapkv_select({0.f, 0.05f, 0.9f, 0.05f, 0.f}, 3, 2), (std::vector<int64_t>{1, 2}));
  // Budget covering everything keeps everything.
  EXPECT_EQ(eviction::snapkv_select({1.f, 2.f}, 5, 7), (std::vector<int64_t>{0, 1}));
}

// C10 shape: 8 query heads, 2 KV heads (query head h uses KV head h / 4), head_dim 4, 16 tokens.
constexpr int D = 4;
const ModelShape kShape{.layers = 1, .q_heads = 8, .kv_heads = 2, .head_dim = D, .max_tokens = 64};

std::vector<float> c10_keys() {
  auto k = kvtest::normal(16 * 2 * D, 7, 0.01f);
  auto put = [&](int t, int head, int axis) {
    for (int d = 0; d < D; ++d) k[(static_cast<size_t>(t) * 2 + head) * D + d] = d == axis ? 10.f : 0.f;
  };
  put(5, 0, 0);
  put(7, 0, 1);
  put(9, 1, 0);
  put(11, 1, 1);
  return k;
}

template <class Cache>
std::vector<std::vector<int64_t>> run_c10(const std::vector<float>& q_row) {
  auto c = Cache::create(kShape).value();
  const auto k = c10_keys();
  EXPECT_TRUE(c.append(0, k, kvtest::normal(k.size(), 8), kvtest::iota_positions(0, 16)));
  std::vector<float> q, out(16 * 8 * D);
  for (int t = 0; t < 16; ++t) q.insert(q.end(), q_row.begin(), q_row.end());
  EXPECT_TRUE(c.attend(0, q, out));
  EXPECT_TRUE(c.compress_prompt(0));
  EXPECT_LE(c.memory_bytes(), c.allocated_bytes());
  return {kvtest::kept_indices(c, 0, 0), kvtest::kept_indices(c, 0, 1)};
}

std::vector<float> query_heads(const std::vector<int>& axis_of_head, float gain = 1.f) {
  std::vector<float> q(8 * D, 0.f);
  for (int h = 0; h < 8; ++h) q[static_cast<size_t>(h) * D + static_cast<size_t>(axis_of_head[static_cast<size_t>(h)])] = gain;
  return q;
}

TEST(CaseC10, SnapKVKeepsPerKVHeadSets) {
  using Cache = KVCache<SnapKV<1, 2>>;  // budget 1 + observation window 2, pooling kernel 5
  const auto kept = run_c10<Cache>(query_heads({0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(kept[0], (std::vector<int64_t>{5, 14, 15}));
  EXPECT_EQ(kept[1], (std::vector<int64_t>{11, 14, 15}));
  // The compressed cache holds 2 KV heads, not 8 (no repeat_kv expansion of the GQA group):
  // each KV head keeps 3 rows, and those rows are that KV head's own keys, bit-exact (fp32).
  auto c = Cache::create(kShape).value();
  const auto k = c10_keys();
  ASSERT_TRUE(c.append(0, k, kvtest::normal(k.size(), 8), kvtest::iota_positions(0, 16)));
  std::vector<float> q, out(16 * 8 * D);
  const auto q_row = query_heads({0, 0, 0, 0, 1, 1, 1, 1});
  for (int t = 0; t < 16; ++t) q.insert(q.end(), q_row.begin(), q_row.end());
  ASSERT_TRUE(c.attend(0, q, out));
  ASSERT_TRUE(c.compress_prompt(0));
  const std::vector<int64_t> want[2] = {{5, 14, 15}, {11, 14, 15}};
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(c.held_tokens(0, h), 3);
    const auto rb = c.read_back(0, h).value();
    ASSERT_EQ(rb.indices, want[h]);
    ASSERT_EQ(rb.k.size(), 3u * D);
    for (size_t r = 0; r < 3; ++r)
      for (int d = 0; d < D; ++d)
        EXPECT_EQ(rb.k[r * D + static_cast<size_t>(d)],
                  k[(static_cast<size_t>(want[h][r]) * 2 + static_cast<size_t>(h)) * D + static_cast<size_t>(d)]);
  }
  EXPECT_EQ(c.held_tokens(0, 2), 0) << "there is no third KV head";
  // Bytes: at least 2 heads x 3 tokens of fp32 K, V and position (36 B), and well below the
  // 8 x 3 x 36 B that storing one copy per query head would need.
  const size_t row_bytes = 2 * D * sizeof(float) + sizeof(int32_t);
  EXPECT_GE(c.memory_bytes(), 2 * 3 * row_bytes);
  EXPECT_LT(c.memory_bytes(), 8 * 3 * row_bytes) << c.memory_bytes();
}

TEST(CaseC10, MeanAndMaxAggregationDifferAsDocumented) {
  // KV head 0's group: query head 0 looks along e0 (token 5) sharply; heads 1-3 look along e1
  // (token 7) weakly. Max over the group favours token 5, the mean favours token 7.
  std::vector<float> q = query_heads({0, 1, 1, 1, 1, 1, 1, 1});
  for (int d = 0; d < D; ++d) q[static_cast<size_t>(d)] *= 2.f;          // head 0: sharp
  for (size_t i = static_cast<size_t>(D); i < 4 * D; ++i) q[i] *= 0.6f;  // heads 1-3: broad
  // Float64 expectation from the same rule: per query head, softmax over the 16 keys for the two
  // window queries; aggregate over the group; compare tokens 5 and 7.
  const auto k = c10_keys();
  auto mass = [&](int head, int token) {
    double s[16], mx = -1e300, l = 0;
    for (int t = 0; t < 16; ++t) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += double{q[static_cast<size_t>(head) * D + d]} * k[(static_cast<size_t>(t) * 2) * D + d];
      s[t] = dot / 2.0;  // 1/sqrt(4)
      mx = std::max(mx, s[t]);
    }
    for (int t = 0; t < 16; ++t) l += std::exp(s[t] - mx);
    return 2 * std::exp(s[token] - mx) / l;  // both window queries are identical
  };
  double mean5 = 0, mean7 = 0, max5 = 0, max7 = 0;
  for (int h = 0; h < 4; ++h) {
    mean5 += mass(h, 5) / 4;
    mean7 += mass(h, 7) / 4;
    max5 = std::max(max5, mass(h, 5));
    max7 = std::max(max7, mass(h, 7));
  }
  ASSERT_GT(mean7, mean5) << "the input must make mean favour token 7";
  ASSERT_GT(max5, max7) << "the input must make max favour token 5";
  EXPECT_EQ((run_c10<KVCache<SnapKV<1, 2, 1>>>(q)[0]), (std::vector<int64_t>{7, 14, 15}));  // default: mean
  EXPECT_EQ((run_c10<KVCache<SnapKV<1, 2, 1, GroupAggregate::max>>>(q)[0]), (std::vector<int64_t>{5, 14, 15}));
}

TEST(SnapKV, FirstDecodeStepCompressesThenDecodingAppendsNormally) {
  using Cache = KVCache<Keys<Int8<>>, Values<Int4<>>, SnapKV<24, 8>, Blocks<16>>;
  auto c = Cache::create({.layers = 1, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 512}).value();
  const size_t row = 2 * 64, qrow = 6 * 64;
  // A 200-token prompt in chunks of 64, 64, 72, every query attended.
  for (int64_t t0 : {0, 64, 128}) {
    const int64_t n = t0 == 128 ? 72 : 64;
    ASSERT_TRUE(c.append(0, kvtest::normal(static_cast<size_t>(n) * row, 1 + static_cast<uint32_t>(t0)),
                         kvtest::normal(static_cast<size_t>(n) * row, 2 + static_cast<uint32_t>(t0)),
                         kvtest::iota_positions(t0, n)));
    EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(static_cast<size_t>(n) * qrow, 3)), 1e-5);
  }
  EXPECT_EQ(c.held_tokens(0), 200);
  const size_t before = c.memory_bytes();
  for (int s = 0; s < 20; ++s) {
    ASSERT_TRUE(c.append(0, kvtest::normal(row, 50 + s), kvtest::normal(row, 80 + s), kvtest::iota_positions(200 + s, 1)));
    EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(qrow, 90 + s)), 1e-5) << "step " << s;
    EXPECT_EQ(c.held_tokens(0, 0), 24 + 8 + s + 1) << "budget + window, then plain appends";
  }
  EXPECT_LT(c.memory_bytes(), before / 4);
  // Compaction: the kept tokens sit densely in cache-index order.
  for (int h = 0; h < 2; ++h) {
    const auto idx = kvtest::kept_indices(c, 0, h);
    EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
    EXPECT_EQ(c.blocks(0, h).size(), (static_cast<size_t>(24 + 8 + 19) + 15) / 16);
    for (int64_t w = 192; w < 200; ++w) EXPECT_TRUE(std::count(idx.begin(), idx.end(), w)) << "window token " << w;
  }
  EXPECT_FALSE(c.compress_prompt(0)) << "a second compression is refused";
}

TEST(SnapKV, ObservationWindowSpanningTwoChunksIsCausal) {
  // Regression: a prompt whose last chunk (2 tokens) is shorter than the observation window (4)
  // puts window queries 8 and 9 in the previous chunk. Query 8 must not see key 9 (a later
  // token): causally it gives ~0.8 of its mass to token 3, which then outranks token 5 (~0.37
  // from query 10). If query 8 sees key 9 (which it matches more strongly), token 3 drops to
  // ~0.03 and token 5 would be kept instead. Kernel 1, budget 1, head_dim 8, one head.
  constexpr int Dh = 8;
  using Cache = KVCache<SnapKV<1, 4, 1>>;
  auto c = Cache::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = Dh, .max_tokens = 64}).value();
  std::vector<float> k(12 * Dh, 0.f), v = kvtest::normal(12 * Dh, 5), q(12 * Dh, 0.f);
  k[3 * Dh + 0] = 5.f;   // token 3: matched by query 8
  k[9 * Dh + 0] = 10.f;  // token 9: matched more strongly by query 8, but it comes after it
  k[5 * Dh + 1] = 5.f;   // token 5: matched by query 10
  q[8 * Dh + 0] = 2.f;
  q[10 * Dh + 1] = 1.f;  // queries 9 and 11 are zero: uniform over what they see
  auto rows = [&](const std::vector<float>& x, int t0, int n) {
    return std::vector<float>(x.begin() + t0 * Dh, x.begin() + (t0 + n) * Dh);
  };
  std::vector<float> out(12 * Dh);
  ASSERT_TRUE(c.append(0, rows(k, 0, 10), rows(v, 0, 10), kvtest::iota_positions(0, 10)));
  ASSERT_TRUE(c.attend(0, rows(q, 0, 10), std::span<float>(out.data(), 10 * Dh)));
  ASSERT_TRUE(c.append(0, rows(k, 10, 2), rows(v, 10, 2), kvtest::iota_positions(10, 2)));
  ASSERT_TRUE(c.attend(0, rows(q, 10, 2), std::span<float>(out.data(), 2 * Dh)));
  // Float64 reference of the rule: causal softmax per window query, summed; keep the argmax.
  auto mass = [&](int token) {
    double total = 0;
    for (int i = 8; i < 12; ++i) {
      double l = 0, p = 0;
      for (int t = 0; t <= i; ++t) {
        double dot = 0;
        for (int d = 0; d < Dh; ++d) dot += double{q[static_cast<size_t>(i * Dh + d)]} * k[static_cast<size_t>(t * Dh + d)];
        const double e = std::exp(dot / std::sqrt(double{Dh}));
        l += e;
        if (t == token) p = e;
      }
      total += p / l;
    }
    return total;
  };
  ASSERT_GT(mass(3), mass(5)) << "the input must make the causal rule keep token 3";
  ASSERT_TRUE(c.compress_prompt(0));
  EXPECT_EQ(kvtest::kept_indices(c, 0, 0), (std::vector<int64_t>{3, 8, 9, 10, 11}));
}

}  // namespace
}  // namespace test_eviction_snapkv
