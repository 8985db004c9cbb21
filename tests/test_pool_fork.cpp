// PagedCache::fork: the child shares every page of the parent (copy-on-write); an append (or a
// truncate) on either side never changes what the other holds or attends to. Each side is checked
// bit for bit against a KVCache fed its own tokens.
#include <gtest/gtest.h>

#include <vector>

#include "support/pool_twin.hpp"

namespace pool_fork_test {

using namespace kvpack;  // NOLINT: test file

using Pool = PagedCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<8>, Blocks<64>>;
using Cache = KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<8>, Blocks<64>>;
const ModelShape kShape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 1024};

struct Side {
  SeqId id;
  kvtest::Harness<Cache> twin{kShape};
};

void feed(Pool& pool, Side& s, int n, int seed) {
  const auto k = kvtest::normal(static_cast<size_t>(n) * s.twin.row(), seed);
  const auto v = kvtest::normal(static_cast<size_t>(n) * s.twin.row(), seed + 1000);
  ASSERT_TRUE(pool.append(s.id, 0, k, v, kvtest::iota_positions(s.twin.tokens(), n)));
  s.twin.append(0, k, v);
}

void check(const Pool& pool, Side& s, int seed) {
  for (int h = 0; h < kShape.kv_heads; ++h) kvtest::expect_same_pages(pool, s.id, s.twin.cache(), 0, h);
  const auto q = kvtest::normal(s.twin.qrow(), seed);
  std::vector<float> want(q.size());
  ASSERT_TRUE(s.twin.cache().attend(0, q, want));
  EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(pool, s.id, 0, q), want));
}

TEST(PoolFork, SharesPagesAndEitherSideWritesWithoutTheOtherSeeing) {
  for (int prompt : {31, 33, 64, 95}) {  // committed: no page (31), a partial open page (33), full pages (64, 95)
    auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 22, .max_sequences = 3}).value();
    Side parent;
    parent.id = pool.create_sequence().value();
    feed(pool, parent, prompt + 8, prompt);
    const std::size_t pages_before = pool.stats().pages_used;
    Side child;
    child.id = pool.fork(parent.id).value();
    EXPECT_EQ(pool.stats().pages_used, pages_before) << "fork copies no page";
    EXPECT_EQ(pool.stats().pages_shared, pages_before);
    EXPECT_EQ(pool.stats().bytes_if_unshared, 2 * pool.stats().bytes_used);
    auto parent_rb0 = parent.twin.cache().read_back(0, 0).value();
    // Rebuild the child's twin by replaying the same chunk (same seeds).
    const auto k = kvtest::normal(static_cast<size_t>(prompt + 8) * child.twin.row(), prompt);
    const auto v = kvtest::normal(static_cast<size_t>(prompt + 8) * child.twin.row(), prompt + 1000);
    child.twin.append(0, k, v);
    check(pool, child, 1);
    check(pool, parent, 2);
    // Decode on the child for a while, crossing page boundaries; the parent stays as it was.
    for (int t = 0; t < 40; ++t) feed(pool, child, 1, 100 + t);
    check(pool, child, 3);
    check(pool, parent, 4);
    EXPECT_EQ(parent.twin.cache().read_back(0, 0).value().k, parent_rb0.k);
    // Now the parent writes; the child is unchanged.
    for (int t = 0; t < 40; ++t) feed(pool, parent, 1, 200 + t);
    check(pool, parent, 5);
    check(pool, child, 6);
    // Freeing the parent leaves the child intact.
    ASSERT_TRUE(pool.free_sequence(parent.id));
    check(pool, child, 7);
    EXPECT_EQ(pool.stats().pages_shared, 0u);
  }
}

TEST(PoolFork, ForkOfAForkAndExhaustionOnCopy) {
  auto probe = Pool::create({.shape = kShape, .byte_budget = 1 << 22, .max_sequences = 1}).value();
  const std::size_t page = probe.stats().page_bytes;
  // 2 heads x 1 page for 32 committed tokens (+16 pending), and one spare page.
  auto pool = Pool::create({.shape = kShape, .byte_budget = page * 3, .max_sequences = 3}).value();
  Side a;
  a.id = pool.create_sequence().value();
  feed(pool, a, 48, 9);
  Side b;
  b.id = pool.fork(a.id).value();
  b.twin.append(0, kvtest::normal(48 * b.twin.row(), 9), kvtest::normal(48 * b.twin.row(), 1009));
  // b's next commit writes into the shared open page of both heads: 2 copies needed, 1 free.
  const auto k = kvtest::normal(32 * b.twin.row(), 50);
  auto st = pool.append(b.id, 0, k, k, kvtest::iota_positions(48, 32));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::capacity_exceeded);
  check(pool, a, 11);
  check(pool, b, 12);
  auto c = pool.fork(b.id);
  ASSERT_TRUE(c);
  ASSERT_TRUE(pool.free_sequence(a.id));
  ASSERT_TRUE(pool.free_sequence(b.id));
  EXPECT_EQ(pool.stats().pages_used, 2u) << "the grandchild holds the pages alone";
  EXPECT_EQ(pool.stats().pages_shared, 0u);
}

}  // namespace pool_fork_test
