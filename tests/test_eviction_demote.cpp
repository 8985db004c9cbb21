// Demote<Keys<LK>, Values<LV>> (issue 24 item 2; MiKV, "No Token Left Behind", Yang et al. 2024):
// every eviction policy (SinkWindow, H2O, SnapKV, BlockSparse, TOVA under Protocol<P, FixedBudget>)
// with INT4 high blocks and an INT4 or INT2 low tier, on the scalar backend and Backend<Auto>:
// (a) nothing is lost: high + low rows = every token appended, read_back lists each cache index
// once; (b) attention equals float64 attention over the read_back rows (mixed precisions inside
// one head) within the kernels' 1e-5 contract; (c) the low tier is really attended: the output
// differs from the pure-eviction cache's, whose output misses the union's reference; (d)
// memory_bytes = the pure-eviction cache's bytes + the low tier's analytic bytes; reset wipes it;
// (e) each demoted row is the high codec's row re-coded, within half a low-codec step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace test_eviction_demote {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int D = 32, QH = 4, KH = 2, Steps = 24;
constexpr std::size_t Row = static_cast<std::size_t>(KH) * D, QRow = static_cast<std::size_t>(QH) * D;

using Hi = Int4<Group<32>>;
using Low4 = Demote<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>;
using Low2 = Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>>;

using SW = Protocol<SinkWindowBudget<Fraction<1, 2>, 4>, FixedBudget>;
using HH = Protocol<H2OBudget<Fraction<1, 2>, 2>, FixedBudget>;
using SK = Protocol<SnapKVBudget<Fraction<1, 2>, 8, 3>, FixedBudget>;
using BS = Protocol<BlockSparse<Fraction<1, 2>, 8, 1, 1>, FixedBudget>;
using TV = Protocol<TOVA<16, 2>, FixedBudget>;

// One case: eviction policy P, demotion policy Dm, backend tag Tag. `plain` is the same cache
// without Demote<> (the pure-eviction twin).
template <class P, class Dm, class Tag>
struct Case {
  using cache = KVCache<Keys<Hi>, Values<Hi>, P, Dm, Backend<Tag>>;
  using plain = KVCache<Keys<Hi>, Values<Hi>, P, Backend<Tag>>;
  using full = KVCache<Keys<Hi>, Values<Hi>, Backend<Tag>>;
  using low_k = typename Dm::keys::codec;
  using low_v = typename Dm::values::codec;
};

template <class C>
class EvictionDemote : public ::testing::Test {};
using Cases = ::testing::Types<Case<SW, Low4, Scalar>, Case<SW, Low2, Scalar>, Case<SW, Low2, Auto>,
                               Case<HH, Low4, Scalar>, Case<HH, Low2, Scalar>, Case<HH, Low4, Auto>, Case<HH, Low2, Auto>,
                               Case<SK, Low4, Scalar>, Case<SK, Low2, Scalar>, Case<SK, Low2, Auto>,
                               Case<BS, Low4, Scalar>, Case<BS, Low2, Auto>,
                               Case<TV, Low4, Scalar>, Case<TV, Low2, Auto>>;
TYPED_TEST_SUITE(EvictionDemote, Cases);

const ModelShape kShape{.layers = 1, .q_heads = QH, .kv_heads = KH, .head_dim = D, .max_tokens = 512};

// Bytes the low tier of `c` holds, from the codecs' bits per value: per row its K and V codes
// and metadata, a 4-byte position and a 4-byte cache index; per block of B rows a 16-byte header.
template <class C, class Cache>
std::size_t low_tier_bytes(const Cache& c) {
  const auto row = static_cast<std::size_t>(C::low_k::bits_per_value * D / 8 + C::low_v::bits_per_value * D / 8) + 4 + 4;
  std::size_t t = 0;
  for (int h = 0; h < KH; ++h) {
    const auto rows = static_cast<std::size_t>(c.demoted_tokens(0, h));
    const auto B = static_cast<std::size_t>(Cache::block_tokens);
    t += rows * row + (rows + B - 1) / B * sizeof(BlockHeader);
  }
  return t;
}

