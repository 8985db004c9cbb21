// Budget-typed eviction policies (issue #4, item 6): SinkWindowBudget, H2OBudget and SnapKVBudget
// take Tokens<N> or Fraction<Num, Den>. SinkWindow / H2O resolve a fraction against
// ModelShape::max_tokens at create(); SnapKV against the prompt length at compression, window
// included. Checked: the resolved budget is held exactly (odd budgets 1, 31, 33, 95 and round
// ones), the budget forms equal the integer forms they are documented to equal (same kept tokens,
// same attention), memory is constant once the window is full, errors for budgets too small.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int D = 16;

ModelShape shape(std::int64_t max_tokens, int q_heads = 2, int kv_heads = 1) {
  return {.layers = 1, .q_heads = q_heads, .kv_heads = kv_heads, .head_dim = D, .max_tokens = max_tokens};
}

// Streams `n` tokens into layer 0 in chunks of `chunk` (the last may be shorter), attending every
// chunk with random queries (H2O needs the attention mass; the others ignore it). Calls
// check(tokens_so_far) after every chunk.
template <class Cache, class Check>
void stream(Cache& c, std::int64_t n, std::int64_t chunk, std::uint32_t seed, Check&& check) {
  const auto& S = c.shape();
  const std::size_t row = static_cast<std::size_t>(S.kv_heads) * D, qrow = static_cast<std::size_t>(S.q_heads) * D;
  for (std::int64_t t0 = 0; t0 < n; t0 += chunk) {
    const std::int64_t m = std::min(chunk, n - t0);
    const auto um = static_cast<std::size_t>(m);
    const auto s = seed + static_cast<std::uint32_t>(t0) * 3;
    ASSERT_TRUE(c.append(0, kvtest::normal(um * row, s), kvtest::normal(um * row, s + 1), kvtest::iota_positions(t0, m)));
    std::vector<float> out(um * qrow);
    ASSERT_TRUE(c.attend(0, kvtest::normal(um * qrow, s + 2), out));
    check(t0 + m);
  }
}

// Every KV head of a continuously evicting cache holds exactly min(tokens seen, budget) tokens
// after every single-token append (pure decode evicts at token granularity).
template <class Cache>
void expect_holds_budget(std::int64_t max_tokens, std::int64_t budget) {
  SCOPED_TRACE(::testing::Message() << "max_tokens " << max_tokens << ", budget " << budget);
  auto c = Cache::create(shape(max_tokens, 4, 2)).value();
  EXPECT_EQ(c.eviction_budget(), budget);
  stream(c, 3 * budget + 7, 1, 11, [&](std::int64_t seen) {
    for (int h = 0; h < 2; ++h) ASSERT_EQ(c.held_tokens(0, h), std::min(seen, budget)) << "after " << seen;
  });
}

TEST(SinkWindowBudget, FractionOfMaxTokensIsHeldExactly) {
  expect_holds_budget<KVCache<SinkWindowBudget<Fraction<1, 4>, 0>>>(4, 1);        // 1 token, no sink
  expect_holds_budget<KVCache<SinkWindowBudget<Fraction<1, 4>, 0>>>(7, 1);        // floor(7 / 4)
  expect_holds_budget<KVCache<SinkWindowBudget<Fraction<1, 4>>>>(127, 31);        // floor(31.75)
  expect_holds_budget<KVCache<SinkWindowBudget<Fraction<1, 2>>>>(67, 33);         // floor(33.5)
  expect_holds_budget<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, SinkWindowBudget<Fraction<3, 4>, 1>>>(127, 95);
  expect_holds_budget<KVCache<SinkWindowBudget<Fraction<1, 2>>>>(128, 64);        // round
  expect_holds_budget<KVCache<SinkWindowBudget<Tokens<33>, 2>>>(1000, 33);        // Tokens: max_tokens unused
}

TEST(H2OBudget, FractionOfMaxTokensIsHeldExactly) {
  expect_holds_budget<KVCache<H2OBudget<Fraction<1, 4>, 0>>>(4, 1);  // heavy 0, recent 1
  expect_holds_budget<KVCache<H2OBudget<Fraction<1, 4>>>>(127, 31);  // heavy 15, recent 12, sinks 4
  expect_holds_budget<KVCache<H2OBudget<Fraction<1, 2>>>>(67, 33);
  expect_holds_budget<KVCache<Keys<Int8<Group<16>>>, Values<Int4<Group<16>>>, H2OBudget<Fraction<3, 4>, 2>>>(127, 95);
  expect_holds_budget<KVCache<H2OBudget<Fraction<1, 4>>>>(256, 64);  // round
}

