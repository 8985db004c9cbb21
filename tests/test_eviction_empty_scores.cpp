// Issue 23 items 1 and 2: eviction that runs without the scores it ranks by.
//  1. SnapKV compresses the prompt once, when decoding starts, and only a prompt longer than
//     Budget + Window: a prompt that fits is never compressed mid-decode (it used to be, as soon
//     as the running total passed Budget + Window, evicting position 0).
//  2. SnapKV asked to compress a prompt that was never attended refuses (Errc::invalid_argument,
//     cache unchanged) instead of keeping the oldest tokens from all-zero scores. H2O's documented
//     fallback: tokens with no attention mass yet rank lowest and the oldest goes first, so an
//     H2O cache that is never attended keeps exactly what SinkWindow<S, Heavy + Recent> keeps.
// Each test runs on the scalar kernel and the build's SIMD kernel (Backend<Auto>: AVX2, NEON).
#include <gtest/gtest.h>

#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace test_eviction_empty_scores {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

template <class B>
class EmptyScores : public ::testing::Test {};
using Backends = ::testing::Types<Backend<Scalar>, Backend<Auto>>;
TYPED_TEST_SUITE(EmptyScores, Backends);

constexpr int D = 8;
const ModelShape kShape{.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 64};

template <class Cache>
void append_attend(Cache& c, int64_t t0, int64_t n, uint32_t seed, bool attend = true) {
  ASSERT_TRUE(c.append(0, kvtest::normal(static_cast<size_t>(n) * D, seed), kvtest::normal(static_cast<size_t>(n) * D, seed + 1),
                       kvtest::iota_positions(t0, n)));
  if (!attend) return;
  std::vector<float> q = kvtest::normal(static_cast<size_t>(n) * D, seed + 2), out(q.size());
  auto st = c.attend(0, q, out);
  ASSERT_TRUE(st) << st.error().message;
}

// The input: SnapKV<4, 8> (compression keeps 12), a 9-token prompt, 6 decode steps.
TYPED_TEST(EmptyScores, SnapKVPromptThatFitsIsNeverCompressedMidDecode) {
  auto c = KVCache<SnapKV<4, 8>, TypeParam>::create(kShape).value();
  append_attend(c, 0, 9, 1);
  for (int s = 0; s < 6; ++s) {
    append_attend(c, 9 + s, 1, 10 + 3 * static_cast<uint32_t>(s));
    EXPECT_EQ(c.held_tokens(0), 10 + s) << "decode step " << s << ": nothing may be evicted";
    EXPECT_EQ(kvtest::kept_indices(c, 0, 0).front(), 0) << "position 0 (the attention sink) stays, step " << s;
  }
  EXPECT_FALSE(c.compress_prompt(0)) << "decoding has started: the prompt phase is over";
  // And the cache still attends correctly over everything it holds.
  append_attend(c, 15, 1, 40, false);
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(D, 41)), 1e-5);
}

// The documented path still compresses: a 20-token prompt (longer than 12), attended.
TYPED_TEST(EmptyScores, SnapKVLongPromptStillCompressesAtTheFirstDecodeStep) {
  auto c = KVCache<SnapKV<4, 8>, TypeParam>::create(kShape).value();
  append_attend(c, 0, 20, 2);
  append_attend(c, 20, 1, 30);
  EXPECT_EQ(c.held_tokens(0), 13);
  append_attend(c, 21, 1, 33);
  EXPECT_EQ(c.held_tokens(0), 14) << "then plain appends";
}

TYPED_TEST(EmptyScores, SnapKVRefusesToCompressANeverAttendedPrompt) {
  auto c = KVCache<SnapKV<4, 8>, TypeParam>::create(kShape).value();
  append_attend(c, 0, 20, 3, /*attend=*/false);
  const auto before = kvtest::kept_indices(c, 0, 0);
  const size_t bytes = c.memory_bytes();
  const auto k = kvtest::normal(D, 50), v = kvtest::normal(D, 51);
  auto st = c.append(0, k, v, kvtest::iota_positions(20, 1));
  ASSERT_FALSE(st) << "a selection from all-zero scores must not pass silently";
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
  EXPECT_NE(st.error().message.find("never attended"), std::string::npos) << st.error().message;
  EXPECT_EQ(c.tokens(0), 20);
  EXPECT_EQ(kvtest::kept_indices(c, 0, 0), before);
  EXPECT_EQ(c.memory_bytes(), bytes);
  EXPECT_FALSE(c.compress_prompt(0)) << "compress_prompt refuses too (no queries)";
  // Recovery: the prompt is still the latest append, so attending it and retrying works.
  std::vector<float> q = kvtest::normal(20 * D, 52), out(q.size());
  ASSERT_TRUE(c.attend(0, q, out));
  ASSERT_TRUE(c.append(0, k, v, kvtest::iota_positions(20, 1)));
  EXPECT_EQ(c.held_tokens(0), 13);
}

// H2O's fallback without attention mass: every score is 0, ties evict the oldest, so the kept
// set is the sinks plus the most recent tokens (SinkWindow<2, 6> for H2O<4, 2, 2>), at every step.
TYPED_TEST(EmptyScores, H2OWithoutAttentionMassKeepsSinksAndRecentTokens) {
  auto h2o = KVCache<H2O<4, 2, 2>, TypeParam>::create(kShape).value();
  auto sw = KVCache<SinkWindow<2, 6>, TypeParam>::create(kShape).value();
  append_attend(h2o, 0, 5, 4, false);
  append_attend(sw, 0, 5, 4, false);
  for (int64_t t = 5; t < 30; ++t) {
    append_attend(h2o, t, 1, 60 + static_cast<uint32_t>(t), false);
    append_attend(sw, t, 1, 60 + static_cast<uint32_t>(t), false);
    ASSERT_EQ(kvtest::kept_indices(h2o, 0, 0), kvtest::kept_indices(sw, 0, 0)) << "token " << t;
  }
  // Once attended, mass decides again: the cache attends correctly over what it holds.
  EXPECT_LE(kvtest::evicting_attend_error(h2o, 0, kvtest::normal(D, 99)), 1e-5);
}

}  // namespace
}  // namespace test_eviction_empty_scores
