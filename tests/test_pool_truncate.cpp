// PagedCache::truncate: dropping the newest tokens leaves exactly the state of a sequence that
// never received them (page bytes and counts; the next token attends bit-identically), across
// per-channel key groups, residual windows, page and sink boundaries, also on a forked sequence
// whose pages are shared. Truncating past the start or deeper than max_rollback_tokens is an error
// that changes nothing.
#include <gtest/gtest.h>

#include <vector>

#include "support/pool_twin.hpp"

namespace pool_truncate_test {

using namespace kvpack;  // NOLINT: test file

using Kivi = std::tuple<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<16>, Blocks<64>>;
using PerTok = std::tuple<Keys<Int4<>>, Values<Int8<>>, Residual<8>, Blocks<32>>;
using Sinks4 = std::tuple<Keys<Int8<>>, Values<Int4<>>, Sinks<4>, Blocks<32>>;

template <class T>
struct PoolOf;
template <class... P>
struct PoolOf<std::tuple<P...>> {
  using type = PagedCache<P...>;
};

template <class T>
class PoolTruncate : public ::testing::Test {};
using Configs = ::testing::Types<Kivi, PerTok, Sinks4>;
TYPED_TEST_SUITE(PoolTruncate, Configs);

const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 2048};
constexpr int kRollback = 40;
const std::size_t kRow = 2 * 64, kQRow = 4 * 64;

// Token t of the test stream (the same K/V for every sequence that receives token t).
std::vector<float> rows(int first, int n, int which) {
  std::vector<float> x;
  for (int t = first; t < first + n; ++t) {
    const auto r = kvtest::normal(kRow, static_cast<std::uint32_t>(t * 2 + which));
    x.insert(x.end(), r.begin(), r.end());
  }
  return x;
}

template <class Pool>
void feed(Pool& pool, SeqId id, int first, int n) {
  for (int l = 0; l < kShape.layers; ++l)
    ASSERT_TRUE(pool.append(id, l, rows(first, n, 0), rows(first, n, 1), kvtest::iota_positions(first, n)));
}

// After truncation to `len`, `a` must equal `ref` (fed only the kept tokens): pages now, and the
// attention of one more token appended to both.
template <class Pool>
void expect_equal_after_next(Pool& pool, SeqId a, SeqId ref, int len, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(*pool.length(a), len);
  kvtest::expect_same_pages(pool, a, pool, ref);
  feed(pool, a, len, 1);
  feed(pool, ref, len, 1);
  kvtest::expect_same_pages(pool, a, pool, ref);
  const auto q = kvtest::normal(kQRow, static_cast<std::uint32_t>(len + 77));
  for (int l = 0; l < kShape.layers; ++l)
    EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(pool, a, l, q), kvtest::pool_attend(pool, ref, l, q))) << "layer " << l;
}

TYPED_TEST(PoolTruncate, EqualsNeverHavingAppendedTheDroppedTokens) {
  using Pool = typename PoolOf<TypeParam>::type;
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 4, .max_rollback_tokens = kRollback}).value();
  for (int n : {0, 1, 3, 31, 33, 63, 64, 65, 95, 130}) {
    for (int draft : {1, 5, 17, 33, 40}) {
      for (int keep : {0, draft / 2, draft - 1}) {  // accepted tokens of the draft
        SCOPED_TRACE("prompt " + std::to_string(n) + " draft " + std::to_string(draft) + " keep " + std::to_string(keep));
        const SeqId a = pool.create_sequence().value(), ref = pool.create_sequence().value();
        if (n > 0) feed(pool, a, 0, n), feed(pool, ref, 0, n);
        feed(pool, a, n, draft);  // the draft, one chunk (as a verifying forward pass)
        if (keep > 0) feed(pool, ref, n, keep);
        ASSERT_TRUE(pool.truncate(a, n + keep));
        expect_equal_after_next(pool, a, ref, n + keep, "truncated");
        ASSERT_TRUE(pool.free_sequence(a));
        ASSERT_TRUE(pool.free_sequence(ref));
      }
    }
  }
  EXPECT_EQ(pool.stats().pages_used, 0u);
}

TYPED_TEST(PoolTruncate, TokenByTokenDecodeRollsBack) {
  using Pool = typename PoolOf<TypeParam>::type;
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 2, .max_rollback_tokens = kRollback}).value();
  const SeqId a = pool.create_sequence().value(), ref = pool.create_sequence().value();
  feed(pool, a, 0, 50);
  feed(pool, ref, 0, 50);
  for (int t = 50; t < 90; ++t) feed(pool, a, t, 1);  // decode one token at a time
  ASSERT_TRUE(pool.truncate(a, 52));                  // drop 38, across groups, pages and the residual
  feed(pool, ref, 50, 2);
  expect_equal_after_next(pool, a, ref, 52, "decode rollback");
}

TYPED_TEST(PoolTruncate, ForkedSequenceTruncatesWithoutTouchingItsParent) {
  using Pool = typename PoolOf<TypeParam>::type;
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 4, .max_rollback_tokens = kRollback}).value();
  const SeqId parent = pool.create_sequence().value(), ref = pool.create_sequence().value();
  feed(pool, parent, 0, 100);
  const SeqId child = pool.fork(parent).value();
  const SeqId witness = pool.fork(parent).value();  // keeps the parent's pages as they were
  ASSERT_TRUE(pool.truncate(child, 70));              // cuts shared pages: copies first
  feed(pool, ref, 0, 70);
  kvtest::expect_same_pages(pool, child, pool, ref);
  kvtest::expect_same_pages(pool, parent, pool, witness);
  ASSERT_TRUE(pool.truncate(parent, 95));
  ASSERT_TRUE(pool.free_sequence(witness));
  expect_equal_after_next(pool, child, ref, 70, "child");
}

TYPED_TEST(PoolTruncate, PastTheStartOrTooDeepIsAnErrorThatChangesNothing) {
  using Pool = typename PoolOf<TypeParam>::type;
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 2, .max_rollback_tokens = kRollback}).value();
  const SeqId a = pool.create_sequence().value(), ref = pool.create_sequence().value();
  feed(pool, a, 0, 100);
  feed(pool, ref, 0, 100);
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{101}}) {
    auto st = pool.truncate(a, bad);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, Errc::invalid_argument) << st.error().message;
  }
  auto st = pool.truncate(a, 100 - kRollback - 1);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::unsupported);
  EXPECT_NE(st.error().message.find("max_rollback_tokens"), std::string::npos) << st.error().message;
  ASSERT_TRUE(pool.truncate(a, 100));  // a no-op
  expect_equal_after_next(pool, a, ref, 100, "after the rejected truncations");
  // Layers of different lengths: truncating below the shorter is fine, above it an error.
  ASSERT_TRUE(pool.append(a, 0, rows(101, 1, 0), rows(101, 1, 1), kvtest::iota_positions(101, 1)));
  EXPECT_FALSE(pool.truncate(a, 102));
  EXPECT_TRUE(pool.truncate(a, 101));
}

TEST(PoolTruncateNoRollback, ZeroDepthAllowsOnlyTheCurrentLength) {
  using Pool = PoolOf<PerTok>::type;
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 22, .max_sequences = 1}).value();
  const SeqId a = pool.create_sequence().value();
  feed(pool, a, 0, 20);
  EXPECT_TRUE(pool.truncate(a, 20));
  auto st = pool.truncate(a, 19);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::unsupported);
  EXPECT_EQ(pool.stats().exact_bytes, pool.stats().sequences[0].exact_bytes);
}

}  // namespace pool_truncate_test