TEST(EvictionBudgets, ResolvedSplitsAreDocumented) {
  using SW = SinkWindowBudget<Fraction<1, 4>>;
  EXPECT_EQ(SW::resolve_budget(4096), 1024);
  EXPECT_EQ(SW::recent_for(1024), 1020);
  using HB = H2OBudget<Fraction<1, 2>>;
  EXPECT_EQ(HB::resolve_budget(4096), 2048);
  EXPECT_EQ(HB::heavy_for(2048), 1024);
  EXPECT_EQ(HB::recent_for(2048), 1020);
  EXPECT_EQ(HB::recent_for(31), 12);  // 31 - 15 - 4
  using SK = SnapKVBudget<Fraction<1, 4>>;
  EXPECT_EQ(SK::held_after_compression(2048), 512);
  EXPECT_EQ(SK::held_after_compression(4090), 1022);
  EXPECT_EQ(SK::held_after_compression(100), 32) << "never below the observation window";
  EXPECT_EQ(SK::fixed_budget, 0);
  EXPECT_EQ((SnapKVBudget<Tokens<1024>>::held_after_compression(5000)), 1024);
  EXPECT_EQ((SnapKV<992>::held_after_compression(5000)), 1024);
}

// The budget forms behave exactly as the integer forms they resolve to: same tokens kept, same
// attention output, at every step of a chunked prefill followed by decode.
template <class A, class B>
void expect_same_as(std::int64_t max_tokens, std::int64_t n) {
  auto a = A::create(shape(max_tokens, 4, 2)).value();
  auto b = B::create(shape(max_tokens, 4, 2)).value();
  ASSERT_EQ(a.eviction_budget(), b.eviction_budget());
  const std::size_t row = 2 * D, qrow = 4 * D;
  std::int64_t t0 = 0;
  while (t0 < n) {
    const std::int64_t m = t0 < n / 2 ? 7 : 1;  // chunks of 7, then decode
    const auto um = static_cast<std::size_t>(m);
    const auto s = static_cast<std::uint32_t>(t0) * 5 + 1;
    const auto k = kvtest::normal(um * row, s), v = kvtest::normal(um * row, s + 1), q = kvtest::normal(um * qrow, s + 2);
    ASSERT_TRUE(a.append(0, k, v, kvtest::iota_positions(t0, m)));
    ASSERT_TRUE(b.append(0, k, v, kvtest::iota_positions(t0, m)));
    std::vector<float> oa(um * qrow), ob(um * qrow);
    ASSERT_TRUE(a.attend(0, q, oa));
    ASSERT_TRUE(b.attend(0, q, ob));
    ASSERT_EQ(oa, ob) << "token " << t0;
    for (int h = 0; h < 2; ++h) ASSERT_EQ(kvtest::kept_indices(a, 0, h), kvtest::kept_indices(b, 0, h)) << "token " << t0;
    t0 += m;
  }
  EXPECT_EQ(a.memory_bytes(), b.memory_bytes());
}

TEST(SinkWindowBudget, EqualsTheIntegerForm) {
  expect_same_as<KVCache<SinkWindowBudget<Fraction<1, 4>>>, KVCache<SinkWindow<4, 27>>>(127, 300);
  expect_same_as<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, SinkWindowBudget<Fraction<1, 2>>>,
                 KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, SinkWindow<4, 60>>>(128, 300);
}

TEST(H2OBudget, EqualsTheIntegerForm) {
  expect_same_as<KVCache<H2OBudget<Fraction<1, 4>>>, KVCache<H2O<15, 12, 4>>>(127, 300);
  expect_same_as<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, H2OBudget<Fraction<1, 2>, 2>>,
                 KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, H2O<33, 31, 2>>>(133, 300);  // 66 = 33 + 31 + 2
}

// Memory is constant once the budget is reached, however long the stream (ring reuse).
template <class Cache>
void expect_constant_memory(std::int64_t max_tokens, std::int64_t budget) {
  auto c = Cache::create(shape(max_tokens)).value();
  ASSERT_EQ(c.eviction_budget(), budget);
  std::size_t steady = 0;
  stream(c, 12'000, 1, 3, [&](std::int64_t seen) {
    if (seen == budget + 64) steady = c.memory_bytes();
    if (seen > budget + 64) {
      ASSERT_EQ(c.memory_bytes(), steady) << "after " << seen;
    }
  });
  EXPECT_GT(steady, 0u);
  EXPECT_EQ(c.held_tokens(0), budget);
}

