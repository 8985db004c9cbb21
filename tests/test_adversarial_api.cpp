// Adversarial use of the public KVCache API: every bad call gets a clear error and loses nothing.
//
// "Loses nothing" is checked two ways. Cache A receives the bad call, twin cache B (built by the
// same calls) does not: right after the failed call their observable state must be equal
// (tokens, held tokens, memory bytes, read_back of every layer and KV head), and then both get
// the same 20 decode steps (append + attend on every layer), whose outputs and final state must
// be bit-identical. The second check catches hidden state a failed call could corrupt: eviction
// scores (H2O), pending/residual rows, the latest-chunk copy.
//
// Configurations: fp32, INT8 g32, INT4 g32 with sinks and a residual window, KIVI-style
// per-channel INT4 keys, SinkWindow on INT4, H2O on INT8 keys / fp32 values. Capacity limits of
// evicting caches: test_adversarial_capacity.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int kLayers = 2, kQHeads = 4, kKvHeads = 2, kD = 64;
constexpr std::int64_t kMaxTokens = 64;
constexpr std::size_t kRow = static_cast<std::size_t>(kKvHeads) * kD;   // floats per token in k / v
constexpr std::size_t kQRow = static_cast<std::size_t>(kQHeads) * kD;   // floats per query token
const ModelShape kShape{.layers = kLayers, .q_heads = kQHeads, .kv_heads = kKvHeads, .head_dim = kD,
                        .max_tokens = kMaxTokens};

using Fp32Cache = KVCache<>;
using Int8Cache = KVCache<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>>;
using Int4Cache = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Sinks<2>, Residual<8>>;
using KiviCache = KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<16>>;
using SinkWindowCache = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, SinkWindow<4, 16>>;
using H2OCache = KVCache<Keys<Int8<Group<32>>>, Values<Fp32>, H2O<8, 8, 2>>;

// Deterministic inputs: the same (seed, n) always gives the same data.
std::vector<float> kv_data(std::size_t n_tokens, std::uint32_t seed) { return kvtest::normal(n_tokens * kRow, seed); }
std::vector<float> q_data(std::size_t n_q, std::uint32_t seed) { return kvtest::normal(n_q * kQRow, seed); }

// Everything a cache shows through its public API.
struct Observed {
  std::vector<std::int64_t> tokens, held;
  std::size_t bytes = 0;
  std::vector<std::vector<float>> k, v;
  std::vector<std::vector<std::int32_t>> positions;
  std::vector<std::vector<std::int64_t>> indices;
  bool operator==(const Observed&) const = default;
};

template <class C>
Observed observe(const C& c) {
  Observed o;
  o.bytes = c.memory_bytes();
  for (int l = 0; l < kLayers; ++l) {
    o.tokens.push_back(c.tokens(l));
    for (int h = 0; h < kKvHeads; ++h) {
      o.held.push_back(c.held_tokens(l, h));
      auto rb = c.read_back(l, h);
      EXPECT_TRUE(rb) << rb.error().message;
      if (!rb) continue;
      o.k.push_back(rb.value().k);
      o.v.push_back(rb.value().v);
      o.positions.push_back(rb.value().positions);
      o.indices.push_back(rb.value().indices);
    }
  }
  return o;
}

