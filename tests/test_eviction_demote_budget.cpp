// Budgets of the Demote<> low tier (cache/demotion_budget.hpp; issue 24 "budgets in bytes"):
// Demote<LK, LV, Tokens<N> | Fraction<> | Fp16Share<>> keeps at most `cap` low rows per
// (layer, KV head), deleting the OLDEST demoted row first. Checked on the scalar backend and
// Backend<Auto>, prompts of 1, 31, 33, 95 tokens and long decodes that recycle low blocks:
// (a) the live low rows are exactly the `cap` most recently demoted rows of the uncapped twin
//     (same codes: read_back equal bit for bit) and high rows equal the twin's;
// (b) attention equals float64 attention over read_back (high + live low rows) within 1e-5,
//     so deleted low rows are really out of the kernel's view (the front block's valid mask);
// (c) the tier's memory is bounded: low blocks <= cap / B + 2 however long the stream;
// (d) Fp16Share's cap follows its formula, memory_bytes stays within the byte budget plus the
//     fp32 rows the policy keeps, and a budget the high tier alone fills makes demotion deletion
//     (outputs bit-identical to the pure-eviction cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace test_eviction_demote_budget {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int D = 32, QH = 4, KH = 2;
constexpr std::size_t Row = static_cast<std::size_t>(KH) * D, QRow = static_cast<std::size_t>(QH) * D;
using Hi = Int4<Group<32>>;
using HH = H2OBudget<Tokens<24>, 2>;  // 24 tokens per head held high, 2 of them recent
const ModelShape kShape{.layers = 1, .q_heads = QH, .kv_heads = KH, .head_dim = D, .max_tokens = 256};

template <class Budget, class Tag>
using Capped = KVCache<Keys<Hi>, Values<Hi>, HH, Demote<Keys<Int2<Group<32>>>, Values<Int2<Group<32>>>, Budget>, Blocks<8>,
                       Backend<Tag>>;
template <class Tag>
using Uncapped = Capped<Unbounded, Tag>;
template <class Tag>
using Plain = KVCache<Keys<Hi>, Values<Hi>, HH, Blocks<8>, Backend<Tag>>;

// Feeds `c` a prompt of p tokens (attended, so H2O has scores), then `steps` decode tokens, each
// attended; the same seeds for every cache.
template <class Cache>
void feed(Cache& c, int p, int steps) {
  ASSERT_TRUE(c.append(0, kvtest::normal(p * Row, 5), kvtest::normal(p * Row, 6), kvtest::iota_positions(0, p)));
  std::vector<float> o(static_cast<std::size_t>(p) * QRow);
  ASSERT_TRUE(c.attend(0, kvtest::normal(static_cast<std::size_t>(p) * QRow, 7), o));
  o.resize(QRow);
  for (int s = 0; s < steps; ++s) {
    ASSERT_TRUE(c.append(0, kvtest::normal(Row, 100 + s), kvtest::normal(Row, 200 + s), kvtest::iota_positions(p + s, 1)));
    ASSERT_TRUE(c.attend(0, kvtest::normal(QRow, 300 + s), o));
  }
}

// Rows of read_back `rb` whose cache index is in `keep` (in read_back order).
HeadContents select(const HeadContents& rb, const std::vector<std::int64_t>& keep) {
  HeadContents r;
  for (std::size_t i = 0; i < rb.indices.size(); ++i)
    if (std::find(keep.begin(), keep.end(), rb.indices[i]) != keep.end()) {
      r.indices.push_back(rb.indices[i]);
      r.k.insert(r.k.end(), rb.k.begin() + static_cast<std::ptrdiff_t>(i * D), rb.k.begin() + static_cast<std::ptrdiff_t>((i + 1) * D));
      r.v.insert(r.v.end(), rb.v.begin() + static_cast<std::ptrdiff_t>(i * D), rb.v.begin() + static_cast<std::ptrdiff_t>((i + 1) * D));
    }
  return r;
}

template <class Tag, int Cap>
void expect_fifo_cap(int p, int steps) {
  auto c = Capped<Tokens<Cap>, Tag>::create(kShape).value();
  auto u = Uncapped<Tag>::create(kShape).value();
  feed(c, p, steps);
  feed(u, p, steps);
  const std::int64_t n = c.tokens(0);
  for (int h = 0; h < KH; ++h) {
    const std::int64_t demoted = u.demoted_tokens(0, h);
    ASSERT_EQ(c.held_tokens(0, h), u.held_tokens(0, h)) << "the cap never touches the high tier";
    ASSERT_EQ(c.demoted_tokens(0, h), std::min<std::int64_t>(demoted, Cap)) << "p " << p << ", head " << h;
    // (a) The live low rows are the Cap most recently demoted of the twin's, bit for bit.
    const auto& low = u.demotion_tier().head(0, h);
    std::vector<std::int64_t> newest;  // cache indices of the twin's newest Cap low rows, plus its high rows
    for (std::size_t r = low.tokens.size() - static_cast<std::size_t>(c.demoted_tokens(0, h)); r < low.tokens.size(); ++r)
      newest.push_back(low.tokens[r]);
    const auto rc = c.read_back(0, h).value(), ru = u.read_back(0, h).value();
    std::vector<std::int64_t> expect = newest;
    for (std::size_t i = 0; i < ru.indices.size(); ++i) {
      const bool in_low = std::find(low.tokens.begin(), low.tokens.end(), static_cast<std::int32_t>(ru.indices[i])) != low.tokens.end();
      if (!in_low) expect.push_back(ru.indices[i]);  // high rows, sinks, pending and the latest chunk
    }
    const HeadContents want = select(ru, expect);
    EXPECT_EQ(rc.indices, want.indices) << "p " << p << ", head " << h;
    EXPECT_EQ(rc.k, want.k);
    EXPECT_EQ(rc.v, want.v);
    // (c) Bounded: the deleted rows' blocks were recycled.
    const auto& lc = c.demotion_tier().head(0, h);
    constexpr int B = Capped<Tokens<Cap>, Tag>::block_tokens;
    EXPECT_LE(static_cast<std::int64_t>(lc.blocks.size()), Cap / B + 2);
    EXPECT_LE(lc.dropped, B - 1);
  }
  EXPECT_GT(n, 0);
  // (b) Attention over the high rows and the live low rows only, against float64.
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(QRow, 999)), 1e-5);
}