TEST(SinkWindowBudget, ConstantMemoryAfterTheWindowFills) {
  expect_constant_memory<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, SinkWindowBudget<Fraction<1, 4>>>>(
      1024 + 3, 256);
}

TEST(H2OBudget, ConstantMemoryAfterTheWindowFills) {
  expect_constant_memory<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, H2OBudget<Fraction<1, 4>>>>(381, 95);
}

TEST(EvictionBudgets, FractionBelowTheSinksIsRejectedAtCreate) {
  // SinkWindowBudget<., 4> needs 5 tokens, H2OBudget<., 4> 9: Fraction<1, 4> of 16 is 4, of 32 is 8.
  auto sw = KVCache<SinkWindowBudget<Fraction<1, 4>>>::create(shape(16));
  ASSERT_FALSE(sw);
  EXPECT_EQ(sw.error().code, Errc::invalid_argument);
  EXPECT_TRUE((KVCache<SinkWindowBudget<Fraction<1, 4>>>::create(shape(20))));
  auto h = KVCache<H2OBudget<Fraction<1, 4>>>::create(shape(32));
  ASSERT_FALSE(h);
  EXPECT_EQ(h.error().code, Errc::invalid_argument);
  EXPECT_TRUE((KVCache<H2OBudget<Fraction<1, 4>>>::create(shape(36))));
}

// SnapKV: a prompt of P tokens in chunks of 16, every chunk attended; then compression (explicit
// or by the first decode append). Returns the cache after `decode` more single-token steps.
template <class Cache>
Cache snap_run(std::int64_t prompt, bool explicit_compress, int decode = 0) {
  auto c = Cache::create(shape(4096, 4, 2)).value();
  stream(c, prompt, 16, 21, [](std::int64_t) {});
  if (explicit_compress) {
    EXPECT_TRUE(c.compress_prompt(0));
  }
  const std::size_t row = 2 * D, qrow = 4 * D;
  for (int s = 0; s < decode; ++s) {
    EXPECT_TRUE(c.append(0, kvtest::normal(row, 900 + s), kvtest::normal(row, 950 + s), kvtest::iota_positions(prompt + s, 1)));
    EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(qrow, 990 + s)), 1e-5) << "decode step " << s;
  }
  return c;
}

// After compressing a prompt of P tokens every KV head holds max(floor(P * Num / Den), Window):
// the observation window (the last Window prompt tokens) plus the top-scored rest.
template <class Cache>
void expect_snap_keeps(std::int64_t prompt, std::int64_t kept) {
  SCOPED_TRACE(::testing::Message() << "prompt " << prompt << ", kept " << kept);
  constexpr int W = Cache::eviction_policy::window;
  for (bool explicit_compress : {true, false}) {
    const int decode = explicit_compress ? 0 : 3;
    auto c = snap_run<Cache>(prompt, explicit_compress, decode);
    EXPECT_EQ(c.eviction_budget(), kept);
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(c.held_tokens(0, h), kept + decode) << "kept prompt tokens, then plain appends";
      const auto idx = kvtest::kept_indices(c, 0, h);
      for (std::int64_t w = prompt - W; w < prompt; ++w) {
        EXPECT_TRUE(std::count(idx.begin(), idx.end(), w)) << "window token " << w;
      }
    }
  }
}

TEST(SnapKVBudget, FractionOfThePromptIsKeptWindowIncluded) {
  expect_snap_keeps<KVCache<SnapKVBudget<Fraction<1, 4>, 1, 1>>>(7, 1);  // floor(7/4) = 1: the window only
  expect_snap_keeps<KVCache<SnapKVBudget<Fraction<1, 4>, 8>>>(127, 31);  // 8 window + 23 selected
  expect_snap_keeps<KVCache<SnapKVBudget<Fraction<1, 2>, 8>>>(67, 33);
  expect_snap_keeps<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, SnapKVBudget<Fraction<3, 4>, 8>>>(127, 95);
  expect_snap_keeps<KVCache<SnapKVBudget<Fraction<1, 2>>>>(256, 128);    // round, default window 32
  expect_snap_keeps<KVCache<SnapKVBudget<Fraction<1, 4>>>>(2048, 512);   // WikiText's context at 25 %
}

