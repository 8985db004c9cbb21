// Demote<> inside Rotated<> (issue 24's mixes: Hadamard rotation around a demoting cache).
// Rotated rotates each appended row before the inner cache sees it, so the high tier and the
// low tier both hold rotated rows; q.k is rotation-invariant, so the eviction policy ranks tokens
// on the same scores up to rounding; read_back returns both tiers in the caller's basis. On
// Backend<Scalar> and Backend<Auto>, prompts of 1, 31, 33, 95 tokens and 60 decode steps, H2O and
// SinkWindow under FixedBudget, per-token and per-channel INT2 low tiers:
// (a) nothing is lost: high + low rows hold every token once;
// (b) attention equals float64 attention over read_back (high + low, rotated back) within 1e-5
//     after every step;
// (c) SinkWindow (position-based) demotes exactly the tokens it demotes without rotation;
// (d) on keys with outlier channels the rotated INT2 low tier reconstructs keys with under 0.7x
//     the error of the unrotated one (0.55x measured; the reason to combine them, docs/RESULTS-lowbit.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace test_eviction_demote_rotated {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int D = 64, QH = 4, KH = 2;
using Hi = Int4<Group<32>>;
using LowPT = Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>;
using LowPC = Demote<Keys<Int2<Group<32>>, PerChannel>, Values<Int2<Group<32>>>>;
using HH = Protocol<H2OBudget<Tokens<24>, 2>, FixedBudget>;
using SW = Protocol<SinkWindowBudget<Tokens<24>, 4>, FixedBudget>;
const ModelShape kShape{.layers = 1, .q_heads = QH, .kv_heads = KH, .head_dim = D, .max_tokens = 512};

template <class P, class Dm, class Tag>
using Plain = KVCache<Keys<Hi>, Values<Hi>, P, Dm, Blocks<16>, Backend<Tag>>;
template <class P, class Dm, class Tag>
using Rot = Rotated<Plain<P, Dm, Tag>>;

// (a) and (b) for one rotated demoting cache.
template <class P, class Dm, class Tag>
void run(int p) {
  auto c = Rot<P, Dm, Tag>::create(kShape).value();
  kvtest::feed_outlier_checked(c, p, 60);
  const std::int64_t n = c.tokens(0);
  for (int h = 0; h < KH; ++h) {
    EXPECT_GT(c.demoted_tokens(0, h), 0) << "p " << p;
    EXPECT_EQ(c.held_tokens(0, h) + c.demoted_tokens(0, h), n);
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(kvtest::kept_indices(c, 0, h), all) << "p " << p << ", head " << h;
  }
}

TEST(EvictionDemoteRotated, H2OPerTokenLowScalar) {
  for (const int p : {1, 31, 33, 95}) run<HH, LowPT, Scalar>(p);
}
TEST(EvictionDemoteRotated, H2OPerTokenLowAuto) {
  for (const int p : {1, 31, 33, 95}) run<HH, LowPT, Auto>(p);
}
TEST(EvictionDemoteRotated, SinkWindowPerChannelLowAuto) {
  for (const int p : {1, 33, 95}) run<SW, LowPC, Auto>(p);
}

// (c) Position-based eviction: the same tokens go low with and without rotation.
TEST(EvictionDemoteRotated, SinkWindowDemotesTheSameTokens) {
  auto r = Rot<SW, LowPT, Auto>::create(kShape).value();
  auto u = Plain<SW, LowPT, Auto>::create(kShape).value();
  kvtest::feed_outlier_checked(r, 95, 30, u);
  for (int h = 0; h < KH; ++h) {
    ASSERT_GT(u.demoted_tokens(0, h), 0);
    EXPECT_EQ(r.inner().demotion_tier().head(0, h).tokens, u.demotion_tier().head(0, h).tokens) << "head " << h;
  }
}

// (d) Rotation spreads the outlier channels over the head, so the per-token INT2 low tier's
// groups lose less range to them; measured on the demoted rows against the exact keys.
TEST(EvictionDemoteRotated, RotationShrinksTheLowTierKeyError) {
  auto r = Rot<SW, LowPT, Auto>::create(kShape).value();
  auto u = Plain<SW, LowPT, Auto>::create(kShape).value();
  auto full = KVCache<Blocks<16>, Backend<Auto>>::create(kShape).value();
  kvtest::feed_outlier_checked(r, 95, 40, u, full);
  double err_r = 0, err_u = 0;
  for (int h = 0; h < KH; ++h) {
    const auto a = r.read_back(0, h).value(), b = u.read_back(0, h).value(), f = full.read_back(0, h).value();
    ASSERT_EQ(a.indices, f.indices);
    ASSERT_EQ(b.indices, f.indices);
    for (const std::int32_t t : u.demotion_tier().head(0, h).tokens)
      for (int d = 0; d < D; ++d) {
        const std::size_t i = static_cast<std::size_t>(t) * D + static_cast<std::size_t>(d);
        err_r += std::abs(static_cast<double>(a.k[i]) - f.k[i]);
        err_u += std::abs(static_cast<double>(b.k[i]) - f.k[i]);
      }
  }
  EXPECT_GT(err_u, 0);
  EXPECT_LT(err_r, 0.7 * err_u) << "rotated " << err_r << " vs unrotated " << err_u;
}

}  // namespace
}  // namespace test_eviction_demote_rotated