// (a): every token appended is held exactly once, in the high or the low tier.
template <class Cache>
void expect_nothing_lost(const Cache& c, const char* when) {
  const std::int64_t n = c.tokens(0);
  for (int h = 0; h < KH; ++h) {
    EXPECT_EQ(c.held_tokens(0, h) + c.demoted_tokens(0, h), n) << when << ", head " << h;
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(kvtest::kept_indices(c, 0, h), all) << when << ", head " << h << ": read_back lists every index once";
  }
}

// A demoted row holds what the high tier held, re-coded by the low codec: each channel of row `lo`
// is within half a low-codec step of the high-precision row `hi` (asymmetric groups of 32: step =
// (max - min) / (2^bits - 1) over the group of `hi`), plus fp16 rounding of scale and zero-point.
template <class Low>
void expect_recoded(const float* lo, const float* hi, std::int64_t index, const char* role) {
  for (int g = 0; g < D; g += 32) {
    const auto [mn, mx] = std::minmax_element(hi + g, hi + g + 32);
    const double bound = (*mx - *mn) / ((1 << Low::bits) - 1) / 2.0 + 2e-3 * (std::abs(*mx) + std::abs(*mn)) + 1e-5;
    for (int d = g; d < g + 32; ++d)
      ASSERT_LE(std::abs(static_cast<double>(lo[d]) - hi[d]), bound) << role << " of token " << index << ", channel " << d;
  }
}

// Prompt of p tokens (attended), then Steps decode steps, the pure-eviction twin and a cache
// without eviction (the high codec's rows of every token) fed the same.
template <class C>
void run(int p) {
  auto c = C::cache::create(kShape).value();
  auto plain = C::plain::create(kShape).value();
  auto full = C::full::create(kShape).value();
  auto feed = [&](auto& x, std::int64_t n, int seed, std::int64_t first) {
    ASSERT_TRUE(x.append(0, kvtest::normal(n * Row, seed), kvtest::normal(n * Row, seed + 1), kvtest::iota_positions(first, n)));
  };
  feed(c, p, 1, 0), feed(plain, p, 1, 0), feed(full, p, 1, 0);
  const auto qp = kvtest::normal(p * QRow, 3);
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, qp), 1e-5);
  EXPECT_LE(kvtest::evicting_attend_error(plain, 0, qp), 1e-5);
  bool demoted = false, differs = false;
  for (int s = 0; s < Steps; ++s) {
    feed(c, 1, 10 + 2 * s, p + s), feed(plain, 1, 10 + 2 * s, p + s), feed(full, 1, 10 + 2 * s, p + s);
    expect_nothing_lost(c, "decode");
    for (int h = 0; h < KH; ++h)
      EXPECT_EQ(c.held_tokens(0, h), plain.held_tokens(0, h)) << "the high tier evicts as without Demote<> (step " << s << ")";
    const auto q = kvtest::normal(QRow, 200 + s);
    EXPECT_LE(kvtest::evicting_attend_error(c, 0, q), 1e-5) << "step " << s;
    std::vector<float> o1(QRow), o2(QRow);
    ASSERT_TRUE(c.attend(0, q, o1));
    ASSERT_TRUE(plain.attend(0, q, o2));
    if (c.demoted_tokens(0, 0) > 0) {
      demoted = true;
      double diff = 0;
      for (std::size_t i = 0; i < QRow; ++i) diff = std::max(diff, static_cast<double>(std::abs(o1[i] - o2[i])));
      differs = differs || diff > 1e-3;
    }
    EXPECT_EQ(c.memory_bytes(), plain.memory_bytes() + low_tier_bytes<C>(c)) << "step " << s;
  }
  // Demoted rows (held by c, not by its pure-eviction twin) against the high codec's rows.
  for (int h = 0; h < KH; ++h) {
    const auto rc = c.read_back(0, h).value(), rf = full.read_back(0, h).value();
    const auto kept = kvtest::kept_indices(plain, 0, h);
    ASSERT_EQ(rc.indices, rf.indices);
    EXPECT_EQ(rc.positions, rf.positions) << "a demoted row keeps its token's position (CASES C7)";
    for (std::size_t r = 0; r < rc.indices.size(); ++r) {
      if (std::find(kept.begin(), kept.end(), rc.indices[r]) != kept.end()) continue;
      expect_recoded<typename C::low_k>(rc.k.data() + r * D, rf.k.data() + r * D, rc.indices[r], "K");
      expect_recoded<typename C::low_v>(rc.v.data() + r * D, rf.v.data() + r * D, rc.indices[r], "V");
    }
  }
  if (p >= 8) {
    EXPECT_TRUE(demoted) << "a prompt of " << p << " tokens at half the budget demotes tokens";
    EXPECT_TRUE(differs) << "the low tier changes the output";
  }
  c.reset();
  EXPECT_EQ(c.demoted_tokens(0, 0), 0);
  EXPECT_EQ(c.memory_bytes(), 0u);
}