TEST(SnapKVBudget, NeverBelowTheWindowAndNoCompressionWhenThePromptFits) {
  // Fraction<1, 4> of 100 is 25, below the 32-token window: the window (and so max(25, 32)) is kept.
  auto c = snap_run<KVCache<SnapKVBudget<Fraction<1, 4>>>>(100, true);
  EXPECT_EQ(c.held_tokens(0, 0), 32);
  EXPECT_EQ(c.eviction_budget(), 32);
  c.reset();
  EXPECT_EQ(c.eviction_budget(), 0) << "reset forgets the resolved fraction";
  // A prompt shorter than the window: nothing to evict, the first decode step does not compress.
  auto d = snap_run<KVCache<SnapKVBudget<Fraction<1, 2>, 32>>>(20, false, 2);
  EXPECT_EQ(d.held_tokens(0, 0), 22);
  EXPECT_EQ(d.eviction_budget(), 0) << "not compressed";
}

TEST(SnapKVBudget, EqualsTheIntegerForm) {
  // Fraction<1, 4> of a 128-token prompt = 32 = SnapKV<24, 8>'s budget + window; Tokens<32> too.
  using Int = KVCache<SnapKV<24, 8>>;
  for (bool explicit_compress : {true, false}) {
    auto a = snap_run<Int>(128, explicit_compress, 4);
    auto b = snap_run<KVCache<SnapKVBudget<Fraction<1, 4>, 8>>>(128, explicit_compress, 4);
    auto t = snap_run<KVCache<SnapKVBudget<Tokens<32>, 8>>>(128, explicit_compress, 4);
    EXPECT_EQ(t.eviction_budget(), 32);
    for (int h = 0; h < 2; ++h) {
      const auto ia = kvtest::kept_indices(a, 0, h);
      EXPECT_EQ(ia.size(), 36u);
      EXPECT_EQ(ia, kvtest::kept_indices(b, 0, h));
      EXPECT_EQ(ia, kvtest::kept_indices(t, 0, h));
    }
    const auto q = kvtest::normal(4 * D, 77);
    std::vector<float> oa(q.size()), ob(q.size());
    ASSERT_TRUE(a.attend(0, q, oa));
    ASSERT_TRUE(b.attend(0, q, ob));
    EXPECT_EQ(oa, ob);
  }
}

}  // namespace

namespace {

// max_tokens bounds the tokens held after eviction, not the tokens seen (KVCache::append): a
// Fraction<1, 1> budget equals max_tokens and must keep streaming for ever, one token at a time;
// a SnapKV fraction whose prompt fills max_tokens must still accept the compressing decode step.
TEST(EvictionBudgets, FullFractionOfMaxTokensKeepsStreaming) {
  expect_holds_budget<KVCache<SinkWindowBudget<Fraction<1, 1>>>>(40, 40);
  expect_holds_budget<KVCache<H2OBudget<Fraction<1, 1>>>>(41, 41);
  expect_holds_budget<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, SinkWindowBudget<Fraction<1, 1>, 2>>>(33, 33);
}

TEST(SnapKVBudget, FractionPromptFillingMaxTokensStillDecodes) {
  constexpr std::int64_t P = 95;
  auto c = KVCache<SnapKVBudget<Fraction<1, 2>, 8>>::create(shape(P, 4, 2)).value();
  stream(c, P, 33, 5, [](std::int64_t) {});  // the prompt fills max_tokens exactly
  const auto& S = c.shape();
  const std::size_t row = static_cast<std::size_t>(S.kv_heads) * D, qrow = static_cast<std::size_t>(S.q_heads) * D;
  for (std::int64_t t = 0; t < 5; ++t) {  // decode: the first step compresses to floor(95 / 2) = 47
    ASSERT_TRUE(c.append(0, kvtest::normal(row, 900 + 3 * static_cast<std::uint32_t>(t)),
                         kvtest::normal(row, 901 + 3 * static_cast<std::uint32_t>(t)), kvtest::iota_positions(P + t, 1)))
        << "decode step " << t;
    std::vector<float> out(qrow);
    ASSERT_TRUE(c.attend(0, kvtest::normal(qrow, 902 + 3 * static_cast<std::uint32_t>(t)), out));
    for (int h = 0; h < 2; ++h) EXPECT_EQ(c.held_tokens(0, h), 47 + t + 1) << "decode step " << t;
  }
}

}  // namespace
