// H2O heavy hitters: CASES C9 (newcomers are not starved; kept set equals a reference at every
// step) with attention rows written by hand through the keys and queries, plus attention
// through an evicting quantized cache against ref64 over exactly the rows it holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace test_eviction_h2o {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

// Budget 8 = 2 sinks + 2 recent + 4 heavy.
using Cache = KVCache<H2O<4, 2, 2>>;
constexpr int D = 16;

TEST(CaseC9, HandWrittenRowsKeepTheReferenceSetAtEveryStep) {
  auto c = Cache::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 64, .attn_scale = 1.f})
               .value();
  std::set<int64_t> kept;
  std::map<int64_t, double> score;
  std::set<int64_t> prompt_set;
  const int prompt = 8, steps = 20;
  for (int64_t t = 0; t < prompt + steps; ++t) {
    // Token 5's key is e0; every other key is zero, so the query e0 * c gives token 5 a
    // probability set by c and every other kept token an equal share.
    std::vector<float> k(D, 0.f), v = kvtest::normal(D, static_cast<uint32_t>(t));
    if (t == 5) k[0] = 1.f;
    ASSERT_TRUE(c.append(0, k, v, std::vector<int32_t>{static_cast<int32_t>(t)}));

    // Reference eviction: sinks {0,1}, recent {t-1, t}, ties evict the oldest.
    kept.insert(t);
    while (kept.size() > 8) {
      int64_t victim = -1;
      for (int64_t j : kept) {
        if (j < 2 || j >= t - 1) continue;
        if (victim < 0 || score[j] < score[victim]) victim = j;  // strict: the older wins ties
      }
      ASSERT_GE(victim, 0);
      kept.erase(victim);
    }
    const auto got = kvtest::kept_indices(c, 0, 0);
    ASSERT_EQ(std::vector<int64_t>(kept.begin(), kept.end()), got) << "step " << t;
    EXPECT_TRUE(kept.count(t)) << "the newcomer must be present at its own step";
    if (t >= 5) {
      EXPECT_TRUE(kept.count(5)) << "the heavy hitter must stay";
    }

    // This step's row: token 5 gets 0.3 (when held and not alone), the rest share equally.
    const auto n = static_cast<double>(kept.size());
    std::vector<float> q(D, 0.f);
    const bool five = kept.count(5) && kept.size() > 1;
    if (five) q[0] = static_cast<float>(std::log(0.3 * (n - 1) / 0.7));
    std::vector<float> out(D);
    ASSERT_TRUE(c.attend(0, q, out));
    for (int64_t j : kept) score[j] += five ? (j == 5 ? 0.3 : 0.7 / (n - 1)) : 1.0 / n;
    if (t == prompt - 1) prompt_set = kept;
  }
  EXPECT_NE(prompt_set, kept) << "the set at step 20 must not be the prompt's set";
}

TEST(H2OAttention, EvictingQuantizedCacheMatchesRef64OverHeldRows) {
  using Q = KVCache<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Residual<4>, H2O<16, 8, 2>, Blocks<16>>;
  auto c = Q::create({.layers = 1, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 256}).value();
  const size_t row = 2 * 64, qrow = 6 * 64;
  // Prefill 40 tokens, then 60 decode steps; budget 2 + 8 + 16 = 26 tokens.
  ASSERT_TRUE(c.append(0, kvtest::normal(40 * row, 1), kvtest::normal(40 * row, 2), kvtest::iota_positions(0, 40)));
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(40 * qrow, 3)), 1e-5);
  for (int s = 0; s < 60; ++s) {
    ASSERT_TRUE(c.append(0, kvtest::normal(row, 10 + s), kvtest::normal(row, 100 + s), kvtest::iota_positions(40 + s, 1)));
    EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(qrow, 200 + s)), 1e-5) << "step " << s;
    EXPECT_LE(c.held_tokens(0, 0), 26);
    EXPECT_LE(c.held_tokens(0, 1), 26);
  }
  // Heads decide independently (their keys differ), and memory is bounded by the budget.
  const size_t steady = c.memory_bytes();
  for (int s = 60; s < 90; ++s) {
    ASSERT_TRUE(c.append(0, kvtest::normal(row, 10 + s), kvtest::normal(row, 100 + s), kvtest::iota_positions(40 + s, 1)));
    std::vector<float> q = kvtest::normal(qrow, 200 + s), out(qrow);
    ASSERT_TRUE(c.attend(0, q, out));
  }
  EXPECT_EQ(c.memory_bytes(), steady);
}

}  // namespace
}  // namespace test_eviction_h2o
