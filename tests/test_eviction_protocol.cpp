// Protocol<P, PromptOnce | FixedBudget> (issue 24): every eviction policy (SinkWindow, H2O,
// SnapKV, BlockSparse) at half the prompt under both protocols: tokens held after the prompt and
// after N decode steps, the policy's rule at the end of the prompt (sinks, recent window), and
// attention through the evicting quantized cache against float64 attention over the rows it holds,
// at odd prompt sizes (31, 33, 95 tokens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace test_eviction_protocol {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int D = 32, QH = 4, KH = 2, Steps = 40;
constexpr std::size_t Row = static_cast<std::size_t>(KH) * D, QRow = static_cast<std::size_t>(QH) * D;

// One case: an eviction policy at half the prompt, with its expected budget for a prompt of p
// tokens and the block granularity of its eviction (1: token-level).
template <class Policy, class Proto, int Granule = 1>
struct Case {
  using cache = KVCache<Keys<Int8<>>, Values<Int4<>>, Protocol<Policy, Proto>>;
  using protocol = Proto;
  static constexpr int granule = Granule;
  static constexpr bool fixed = std::is_same_v<Proto, FixedBudget>;
};
// Budgets per (layer, KV head) for a prompt of p tokens: floor(p / 2) raised to what each policy protects.
template <class Policy>
std::int64_t expected_budget(std::int64_t p) {
  if constexpr (requires { Policy::held_after_compression(p); }) return Policy::held_after_compression(p);
  else if constexpr (requires { Policy::protected_tokens; }) return std::max<std::int64_t>(p / 2, Policy::protected_tokens);
  else return std::max<std::int64_t>(p / 2, Policy::min_budget);
}

using SW = SinkWindowBudget<Fraction<1, 2>, 4>;
using HH = H2OBudget<Fraction<1, 2>, 2>;
using SK = SnapKVBudget<Fraction<1, 2>, 8, 3>;
using BS = BlockSparse<Fraction<1, 2>, 8, 1, 1>;

template <class C>
class EvictionProtocol : public ::testing::Test {};
using Cases = ::testing::Types<Case<SW, PromptOnce>, Case<SW, FixedBudget>, Case<HH, PromptOnce>, Case<HH, FixedBudget>,
                               Case<SK, PromptOnce>, Case<SK, FixedBudget>, Case<BS, PromptOnce, 8>,
                               Case<BS, FixedBudget, 8>>;
TYPED_TEST_SUITE(EvictionProtocol, Cases);

template <class C>
using policy_of = typename C::cache::eviction_policy::policy;

// Prompt of p tokens in one chunk (attended), then Steps decode steps; checks held tokens and
// attention against ref64 at every step.
template <class C>
void run_prompt_then_decode(int p) {
  using Cache = typename C::cache;
  auto c = Cache::create({.layers = 1, .q_heads = QH, .kv_heads = KH, .head_dim = D, .max_tokens = 512}).value();
  EXPECT_EQ(c.eviction_budget(), 0) << "a fraction of the prompt is unknown before the prompt";
  ASSERT_TRUE(c.append(0, kvtest::normal(p * Row, 1), kvtest::normal(p * Row, 2), kvtest::iota_positions(0, p)));
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(p * QRow, 3)), 1e-5);
  EXPECT_EQ(c.held_tokens(0, 0), p) << "nothing is evicted during the prompt";
  const std::int64_t K = expected_budget<policy_of<C>>(p);
  std::int64_t after_prompt = 0;
  for (int s = 0; s < Steps; ++s) {
    ASSERT_TRUE(c.append(0, kvtest::normal(Row, 10 + s), kvtest::normal(Row, 100 + s), kvtest::iota_positions(p + s, 1)));
    EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(QRow, 200 + s)), 1e-5) << "step " << s;
    for (int h = 0; h < KH; ++h) {
      const std::int64_t held = c.held_tokens(0, h);
      if (s == 0 && h == 0) {
        after_prompt = held;
        EXPECT_EQ(c.eviction_budget(), K);
        EXPECT_LE(held, std::min<std::int64_t>(p, K) + 1) << "the prompt end keeps the budget (+ the new token)";
        EXPECT_GT(held, std::min<std::int64_t>(p, K) - C::granule) << "block granularity at most";
      }
      if (C::fixed) {
        // Block granularity: protected blocks may hold up to one block above the budget for a step.
        EXPECT_LE(held, K + (C::granule > 1 ? C::granule : 0)) << "step " << s << " head " << h;
        EXPECT_GT(held, K - C::granule) << "step " << s << " head " << h;
      } else if (h == 0) {
        EXPECT_EQ(held, after_prompt + s) << "PromptOnce keeps every decoded token (step " << s << ")";
      }
    }
    // Every policy keeps the newest token and (token-level policies) its sinks.
    const auto kept = kvtest::kept_indices(c, 0, 1);
    EXPECT_TRUE(std::find(kept.begin(), kept.end(), p + s) != kept.end());
    if constexpr (C::granule == 1 && policy_of<C>::sink_tokens > 0) {
      for (int t = 0; t < policy_of<C>::sink_tokens; ++t) EXPECT_TRUE(std::find(kept.begin(), kept.end(), t) != kept.end());
    }
  }
}

