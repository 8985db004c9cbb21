// Planner (kvpack::plan::plan_bytes / plan_layers) against brute-force enumeration of every
// assignment on small random cases: many seeds, odd layer and candidate counts.
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <kvpack/plan/planner.hpp>

namespace {

using kvpack::plan::plan_bytes;

/// Least summed cost over every assignment with summed bytes <= budget (costs added in layer
/// order, as the planner does); +inf when none fits.
double brute(int L, int C, const std::vector<double>& cost, const std::vector<std::uint64_t>& bytes,
             std::uint64_t budget) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> ch(static_cast<size_t>(L), 0);
  for (;;) {
    double c = 0;
    std::uint64_t b = 0;
    for (int l = 0; l < L; ++l) {
      c += cost[size_t(l * C + ch[size_t(l)])];
      b += bytes[size_t(l * C + ch[size_t(l)])];
    }
    if (b <= budget && c < best) best = c;
    int l = 0;
    while (l < L && ++ch[size_t(l)] == C) ch[size_t(l++)] = 0;
    if (l == L) break;
  }
  return best;
}

struct Case {
  int L, C;
  std::vector<double> cost;
  std::vector<std::uint64_t> bytes;
};

Case random_case(std::mt19937_64& rng, int L, int C, std::uint64_t g, bool integer_costs) {
  Case k{L, C, {}, {}};
  std::uniform_int_distribution<int> units(0, 40), icost(0, 6);
  std::uniform_real_distribution<double> rcost(0.0, 1.0);
  for (int i = 0; i < L * C; ++i) {
    k.bytes.push_back(g * std::uint64_t(units(rng)) + 0);
    k.cost.push_back(integer_costs ? double(icost(rng)) : rcost(rng));
  }
  return k;
}

std::uint64_t sum_min(const Case& k) {
  std::uint64_t s = 0;
  for (int l = 0; l < k.L; ++l) {
    std::uint64_t m = UINT64_MAX;
    for (int c = 0; c < k.C; ++c) m = std::min(m, k.bytes[size_t(l * k.C + c)]);
    s += m;
  }
  return s;
}

// Byte counts multiples of a granularity: the DP is exact, its cost equals brute force's.
TEST(Planner, MatchesBruteForceOnExactGranularity) {
  std::mt19937_64 rng(12345);
  int checked = 0;
  for (int seed = 0; seed < 600; ++seed) {
    const int L = 1 + seed % 6;            // 1..6 layers
    const int C = 1 + (seed / 6) % 5;      // 1..5 candidates
    const std::uint64_t g = std::uint64_t{1} + (seed % 7) * 31;  // 1, 32, 63, ... bytes
    const Case k = random_case(rng, L, C, g, seed % 2 == 0);
    std::uint64_t maxb = 0;
    for (auto b : k.bytes) maxb += b;
    const std::uint64_t lo = sum_min(k);
    std::uniform_int_distribution<std::uint64_t> bud(lo, std::max(lo, maxb / std::uint64_t(C) + g * 3));
    const std::uint64_t budget = bud(rng);
    auto p = plan_bytes(L, C, k.cost, k.bytes, budget);
    ASSERT_TRUE(p) << p.error().message;
    const double want = brute(L, C, k.cost, k.bytes, budget);
    EXPECT_TRUE(p->exact) << "seed " << seed;
    EXPECT_LE(p->bytes, budget);
    EXPECT_DOUBLE_EQ(p->cost, want) << "seed " << seed << " L " << L << " C " << C;
    // The reported cost and bytes are those of the reported choice.
    double c = 0;
    std::uint64_t b = 0;
    for (int l = 0; l < L; ++l) {
      ASSERT_GE(p->choice[size_t(l)], 0);
      ASSERT_LT(p->choice[size_t(l)], C);
      c += k.cost[size_t(l * C + p->choice[size_t(l)])];
      b += k.bytes[size_t(l * C + p->choice[size_t(l)])];
    }
    EXPECT_EQ(c, p->cost);
    EXPECT_EQ(b, p->bytes);
    ++checked;
  }
  EXPECT_EQ(checked, 600);
}