TYPED_TEST(EvictionDemote, Prompt1KeepsEveryTokenAndMatchesRef64) { run<TypeParam>(1); }
TYPED_TEST(EvictionDemote, Prompt31KeepsEveryTokenAndMatchesRef64) { run<TypeParam>(31); }
TYPED_TEST(EvictionDemote, Prompt33KeepsEveryTokenAndMatchesRef64) { run<TypeParam>(33); }
TYPED_TEST(EvictionDemote, Prompt95KeepsEveryTokenAndMatchesRef64) { run<TypeParam>(95); }

// (c): against float64 attention over every token (high rows as held, demoted rows as the low
// tier decodes them), the demoting cache meets 1e-5; the pure-eviction twin, which lost those
// tokens, misses it by far.
TEST(EvictionDemoteUnion, PureEvictionMissesTheUnionReference) {
  using C = Case<HH, Low2, Scalar>;
  auto c = C::cache::create(kShape).value();
  auto plain = C::plain::create(kShape).value();
  const int p = 64;
  ASSERT_TRUE(c.append(0, kvtest::normal(p * Row, 5), kvtest::normal(p * Row, 6), kvtest::iota_positions(0, p)));
  ASSERT_TRUE(plain.append(0, kvtest::normal(p * Row, 5), kvtest::normal(p * Row, 6), kvtest::iota_positions(0, p)));
  const auto q0 = kvtest::normal(p * QRow, 7);
  std::vector<float> op(q0.size());
  ASSERT_TRUE(c.attend(0, q0, op));
  ASSERT_TRUE(plain.attend(0, q0, op));
  ASSERT_TRUE(c.append(0, kvtest::normal(Row, 8), kvtest::normal(Row, 9), kvtest::iota_positions(p, 1)));
  ASSERT_TRUE(plain.append(0, kvtest::normal(Row, 8), kvtest::normal(Row, 9), kvtest::iota_positions(p, 1)));
  ASSERT_GT(c.demoted_tokens(0, 0), 20) << "the prompt's end evicted half of it";
  const auto q = kvtest::normal(QRow, 11);
  // The union's float64 reference, from the demoting cache's read_back (every token).
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<float> oc(QRow), opl(QRow);
  ASSERT_TRUE(c.attend(0, q, oc));
  ASSERT_TRUE(plain.attend(0, q, opl));
  double err_c = 0, err_plain = 0;
  for (int h = 0; h < KH; ++h) {
    const auto rb = c.read_back(0, h).value();
    ASSERT_EQ(static_cast<std::int64_t>(rb.indices.size()), p + 1);
    const int group = QH / KH;
    const auto ref = kvtest::attention_ref64_indexed(rb.k, rb.v, rb.indices, q.data() + h * group * D, 1, group, QH * D, D,
                                                     scale, p);
    const std::vector<float> a(oc.begin() + h * group * D, oc.begin() + (h + 1) * group * D);
    const std::vector<float> b(opl.begin() + h * group * D, opl.begin() + (h + 1) * group * D);
    err_c = std::max(err_c, kvtest::max_rel_error(a, ref, D));
    err_plain = std::max(err_plain, kvtest::max_rel_error(b, ref, D));
  }
  EXPECT_LE(err_c, 1e-5);
  EXPECT_GT(err_plain, 1e-3) << "deleting the tokens changes attention beyond rounding";
}