// Appends n tokens at `first_pos` to every layer and attends with n queries; returns the outputs.
template <class C>
std::vector<float> step(C& c, std::int64_t first_pos, std::size_t n, std::uint32_t seed) {
  std::vector<float> all;
  for (int l = 0; l < kLayers; ++l) {
    const auto s = seed * 16 + static_cast<std::uint32_t>(l) * 4;
    const Status a = c.append(l, kv_data(n, s), kv_data(n, s + 1), kvtest::iota_positions(first_pos, static_cast<std::int64_t>(n)));
    EXPECT_TRUE(a) << a.error().message;
    const std::vector<float> q = q_data(n, s + 2);
    std::vector<float> out(q.size());
    const Status r = c.attend(l, q, out);
    EXPECT_TRUE(r) << r.error().message;
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

// The prefix both twins receive: a 20-token prefill, then 3 decode steps (23 tokens per layer).
constexpr std::int64_t kPrefix = 23;
template <class C>
void prefix(C& c) {
  step(c, 0, 20, 1);
  for (std::int64_t t = 20; t < kPrefix; ++t) step(c, t, 1, static_cast<std::uint32_t>(100 + t));
}

template <class C>
std::vector<float> future(C& c, std::int64_t first_pos) {
  std::vector<float> all;
  for (std::int64_t t = 0; t < 20; ++t) {
    const std::vector<float> o = step(c, first_pos + t, 1, static_cast<std::uint32_t>(1000 + t));
    all.insert(all.end(), o.begin(), o.end());
  }
  return all;
}

template <class C>
class AdversarialApi : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix(a);
    prefix(b);
    ASSERT_EQ(observe(a), observe(b)) << "twins must start equal";
  }
  // A failed call must leave A equal to B now and for 20 more decode steps.
  void expect_nothing_lost(std::int64_t next_pos = kPrefix) {
    EXPECT_TRUE(observe(a) == observe(b)) << "state changed by a failed call";
    EXPECT_EQ(future(a, next_pos), future(b, next_pos)) << "later outputs differ after a failed call";
    EXPECT_TRUE(observe(a) == observe(b)) << "later state differs after a failed call";
  }
  static void expect_error(const Status& s, Errc code, const std::string& needle) {
    ASSERT_FALSE(s) << "the call must fail";
    EXPECT_EQ(s.error().code, code) << s.error().message;
    EXPECT_NE(s.error().message.find(needle), std::string::npos) << "message: " << s.error().message
                                                                  << "\nexpected to contain: " << needle;
  }
  C a = C::create(kShape).value();
  C b = C::create(kShape).value();
};

using Configs = ::testing::Types<Fp32Cache, Int8Cache, Int4Cache, KiviCache, SinkWindowCache, H2OCache>;
TYPED_TEST_SUITE(AdversarialApi, Configs);

TYPED_TEST(AdversarialApi, WrongSpanSizesChangeNothing) {
  const auto k = kv_data(3, 7), v = kv_data(3, 8);
  const auto pos = kvtest::iota_positions(kPrefix, 3);
  const std::vector<float> k_short(k.begin(), k.end() - 1), v_long = kv_data(4, 8);
  this->expect_error(this->a.append(0, k_short, v, pos), Errc::invalid_argument, "kv_heads * head_dim");
  this->expect_error(this->a.append(0, k, v_long, pos), Errc::invalid_argument, "kv_heads * head_dim");
  this->expect_error(this->a.append(1, k, v, kvtest::iota_positions(kPrefix, 2)), Errc::invalid_argument,
                     "expected n_tokens * kv_heads * head_dim = 2 * 2 * 64");
  std::vector<float> q = q_data(1, 9), out(q.size() + 1, 7.f);
  this->expect_error(this->a.attend(0, q, out), Errc::invalid_argument, "n_q * q_heads * head_dim");
  std::vector<float> q_ragged(kQRow + 3, 0.5f), out_ragged(q_ragged.size());
  this->expect_error(this->a.attend(0, q_ragged, out_ragged), Errc::invalid_argument, "n_q * q_heads * head_dim");
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 7.f) << "out written by a failed attend";
  this->expect_nothing_lost();
}

TYPED_TEST(AdversarialApi, LayerOutOfRangeChangesNothing) {
  const auto k = kv_data(1, 7), v = kv_data(1, 8);
  const auto pos = kvtest::iota_positions(kPrefix, 1);
  for (int layer : {-1, kLayers, std::numeric_limits<int>::max(), std::numeric_limits<int>::min()}) {
    this->expect_error(this->a.append(layer, k, v, pos), Errc::invalid_argument, "out of range [0, 2)");
    std::vector<float> q = q_data(1, 9), out(q.size());
    this->expect_error(this->a.attend(layer, q, out), Errc::invalid_argument, "out of range [0, 2)");
    EXPECT_EQ(this->a.tokens(layer), 0);
    EXPECT_EQ(this->a.held_tokens(layer, 0), 0);
    EXPECT_TRUE(this->a.blocks(layer, 0).empty());
    EXPECT_FALSE(this->a.read_back(layer, 0));
  }
  EXPECT_FALSE(this->a.read_back(0, kKvHeads));
  EXPECT_FALSE(this->a.read_back(0, -1));
  this->expect_nothing_lost();
}

TYPED_TEST(AdversarialApi, NonFiniteKeysAndValuesChangeNothing) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (bool in_v : {false, true}) {
      auto k = kv_data(5, 7), v = kv_data(5, 8);
      (in_v ? v : k)[4 * kRow + kD + 63] = bad;  // last token of the chunk, KV head 1, last channel
      this->expect_error(this->a.append(1, k, v, kvtest::iota_positions(kPrefix, 5)), Errc::non_finite,
                         std::string(in_v ? "non-finite V" : "non-finite K") +
                             " value " + std::to_string(bad) + " at layer 1, kv head 1, token 4 of the chunk");
    }
  }
  this->expect_nothing_lost();
}