// Byte counts with no common factor and a DP axis capped small: granularity is coarse, the plan
// still fits and is at least as good as brute force with the budget reduced by L * g.
TEST(Planner, CoarseGranularityIsConservativeAndBounded) {
  std::mt19937_64 rng(777);
  for (int seed = 0; seed < 300; ++seed) {
    const int L = 1 + seed % 5, C = 2 + seed % 3;
    Case k{L, C, {}, {}};
    std::uniform_int_distribution<std::uint64_t> by(1, 997);
    std::uniform_real_distribution<double> rc(0, 1);
    for (int i = 0; i < L * C; ++i) {
      k.bytes.push_back(by(rng));
      k.cost.push_back(rc(rng));
    }
    std::uint64_t maxb = 0;
    for (auto b : k.bytes) maxb += b;
    const std::uint64_t budget = sum_min(k) + (maxb - sum_min(k)) / 3 + 5;
    kvpack::plan::PlanOptions o;
    o.max_units = 33;  // forces g = ceil(budget / 33)
    auto p = plan_bytes(L, C, k.cost, k.bytes, budget, o);
    if (!p) {  // rounding up may make a tight budget unreachable: must say so, never return an over-budget plan
      EXPECT_EQ(p.error().code, kvpack::Errc::capacity_exceeded);
      continue;
    }
    EXPECT_LE(p->bytes, budget);
    EXPECT_GE(p->granularity, (budget + 32) / 33);
    EXPECT_GE(p->cost, brute(L, C, k.cost, k.bytes, budget) - 1e-12);
    const std::uint64_t slack = std::uint64_t(L) * p->granularity;
    if (budget > slack) {
      EXPECT_LE(p->cost, brute(L, C, k.cost, k.bytes, budget - slack) + 1e-12) << "seed " << seed;
    }
  }
}

TEST(Planner, InfeasibleBudgetIsAClearError) {
  const std::vector<double> cost{0.5, 0.1, 0.7, 0.2, 0.0, 0.3};
  const std::vector<std::uint64_t> bytes{10, 20, 11, 22, 13, 26};  // 3 layers x 2 candidates
  auto ok = plan_bytes(3, 2, cost, bytes, 34);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->bytes, 34u);
  EXPECT_EQ(ok->choice, (std::vector<int>{0, 0, 0}));
  auto bad = plan_bytes(3, 2, cost, bytes, 33);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, kvpack::Errc::capacity_exceeded);
  EXPECT_NE(bad.error().message.find("infeasible"), std::string::npos);
  EXPECT_NE(bad.error().message.find("34"), std::string::npos);  // names the minimum
  // Enough for one upgrade: the cheapest-cost upgrade per byte is layer 0 (saves 0.4 for 10 bytes).
  auto up = plan_bytes(3, 2, cost, bytes, 44);
  ASSERT_TRUE(up);
  EXPECT_EQ(up->choice, (std::vector<int>{1, 0, 0}));
  EXPECT_DOUBLE_EQ(up->cost, 0.1 + 0.7 + 0.0);
}

TEST(Planner, RejectsBadInput) {
  const std::vector<double> cost{0.5, -0.1};
  const std::vector<std::uint64_t> bytes{1, 2};
  EXPECT_EQ(plan_bytes(1, 2, cost, bytes, 10).error().code, kvpack::Errc::invalid_argument);
  EXPECT_EQ(plan_bytes(2, 2, std::vector<double>{0, 0}, bytes, 10).error().code, kvpack::Errc::invalid_argument);
  EXPECT_EQ(plan_bytes(0, 2, cost, bytes, 10).error().code, kvpack::Errc::invalid_argument);
  const std::vector<double> nan{0.5, std::numeric_limits<double>::quiet_NaN()};
  EXPECT_EQ(plan_bytes(1, 2, nan, bytes, 10).error().code, kvpack::Errc::invalid_argument);
}

// plan_layers scales bytes per token by the context and plans the same as plan_bytes.
TEST(Planner, TableScalesByContext) {
  kvpack::plan::SensitivityTable t;
  t.layers = 3;
  t.candidates = {"fp16", "int8", "int4"};
  t.cost = {0.0, 0.01, 0.30, 0.0, 0.02, 0.05, 0.0, 0.001, 0.002};
  t.bytes_per_token = {768, 408, 240, 768, 408, 240, 768, 408, 240};
  const std::int64_t ctx = 1031;
  // Uniform int8 plus 200 bytes/token: layer 2 drops to int4 so that layer 1 can take fp16.
  const std::uint64_t budget = (3 * 408 + 200) * std::uint64_t(ctx);
  auto p = kvpack::plan::plan_layers(t, budget, ctx);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_TRUE(p->exact);
  EXPECT_LE(p->bytes, budget);
  const std::vector<double> cost = t.cost;
  std::vector<std::uint64_t> b;
  for (double x : t.bytes_per_token) b.push_back(std::uint64_t(x) * std::uint64_t(ctx));
  EXPECT_DOUBLE_EQ(p->cost, brute(3, 3, cost, b, budget));
  EXPECT_EQ(p->choice, (std::vector<int>{1, 0, 2}));  // 0.01 + 0 + 0.002 beats all-int8 0.031
  EXPECT_EQ(kvpack::plan::bytes_for(1.0 / 3.0, 3), 1u);
  EXPECT_EQ(kvpack::plan::bytes_for(0.5, 3), 2u);
  EXPECT_FALSE(kvpack::plan::plan_layers(t, 1000, 0));
}

}  // namespace