TYPED_TEST(EvictionProtocol, Prompt31HoldsItsBudgetAndMatchesRef64) { run_prompt_then_decode<TypeParam>(31); }
TYPED_TEST(EvictionProtocol, Prompt33HoldsItsBudgetAndMatchesRef64) { run_prompt_then_decode<TypeParam>(33); }
TYPED_TEST(EvictionProtocol, Prompt95HoldsItsBudgetAndMatchesRef64) { run_prompt_then_decode<TypeParam>(95); }

// kvpack-eval's path: a chunked prompt (nothing evicted between chunks), compress_prompt, then
// chunked scoring: FixedBudget holds budget + one chunk, PromptOnce grows by every chunk.
TYPED_TEST(EvictionProtocol, ChunkedPromptThenCompressPromptThenChunks) {
  using C = TypeParam;
  auto c = C::cache::create({.layers = 2, .q_heads = QH, .kv_heads = KH, .head_dim = D, .max_tokens = 512}).value();
  const int p = 95, chunk = 16;
  for (int l = 0; l < 2; ++l)
    for (int t0 = 0; t0 < p; t0 += chunk) {
      const int n = std::min(chunk, p - t0);
      ASSERT_TRUE(c.append(l, kvtest::normal(n * Row, 1000 + t0), kvtest::normal(n * Row, 2000 + t0), kvtest::iota_positions(t0, n)));
      std::vector<float> q = kvtest::normal(n * QRow, 3000 + t0), out(q.size());
      ASSERT_TRUE(c.attend(l, q, out));
      EXPECT_EQ(c.held_tokens(l, 0), t0 + n);
    }
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(c.compress_prompt(l));
  EXPECT_FALSE(c.compress_prompt(0)) << "a prompt ends once";
  const std::int64_t K = expected_budget<policy_of<C>>(p);
  EXPECT_LE(c.held_tokens(0, 0), K);
  EXPECT_GT(c.held_tokens(0, 0), K - C::granule);
  const std::int64_t after_prompt = c.held_tokens(1, 1);
  for (int i = 0; i < 4; ++i) {
    const int t0 = p + i * chunk;
    ASSERT_TRUE(c.append(1, kvtest::normal(chunk * Row, 4000 + t0), kvtest::normal(chunk * Row, 5000 + t0),
                         kvtest::iota_positions(t0, chunk)));
    EXPECT_LE(kvtest::evicting_attend_error(c, 1, kvtest::normal(chunk * QRow, 6000 + t0)), 1e-5);
    if (C::fixed) EXPECT_LE(c.held_tokens(1, 1), K + chunk);
    else EXPECT_EQ(c.held_tokens(1, 1), after_prompt + (i + 1) * chunk);
  }
}

// The rule each policy applies at the end of the prompt, on KV head 0 of a 95-token prompt.
TEST(EvictionProtocolRule, SinkWindowKeepsSinksAndTheNewestTokens) {
  auto c = KVCache<Protocol<SW, FixedBudget>>::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 256})
               .value();
  ASSERT_TRUE(c.append(0, kvtest::normal(95 * D, 1), kvtest::normal(95 * D, 2), kvtest::iota_positions(0, 95)));
  ASSERT_TRUE(c.compress_prompt(0));
  std::vector<std::int64_t> want{0, 1, 2, 3};
  for (std::int64_t t = 95 - (47 - 4); t < 95; ++t) want.push_back(t);
  EXPECT_EQ(kvtest::kept_indices(c, 0, 0), want);
}

TEST(EvictionProtocolRule, H2OKeepsTheHeavyHitterOfThePrefillMass) {
  // Token 20's key is e0 and every query is e0 * 8: token 20 takes most of the prefill mass.
  auto c = KVCache<Protocol<HH, PromptOnce>>::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 256})
               .value();
  std::vector<float> k(95 * D, 0.f);
  k[20 * D] = 1.f;
  ASSERT_TRUE(c.append(0, k, kvtest::normal(95 * D, 2), kvtest::iota_positions(0, 95)));
  std::vector<float> q(95 * D, 0.f), out(q.size());
  for (int i = 0; i < 95; ++i) q[static_cast<std::size_t>(i) * D] = 8.f;
  ASSERT_TRUE(c.attend(0, q, out));
  ASSERT_TRUE(c.append(0, std::vector<float>(D, 0.f), std::vector<float>(D, 0.f), kvtest::iota_positions(95, 1)));
  const auto kept = kvtest::kept_indices(c, 0, 0);
  EXPECT_TRUE(std::find(kept.begin(), kept.end(), 20) != kept.end()) << "the heavy hitter survives the prompt end";
  EXPECT_EQ(kept.size(), 48u);  // 47 + the decode token
  EXPECT_EQ(kept.front(), 0);
}

}  // namespace
}  // namespace test_eviction_protocol