TYPED_TEST(AdversarialApi, NonFiniteQueriesChangeNothingAndLeaveOutUntouched) {
  // The last append held 1 token per layer (the prefix ends with decode steps).
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> q = q_data(1, 9), out(q.size(), 7.f);
    q[2 * kD + 5] = bad;  // q head 2 (second query group), channel 5
    this->expect_error(this->a.attend(0, q, out), Errc::non_finite, "q head 2, channel 5");
    for (float x : out) ASSERT_EQ(x, 7.f) << "out written by a failed attend";
  }
  this->expect_nothing_lost();
}

TYPED_TEST(AdversarialApi, NegativePositionsAreRejected) {
  for (std::int32_t bad : {-1, std::numeric_limits<std::int32_t>::min()}) {
    auto pos = kvtest::iota_positions(kPrefix, 3);
    pos[1] = bad;
    this->expect_error(this->a.append(0, kv_data(3, 7), kv_data(3, 8), pos), Errc::invalid_argument,
                       "negative position " + std::to_string(bad) + " at token 1");
  }
  this->expect_nothing_lost();
}

// Decision: positions need not increase (tree/speculative decoding, context shifts); they are
// stored exactly as given and never reorder tokens: read_back is in arrival order.
TYPED_TEST(AdversarialApi, NonMonotonicPositionsAreStoredAsGiven) {
  auto c = TypeParam::create(kShape).value();
  const std::vector<std::int32_t> pos = {5, 3, 3, 100, 0, 7};
  ASSERT_TRUE(c.append(0, kv_data(6, 1), kv_data(6, 2), pos));
  for (int h = 0; h < kKvHeads; ++h) {
    const HeadContents rb = c.read_back(0, h).value();
    EXPECT_EQ(rb.positions, pos);
    EXPECT_EQ(rb.indices, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
  }
}

TYPED_TEST(AdversarialApi, CapacityOverflowChangesNothing) {
  if constexpr (!TypeParam::evicts) {
    const std::int64_t room = kMaxTokens - kPrefix;  // 41 tokens left in each layer
    this->expect_error(this->a.append(0, kv_data(static_cast<std::size_t>(room + 1), 7),
                                      kv_data(static_cast<std::size_t>(room + 1), 8),
                                      kvtest::iota_positions(kPrefix, room + 1)),
                       Errc::capacity_exceeded, "max_tokens = 64");
    EXPECT_TRUE(observe(this->a) == observe(this->b));
    // Exactly full is fine, one more token is not.
    const auto k = kv_data(static_cast<std::size_t>(room), 7), v = kv_data(static_cast<std::size_t>(room), 8);
    ASSERT_TRUE(this->a.append(0, k, v, kvtest::iota_positions(kPrefix, room)));
    ASSERT_TRUE(this->b.append(0, k, v, kvtest::iota_positions(kPrefix, room)));
    EXPECT_EQ(this->a.tokens(0), kMaxTokens);
    this->expect_error(this->a.append(0, kv_data(1, 9), kv_data(1, 10), kvtest::iota_positions(kMaxTokens, 1)),
                       Errc::capacity_exceeded, "max_tokens = 64");
    EXPECT_TRUE(observe(this->a) == observe(this->b));
    std::vector<float> q = q_data(static_cast<std::size_t>(room), 11), oa(q.size()), ob(q.size());
    ASSERT_TRUE(this->a.attend(0, q, oa));
    ASSERT_TRUE(this->b.attend(0, q, ob));
    EXPECT_EQ(oa, ob);
  } else {
    // One chunk larger than the capacity can never fit; decoding far past it must keep working.
    const std::size_t n = kMaxTokens + 1;
    this->expect_error(this->a.append(0, kv_data(n, 7), kv_data(n, 8), kvtest::iota_positions(kPrefix, n)),
                       Errc::capacity_exceeded, "max_tokens = 64");
    this->expect_nothing_lost();
    for (std::int64_t t = kPrefix + 20; t < kPrefix + 20 + 3 * kMaxTokens; ++t)
      step(this->a, t, 1, static_cast<std::uint32_t>(t));
    EXPECT_EQ(this->a.tokens(0), kPrefix + 20 + 3 * kMaxTokens);
    EXPECT_LE(this->a.held_tokens(0, 1), this->a.eviction_budget());
  }
}

TYPED_TEST(AdversarialApi, MoreQueriesThanTheLastAppendChangesNothing) {
  std::vector<float> q2 = q_data(2, 9), out2(q2.size(), 7.f), none;
  this->expect_error(this->a.attend(0, q2, out2), Errc::invalid_argument, "2 queries but the latest append held 1");
  this->expect_error(this->a.attend(0, none, none), Errc::invalid_argument, "n_q >= 1");
  for (float x : out2) ASSERT_EQ(x, 7.f);
  // A fresh layer (nothing appended) has no queries to answer.
  auto c = TypeParam::create(kShape).value();
  std::vector<float> q1 = q_data(1, 9), out1(q1.size());
  this->expect_error(c.attend(1, q1, out1), Errc::invalid_argument, "latest append held 0");
  this->expect_nothing_lost();
}

TYPED_TEST(AdversarialApi, ZeroSizedAppendIsANoOp) {
  const std::vector<float> empty;
  const std::vector<std::int32_t> no_pos;
  ASSERT_TRUE(this->a.append(0, empty, empty, no_pos));
  ASSERT_TRUE(this->a.append(1, empty, empty, no_pos));
  // A zero-token append with data is a size error, not a no-op.
  this->expect_error(this->a.append(0, kv_data(1, 3), kv_data(1, 4), no_pos), Errc::invalid_argument,
                     "expected n_tokens * kv_heads * head_dim = 0");
  // The latest (1-token) append is still the one queries refer to.
  std::vector<float> q = q_data(1, 9), oa(q.size()), ob(q.size());
  ASSERT_TRUE(this->a.attend(0, q, oa));
  ASSERT_TRUE(this->b.attend(0, q, ob));
  EXPECT_EQ(oa, ob);
  this->expect_nothing_lost();
}

TYPED_TEST(AdversarialApi, ResetThenReuseEqualsAFreshCache) {
  this->a.reset();
  EXPECT_EQ(this->a.memory_bytes(), 0u);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(this->a.tokens(l), 0);
    std::vector<float> q = q_data(1, 9), out(q.size(), 7.f);
    this->expect_error(this->a.attend(l, q, out), Errc::invalid_argument, "latest append held 0");
  }
  auto fresh = TypeParam::create(kShape).value();
  prefix(this->a);
  prefix(fresh);
  EXPECT_TRUE(observe(this->a) == observe(fresh));
  EXPECT_EQ(future(this->a, kPrefix), future(fresh, kPrefix));
  EXPECT_TRUE(observe(this->a) == observe(fresh));
}

