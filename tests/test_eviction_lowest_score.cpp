// The victim search of score-based eviction (eviction/lowest_score.hpp): the AVX2 scan against
// the scalar specification on random slots (free slots, sinks, recent tokens, ties, signed zeros,
// +-inf, NaN), every slot count 0..40 and 1000, and the cases where nothing is in range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kvpack/eviction/lowest_score.hpp"

namespace {

using kvpack::eviction::lowest_score;
using kvpack::eviction::lowest_score_scalar;

struct Slots {
  std::vector<std::int32_t> token;
  std::vector<float> score;
};

// n slots holding distinct tokens 0..n-1 in random order, about 1 in 8 free (-1); scores drawn
// from a small set so that ties are common, with signed zeros and infinities mixed in.
Slots random_slots(int n, std::mt19937& rng, bool with_nan) {
  Slots s;
  s.token.resize(static_cast<std::size_t>(n));
  std::iota(s.token.begin(), s.token.end(), 0);
  std::shuffle(s.token.begin(), s.token.end(), rng);
  const float pool[] = {0.f, -0.f, 0.25f, 0.5f, 0.5f, 1.f, 3.f, std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), 1e-30f};
  std::uniform_int_distribution<int> pick(0, 9), free_slot(0, 7), nan_slot(0, 40);
  for (int i = 0; i < n; ++i) {
    if (free_slot(rng) == 0) s.token[static_cast<std::size_t>(i)] = -1;
    s.score.push_back(pool[pick(rng)]);
    if (with_nan && nan_slot(rng) == 0) s.score.back() = std::numeric_limits<float>::quiet_NaN();
  }
  return s;
}

TEST(LowestScore, EqualsTheScalarScan) {
  std::mt19937 rng(3);
  int checked = 0;
  for (int rep = 0; rep < 300; ++rep) {
    for (int n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 40, 1000}) {
      const Slots s = random_slots(n, rng, rep % 3 == 0);
      std::uniform_int_distribution<int> cut(0, std::max(1, n));
      for (int k = 0; k < 4; ++k) {
        const std::int32_t lo = cut(rng) % 5;  // sinks
        const std::int64_t hi = k == 3 ? std::int64_t{1} << 40 : cut(rng);  // recent_from (far beyond int32 too)
        ASSERT_EQ(lowest_score(s.token, s.score, lo, hi), lowest_score_scalar(s.token, s.score, lo, hi))
            << "n " << n << " lo " << lo << " hi " << hi << " rep " << rep;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 300 * 12 * 4);
}

TEST(LowestScore, PicksTheOldestAmongEqualScores) {
  Slots s;
  for (int i = 0; i < 24; ++i) {
    s.token.push_back(40 - i);  // newest first
    s.score.push_back(i % 2 ? 1.f : 2.f);
  }
  // Lowest score 1 at odd slots; among them the oldest token is 40 - 23 = 17, slot 23.
  EXPECT_EQ(lowest_score(s.token, s.score, 0, 100), 23);
  EXPECT_EQ(lowest_score_scalar(s.token, s.score, 0, 100), 23);
  // Tokens >= 30 recent: candidates 17..29; still slot 23.
  EXPECT_EQ(lowest_score(s.token, s.score, 0, 30), 23);
  // Nothing in range: -1.
  EXPECT_EQ(lowest_score(s.token, s.score, 50, 60), -1);
  EXPECT_EQ(lowest_score(s.token, s.score, 20, 20), -1);
}

}  // namespace