// Demoted rows are held at the low precision: read_back's demoted rows differ from the inputs by
// more than the high rows do, and stored_bits falls below the high codec's.
TEST(EvictionDemoteUnion, DemotedRowsAreLowPrecision) {
  using C = Case<SW, Low2, Scalar>;
  auto c = C::cache::create(kShape).value();
  auto plain = C::plain::create(kShape).value();
  const int p = 64;
  const auto k = kvtest::normal(p * Row, 21), v = kvtest::normal(p * Row, 22);
  ASSERT_TRUE(c.append(0, k, v, kvtest::iota_positions(0, p)));
  ASSERT_TRUE(plain.append(0, k, v, kvtest::iota_positions(0, p)));
  ASSERT_TRUE(c.append(0, kvtest::normal(Row, 23), kvtest::normal(Row, 24), kvtest::iota_positions(p, 1)));
  ASSERT_TRUE(plain.append(0, kvtest::normal(Row, 23), kvtest::normal(Row, 24), kvtest::iota_positions(p, 1)));
  const auto rb = c.read_back(0, 0).value();
  const auto kept = kvtest::kept_indices(plain, 0, 0);
  double err_hi = 0, err_lo = 0;
  for (std::size_t r = 0; r < rb.indices.size(); ++r) {
    const std::int64_t t = rb.indices[r];
    if (t >= p) continue;
    const bool high = std::find(kept.begin(), kept.end(), t) != kept.end();
    for (int d = 0; d < D; ++d) {
      const double e = std::abs(rb.k[r * D + static_cast<std::size_t>(d)] - k[static_cast<std::size_t>(t) * Row + static_cast<std::size_t>(d)]);
      (high ? err_hi : err_lo) = std::max(high ? err_hi : err_lo, e);
    }
  }
  EXPECT_GT(err_lo, 2 * err_hi) << "INT2 demoted rows vs INT4 held rows";
  EXPECT_LT(c.stored_bits().key_bits_per_value, plain.stored_bits().key_bits_per_value);
}

// The executor does not change the output: heads run unsplit in parallel, then each low tier;
// the same kernels on the same data as the serial path, so the outputs are bit-identical.
template <class Cache>
void expect_executor_gives_serial_output() {
  auto a = Cache::create(kShape).value();
  auto b = Cache::create(kShape).value();
  b.set_executor(thread_executor(2), 4);
  for (auto* x : {&a, &b}) {
    ASSERT_TRUE(x->append(0, kvtest::normal(80 * Row, 31), kvtest::normal(80 * Row, 32), kvtest::iota_positions(0, 80)));
    std::vector<float> o(80 * QRow);
    ASSERT_TRUE(x->attend(0, kvtest::normal(80 * QRow, 33), o));
    ASSERT_TRUE(x->append(0, kvtest::normal(Row, 34), kvtest::normal(Row, 35), kvtest::iota_positions(80, 1)));
  }
  std::vector<float> oa(QRow), ob(QRow);
  const auto q = kvtest::normal(QRow, 36);
  ASSERT_TRUE(a.attend(0, q, oa));
  ASSERT_TRUE(b.attend(0, q, ob));
  ASSERT_GT(a.demoted_tokens(0, 0), 0);
  EXPECT_EQ(oa, ob);
  EXPECT_LE(kvtest::evicting_attend_error(b, 0, q), 1e-5);
}
TEST(EvictionDemoteUnion, ExecutorGivesTheSerialOutput) {
  expect_executor_gives_serial_output<Case<HH, Low2, Auto>::cache>();  // key mass: never split
  expect_executor_gives_serial_output<Case<SW, Low2, Auto>::cache>();  // would be split without Demote<>
}

}  // namespace
}  // namespace test_eviction_demote