TYPED_TEST(AdversarialApi, CreateRejectsBadShapesWithTheirReason) {
  auto expect_bad = [](ModelShape s, const char* needle) {
    auto r = TypeParam::create(s);
    ASSERT_FALSE(r) << needle;
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  };
  ModelShape s = kShape;
  s.q_heads = 6, s.kv_heads = 4;
  expect_bad(s, "q_heads (6) must be a multiple of kv_heads (4)");
  s = kShape, s.head_dim = 63;
  expect_bad(s, "head_dim must be even");
  s = kShape, s.kv_heads = 0;
  expect_bad(s, "must all be positive");
  s = kShape, s.max_tokens = -1;
  expect_bad(s, "must all be positive");
  s = kShape, s.attn_scale = std::numeric_limits<float>::infinity();
  expect_bad(s, "attn_scale");
  s = kShape, s.head_dim = 65536;  // would wrap to 0 in the 16-bit BlockHeader::head_dim
  expect_bad(s, "head_dim exceeds 65535");
  // head_dim 48 is not a multiple of the group size 32: an error for every grouped codec.
  s = kShape, s.head_dim = 48;
  if constexpr ((TypeParam::key_codec::grouped && !TypeParam::keys_per_channel) || TypeParam::value_codec::grouped) {
    expect_bad(s, "head_dim 48 is not a multiple of the");
  } else {
    EXPECT_TRUE(TypeParam::create(s)) << "fp32 has no groups: head_dim 48 is valid";
  }
}

