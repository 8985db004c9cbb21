// Capacity limits of evicting caches: SinkWindow and H2O with max_tokens equal to their budget
// decode for ever (memory is constant once the budget is reached), SnapKV decodes after a prompt
// of exactly max_tokens, and a chunk that cannot fit even after eviction is refused with nothing
// written (CASES C8's kept set). The other adversarial calls: test_adversarial_api.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace test_adversarial_capacity {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

// SinkWindow<S, W> / H2O with max_tokens equal to the budget: "memory is constant once S + W
// tokens have arrived", so decoding must go on for ever (it used to stop with capacity_exceeded
// at the budget, because the check counted the tokens held before this append's eviction).
template <class C>
void streams_at_max_tokens_equal_to_budget(std::int64_t budget) {
  constexpr int D = 8;
  C c = C::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = budget}).value();
  for (int t = 0; t < 100; ++t) {
    std::vector<float> kv(D, 0.f);
    kv[0] = static_cast<float>(t);
    const Status s = c.append(0, kv, kv, kvtest::iota_positions(t, 1));
    ASSERT_TRUE(s) << "token " << t << ": " << s.error().message;
    std::vector<float> q(D, 0.f), out(D);
    q[1] = 1.f;
    ASSERT_TRUE(c.attend(0, q, out));
    ASSERT_LE(c.held_tokens(0), budget);
  }
  EXPECT_EQ(c.held_tokens(0), budget);
  // A chunk that cannot fit even after eviction is still refused, with nothing written.
  const HeadContents before = c.read_back(0, 0).value();
  const auto n = static_cast<std::size_t>(budget + 1);
  std::vector<float> big(n * D, 1.f);
  const Status s = c.append(0, big, big, kvtest::iota_positions(100, static_cast<std::int64_t>(n)));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::capacity_exceeded);
  const HeadContents after = c.read_back(0, 0).value();
  EXPECT_EQ(after.positions, before.positions);
  EXPECT_EQ(after.k, before.k);
  EXPECT_EQ(c.tokens(0), 100);
}

TEST(AdversarialApiCapacity, SinkWindowStreamsWithMaxTokensEqualToItsBudget) {
  streams_at_max_tokens_equal_to_budget<KVCache<SinkWindow<4, 8>>>(12);
  // The kept set is still exactly the sinks and the window (CASES C8).
  KVCache<SinkWindow<4, 8>> c =
      KVCache<SinkWindow<4, 8>>::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 8, .max_tokens = 12}).value();
  for (int t = 0; t < 100; ++t) {
    std::vector<float> kv(8, static_cast<float>(t));
    ASSERT_TRUE(c.append(0, kv, kv, kvtest::iota_positions(t, 1)));
  }
  EXPECT_EQ(c.read_back(0, 0).value().positions, (std::vector<std::int32_t>{0, 1, 2, 3, 92, 93, 94, 95, 96, 97, 98, 99}));
}
TEST(AdversarialApiCapacity, H2OStreamsWithMaxTokensEqualToItsBudget) {
  streams_at_max_tokens_equal_to_budget<KVCache<H2O<4, 4, 2>>>(10);
}
TEST(AdversarialApiCapacity, SinkWindowWithSinksAndResidualStreams) {
  // Sinks<2> (fp32) + Residual<4> around SinkWindow<2, 8>: budget 10, every token counted.
  streams_at_max_tokens_equal_to_budget<
      KVCache<Keys<Int8<Group<8>>>, Values<Int8<Group<8>>>, Sinks<2>, Residual<4>, SinkWindow<2, 8>>>(10);
}

// SnapKV with max_tokens equal to the prompt: the first decode token compresses the prompt to
// Budget + Window tokens, so it fits (it used to be refused, counted before compression); after
// that SnapKV no longer evicts, so the cache fills up and then refuses, changing nothing.
TEST(AdversarialApiCapacity, SnapKVDecodesAfterAPromptOfExactlyMaxTokens) {
  using C = KVCache<Keys<Int8<Group<8>>>, Values<Int8<Group<8>>>, SnapKV<8, 4>>;
  constexpr int D = 8;
  constexpr std::int64_t kMax = 32;
  C c = C::create({.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = D, .max_tokens = kMax}).value();
  ASSERT_TRUE(c.append(0, kvtest::normal(kMax * D, 1), kvtest::normal(kMax * D, 2), kvtest::iota_positions(0, kMax)));
  std::vector<float> q = kvtest::normal(kMax * 2 * D, 3), out(q.size());
  ASSERT_TRUE(c.attend(0, q, out));
  std::int64_t t = kMax;
  do {
    const Status s = c.append(0, kvtest::normal(D, 10 + static_cast<std::uint32_t>(t)),
                              kvtest::normal(D, 500 + static_cast<std::uint32_t>(t)), kvtest::iota_positions(t, 1));
    ASSERT_TRUE(s) << "token " << t << ": " << s.error().message;
    if (t == kMax) {
      ASSERT_EQ(c.held_tokens(0), 8 + 4 + 1) << "the first decode token compresses the prompt";
    }
    std::vector<float> q1 = kvtest::normal(2 * D, 900 + static_cast<std::uint32_t>(t)), o1(q1.size());
    ASSERT_TRUE(c.attend(0, q1, o1));
    ++t;
  } while (c.held_tokens(0) < kMax);
  EXPECT_EQ(t, kMax + (kMax - 12));
  const HeadContents before = c.read_back(0, 0).value();
  const Status s = c.append(0, kvtest::normal(D, 7), kvtest::normal(D, 8), kvtest::iota_positions(t, 1));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::capacity_exceeded);
  EXPECT_EQ(c.read_back(0, 0).value().indices, before.indices);
  EXPECT_EQ(c.tokens(0), t);
}

}  // namespace
}  // namespace test_adversarial_capacity
