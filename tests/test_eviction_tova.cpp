// TOVA (eviction/tova.hpp): at every decode step the cache holds the reference set, where the
// victim is the token with the least attention from the latest query (float64 reference over the
// rows the cache holds), not the least cumulative attention (H2O); attention through the evicting
// cache matches ref64 over the rows it holds; memory is constant once the budget is reached.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "kvpack/eviction/tova.hpp"
#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int kTovaD = 8;
constexpr int kTovaBudget = 6;

// Float64 attention weights of each kept token for one query (summed over the GQA group's heads).
std::map<int64_t, double> tova_weights(const std::map<int64_t, std::vector<float>>& keys, const std::set<int64_t>& kept,
                                       const std::vector<float>& q, int group) {
  std::map<int64_t, double> w;
  const double scale = 1.0 / std::sqrt(static_cast<double>(kTovaD));
  for (int j = 0; j < group; ++j) {
    std::map<int64_t, double> logit;
    double mx = -1e300, sum = 0;
    for (int64_t t : kept) {
      double s = 0;
      for (int d = 0; d < kTovaD; ++d) s += static_cast<double>(q[j * kTovaD + d]) * keys.at(t)[static_cast<size_t>(d)];
      logit[t] = s * scale;
      mx = std::max(mx, logit[t]);
    }
    for (auto& [t, l] : logit) sum += std::exp(l - mx);
    for (auto& [t, l] : logit) w[t] += std::exp(l - mx) / sum;
  }
  return w;
}

int64_t tova_lowest(const std::map<int64_t, double>& score, const std::set<int64_t>& kept, int64_t newest, int sinks) {
  int64_t victim = -1;
  for (int64_t j : kept) {
    if (j < sinks || j == newest) continue;  // sinks stay; the newest append waits for the next one
    if (victim < 0 || score.at(j) < score.at(victim)) victim = j;  // strict: the older wins ties
  }
  return victim;
}

TEST(EvictionTova, KeepsTheTokensTheLatestQueryAttendsToAtEveryStep) {
  constexpr int group = 2, sinks = 1;
  using Cache = KVCache<TOVA<kTovaBudget, sinks>>;
  auto c = Cache::create({.layers = 1, .q_heads = group, .kv_heads = 1, .head_dim = kTovaD, .max_tokens = 64}).value();
  std::map<int64_t, std::vector<float>> keys;
  std::set<int64_t> kept;
  std::map<int64_t, double> latest, cumulative;  // TOVA's score and H2O's, for the same attends
  int differs_from_cumulative = 0;
  std::size_t memory_at_budget = 0;
  for (int64_t t = 0; t < 40; ++t) {
    keys[t] = kvtest::normal(kTovaD, static_cast<uint32_t>(100 + t));
    const auto v = kvtest::normal(kTovaD, static_cast<uint32_t>(500 + t));
    ASSERT_TRUE(c.append(0, keys[t], v, std::vector<int32_t>{static_cast<int32_t>(t)}));
    kept.insert(t);
    if (kept.size() > static_cast<size_t>(kTovaBudget)) {
      const int64_t victim = tova_lowest(latest, kept, t, sinks);
      ASSERT_GE(victim, 0);
      if (victim != tova_lowest(cumulative, kept, t, sinks)) ++differs_from_cumulative;
      kept.erase(victim);
    }
    ASSERT_EQ(std::vector<int64_t>(kept.begin(), kept.end()), kvtest::kept_indices(c, 0, 0)) << "step " << t;
    EXPECT_LE(c.held_tokens(0), kTovaBudget);
    if (t == kTovaBudget + 2) memory_at_budget = c.memory_bytes();
    if (t > kTovaBudget + 2) {
      EXPECT_EQ(c.memory_bytes(), memory_at_budget) << "step " << t;
    }

    const auto q = kvtest::normal(static_cast<size_t>(group) * kTovaD, static_cast<uint32_t>(900 + t), 2.f);
    EXPECT_LT(kvtest::evicting_attend_error(c, 0, q), 1e-5) << "step " << t;
    latest = tova_weights(keys, kept, q, group);
    for (const auto& [j, w] : latest) cumulative[j] += w;
  }
  EXPECT_GT(differs_from_cumulative, 0) << "the data never told TOVA and cumulative (H2O) scores apart";
}

TEST(EvictionTova, QuantizedCacheHoldsTheBudgetAndAttendsLikeRef64) {
  using Cache = KVCache<Keys<Int8<Group<8>>>, Values<Int8<Group<8>>>, TOVA<16, 2>>;
  auto c = Cache::create({.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = kTovaD, .max_tokens = 64}).value();
  const auto k = kvtest::normal(31 * 2 * kTovaD, 7), v = kvtest::normal(31 * 2 * kTovaD, 8);
  ASSERT_TRUE(c.append(1, k, v, kvtest::iota_positions(0, 31)));
  EXPECT_LT(kvtest::evicting_attend_error(c, 1, kvtest::normal(31 * 4 * kTovaD, 9)), 1e-5);
  for (int32_t t = 31; t < 64; ++t) {
    ASSERT_TRUE(c.append(1, kvtest::normal(2 * kTovaD, 10 + t), kvtest::normal(2 * kTovaD, 99 + t), std::vector<int32_t>{t}));
    EXPECT_LT(kvtest::evicting_attend_error(c, 1, kvtest::normal(4 * kTovaD, 300 + t)), 1e-5);
    for (int h = 0; h < 2; ++h) EXPECT_LE(c.held_tokens(1, h), 16);
    EXPECT_EQ(kvtest::kept_indices(c, 1, 0).front(), 0) << "sink 0 stays";
  }
  EXPECT_EQ(c.eviction_budget(), 16);
}

TEST(EvictionTova, CreateRejectsNothingAndNamesTheBudget) {
  static_assert(KVCache<TOVA<4>>::evicts_continuously);
  auto c = KVCache<TOVA<4>>::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 2, .max_tokens = 4});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->eviction_budget(), 4);
}

}  // namespace