TYPED_TEST(AdversarialApi, MovedFromCacheFailsCleanly) {
  TypeParam moved = std::move(this->a);
  EXPECT_TRUE(observe(moved) == observe(this->b));
  // The moved-from cache is empty: every call is a clean error, no crash (ASan build).
  EXPECT_EQ(this->a.tokens(0), 0);
  EXPECT_EQ(this->a.memory_bytes(), 0u);
  EXPECT_TRUE(this->a.blocks(0, 0).empty());
  this->expect_error(this->a.append(0, kv_data(1, 3), kv_data(1, 4), kvtest::iota_positions(0, 1)),
                     Errc::invalid_argument, "out of range");
  std::vector<float> q = q_data(1, 9), out(q.size());
  this->expect_error(this->a.attend(0, q, out), Errc::invalid_argument, "out of range");
  EXPECT_EQ(future(moved, kPrefix), future(this->b, kPrefix));
  // Move-assigning into the moved-from cache makes it whole again.
  this->a = std::move(moved);
  EXPECT_TRUE(observe(this->a) == observe(this->b));
}

// fp32 values: two tokens with V = 3e38 both at full attention weight overflow the fp32 value
// sum. attend must say so (not return NaN/Inf) and must not credit eviction scores.
template <class C>
void overflow_is_an_error_and_changes_nothing() {
  auto make = [] {
    C c = C::create(kShape).value();
    prefix(c);
    std::vector<float> k = kv_data(2, 50), v(2 * kRow, 3e38f);
    for (int t = 0; t < 2; ++t)
      for (int h = 0; h < kKvHeads; ++h)
        for (int d = 0; d < kD; ++d) k[t * kRow + h * kD + d] = d == 0 ? 1e20f : 0.f;  // both keys 1e20 e0
    EXPECT_TRUE(c.append(0, k, v, kvtest::iota_positions(kPrefix, 2)));
    EXPECT_TRUE(c.append(1, k, v, kvtest::iota_positions(kPrefix, 2)));
    return c;
  };
  C a = make(), b = make();
  std::vector<float> q(2 * kQRow, 0.f), out(q.size());
  // Every query = 1e20 e0: its logit on the two newest tokens (held exactly in fp32) is 1e40 * scale,
  // beyond fp32. (Values of 3e38 alone no longer overflow: the kernels keep the value sum normalized.)
  for (std::size_t r = 0; r < 2 * kQHeads; ++r) q[r * kD] = 1e20f;
  const Status s = a.attend(0, q, out);
  ASSERT_FALSE(s) << "an overflowed logit must be an error";
  EXPECT_EQ(s.error().code, Errc::non_finite);
  EXPECT_NE(s.error().message.find("overflowed fp32"), std::string::npos) << s.error().message;
  EXPECT_TRUE(observe(a) == observe(b));
  // Queries pointing away from the huge tokens are fine, and A and B stay identical.
  for (std::size_t r = 0; r < 2 * kQHeads; ++r) q[r * kD] = -8.f;
  std::vector<float> oa(q.size()), ob(q.size());
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(a.attend(l, q, oa));
    ASSERT_TRUE(b.attend(l, q, ob));
    EXPECT_EQ(oa, ob);
    for (float x : oa) ASSERT_TRUE(std::isfinite(x));
  }
  // 20 decode steps whose queries also point away (random ones could overflow on the huge
  // tokens); H2O evicts by score here, so credited mass from the failed call would show.
  auto away_steps = [&](C& c) {
    std::vector<float> outs;
    for (std::int64_t t = 0; t < 20; ++t) {
      for (int l = 0; l < kLayers; ++l) {
        const auto seed = static_cast<std::uint32_t>(3000 + 4 * t + l);
        EXPECT_TRUE(c.append(l, kv_data(1, seed), kv_data(1, seed + 1), kvtest::iota_positions(kPrefix + 2 + t, 1)));
        std::vector<float> qq = kvtest::normal(kQRow, seed + 2, 0.1f), o(kQRow);
        for (int r = 0; r < kQHeads; ++r) qq[static_cast<std::size_t>(r) * kD] = -8.f;
        EXPECT_TRUE(c.attend(l, qq, o));
        outs.insert(outs.end(), o.begin(), o.end());
      }
    }
    return outs;
  };
  EXPECT_EQ(away_steps(a), away_steps(b));
  EXPECT_TRUE(observe(a) == observe(b));
}

TEST(AdversarialApiOverflow, Fp32OutputOverflowIsAnError) { overflow_is_an_error_and_changes_nothing<Fp32Cache>(); }
TEST(AdversarialApiOverflow, H2OScoresAreNotCreditedByAnOverflowedAttend) {
  overflow_is_an_error_and_changes_nothing<H2OCache>();
}

}  // namespace