TEST(EvictionDemoteBudget, TokensCapKeepsTheNewestDemotedRowsScalar) {
  for (const int p : {1, 31, 33, 95}) expect_fifo_cap<Scalar, 13>(p, 70);
}
TEST(EvictionDemoteBudget, TokensCapKeepsTheNewestDemotedRowsAuto) {
  for (const int p : {1, 31, 33, 95}) expect_fifo_cap<Auto, 13>(p, 70);
}
TEST(EvictionDemoteBudget, LongStreamRecyclesLowBlocks) {
  expect_fifo_cap<Scalar, 16>(95, 160);  // a cap of whole blocks: the front block empties exactly
  expect_fifo_cap<Auto, 1>(33, 40);      // one low row: every demotion deletes the previous one
}

TEST(EvictionDemoteBudget, FractionResolvesAgainstMaxTokens) {
  auto c = Capped<Fraction<1, 16>, Scalar>::create(kShape).value();  // 256 / 16 = 16 low rows
  EXPECT_EQ(c.demotion_tier().cap(), 16);
  feed(c, 95, 40);
  for (int h = 0; h < KH; ++h) EXPECT_EQ(c.demoted_tokens(0, h), 16);
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(QRow, 998)), 1e-5);
}

// (d) Fp16Share<1, 8>: 256 tokens * 32 * 2 * 2 / 8 = 4096 bytes per (layer, KV head). INT4 g32
// high tier: 16 + 4 (codes + fp16 scale/zero, per K and V) ... taken from the layouts below.
TEST(EvictionDemoteBudget, Fp16ShareFollowsItsFormulaAndHoldsTheBytes) {
  using C = Capped<Fp16Share<1, 8>, Scalar>;
  auto c = C::create(kShape).value();
  feed(c, 95, 60);
  const BlockLayout hi = make_block_layout<Hi, Hi, false>(8, D);
  const BlockLayout lo = make_block_layout<Int2<Group<32>>, Int2<Group<32>>, false>(8, D);
  const double budget = 256.0 * D * 2 * 2 / 8;
  const double high_cost = static_cast<double>(hi.used_bytes(1)) + 8 + (sizeof(BlockHeader) + 8.0) / 8;
  const double low_cost = static_cast<double>(lo.used_bytes(1)) + 4 + sizeof(BlockHeader) / 8.0;
  const auto cap = static_cast<std::int64_t>((budget - 24 * high_cost) / low_cost);
  ASSERT_GT(cap, 0);
  EXPECT_EQ(c.demotion_tier().cap(), cap);
  for (int h = 0; h < KH; ++h) EXPECT_EQ(c.demoted_tokens(0, h), cap);
  // Both tiers' blocks within the budget; the policy's fp32 rows (pending, latest chunk) on top.
  const double fp32_rows = (c.memory_bytes() > 0 ? 3.0 : 0.0) * (2.0 * KH * D * 4 + 4);
  EXPECT_LE(static_cast<double>(c.memory_bytes()), KH * budget + fp32_rows + KH * (8 * lo.used_bytes(1) + 16.0));
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, kvtest::normal(QRow, 997)), 1e-5);
}

TEST(EvictionDemoteBudget, ByteBudgetTheHighTierFillsMeansDeletion) {
  using C = Capped<Fp16Share<1, 64>, Auto>;  // 512 bytes per head: less than 24 INT4 tokens
  auto c = C::create(kShape).value();
  auto plain = Plain<Auto>::create(kShape).value();
  feed(c, 33, 30);
  feed(plain, 33, 30);
  EXPECT_EQ(c.demotion_tier().cap(), 0);
  for (int h = 0; h < KH; ++h) EXPECT_EQ(c.demoted_tokens(0, h), 0);
  const auto q = kvtest::normal(QRow, 996);
  std::vector<float> oc(QRow), op(QRow);
  ASSERT_TRUE(c.attend(0, q, oc));
  ASSERT_TRUE(plain.attend(0, q, op));
  EXPECT_EQ(oc, op) << "cap 0: the demoting cache is the pure-eviction cache";
}

}  // namespace
}  // namespace test_eviction_demote_budget
