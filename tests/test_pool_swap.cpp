// PagedCache::swap_out / swap_in (pool/page_swap.hpp, pool/pool_swap.hpp): a sequence swapped out
// frees the pages it holds alone, refuses every call that reads or writes its pages, and comes
// back bit-identical to a sequence of another pool that was never swapped (page bytes, counts,
// positions, attention output), also after its freed pages were reused by other sequences and
// after further decoding and rollback. Shared pages (fork, prefix cache) stay resident. Every
// failure (a target that cannot store or load, a pool short of pages, a foreign header) changes
// nothing; freeing a swapped sequence, or destroying its pool, erases its copies.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "kvpack/pool/page_swap.hpp"
#include "support/pool_twin.hpp"

namespace pool_swap_test {

using namespace kvpack;  // NOLINT: test file

using PerToken4 = std::tuple<Keys<Int4<>>, Values<Int4<>>, Residual<8>, Blocks<32>>;
using Kivi4 = std::tuple<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<16>, Blocks<32>>;
using Sink8 = std::tuple<Keys<Int8<>>, Values<Int8<>>, Sinks<4>, Blocks<32>>;

template <class T>
struct PoolOf {
  using type = typename kvtest::PoolTypes<T>::pool;
};

const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 1024};

template <class Pool>
Pool make_pool(std::size_t pages = 256, int max_seq = 4, int rollback = 0) {
  auto probe = Pool::create({.shape = kShape, .byte_budget = 1 << 22, .max_sequences = 1}).value();
  auto p = Pool::create({.shape = kShape, .byte_budget = pages * probe.stats().page_bytes, .max_sequences = max_seq,
                         .max_rollback_tokens = rollback});
  EXPECT_TRUE(p) << (p ? "" : p.error().message);
  return std::move(p).value();
}

/// Appends n tokens (seeded) to every layer of `id` in `pool`, positions following its length.
template <class Pool>
void feed(Pool& pool, SeqId id, int n, int seed) {
  if (n == 0) return;
  const std::size_t row = static_cast<std::size_t>(kShape.kv_heads) * kShape.head_dim;
  const std::int64_t at = pool.length(id).value();
  for (int l = 0; l < kShape.layers; ++l) {
    const auto k = kvtest::normal(static_cast<std::size_t>(n) * row, seed * 7 + l);
    const auto v = kvtest::normal(static_cast<std::size_t>(n) * row, seed * 7 + l + 1000);
    auto st = pool.append(id, l, k, v, kvtest::iota_positions(at, n));
    ASSERT_TRUE(st) << st.error().message;
  }
}

/// Expects sequence `a` of pool `pa` and `b` of `pb` to hold the same pages and to attend alike.
template <class Pool>
void expect_same(const Pool& pa, SeqId a, const Pool& pb, SeqId b, int seed) {
  kvtest::expect_same_pages(pa, a, pb, b);
  if (pa.length(a).value() == 0) return;
  const auto q = kvtest::normal(static_cast<std::size_t>(kShape.q_heads) * kShape.head_dim, seed);
  for (int l = 0; l < kShape.layers; ++l)
    EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(pa, a, l, q), kvtest::pool_attend(pb, b, l, q))) << "layer " << l;
}

template <class T>
class PoolSwap : public ::testing::Test {};
using Configs = ::testing::Types<PerToken4, Kivi4, Sink8>;
TYPED_TEST_SUITE(PoolSwap, Configs);

TYPED_TEST(PoolSwap, FreesItsPagesAndComesBackBitIdentical) {
  using Pool = typename PoolOf<TypeParam>::type;
  for (int prompt : {0, 1, 31, 33, 95}) {
    SCOPED_TRACE("prompt " + std::to_string(prompt));
    Pool pool = make_pool<Pool>(), twin = make_pool<Pool>();
    HostSwapTarget target;
    const SeqId id = pool.create_sequence().value(), tid = twin.create_sequence().value();
    feed(pool, id, prompt, prompt);
    feed(twin, tid, prompt, prompt);
    const std::size_t held = pool.stats().pages_used;
    auto out = pool.swap_out(id, target);
    ASSERT_TRUE(out) << out.error().message;
    EXPECT_EQ(*out, held);
    EXPECT_EQ(pool.stats().pages_used, 0u);
    EXPECT_EQ(pool.stats().pages_swapped, held);
    EXPECT_EQ(pool.stats().sequences.at(0).swapped_pages, held);
    EXPECT_EQ(target.pages(), held);
    EXPECT_TRUE(pool.swapped_out(id).value());
    EXPECT_EQ(pool.length(id).value(), prompt);
    // Another sequence takes (and writes) the freed pages meanwhile.
    const SeqId other = pool.create_sequence().value();
    feed(pool, other, 95, 99);
    ASSERT_TRUE(pool.free_sequence(other));
    auto in = pool.swap_in(id);
    ASSERT_TRUE(in) << in.error().message;
    EXPECT_EQ(*in, held);
    EXPECT_FALSE(pool.swapped_out(id).value());
    EXPECT_EQ(target.pages(), 0u) << "copies are erased once back";
    EXPECT_EQ(pool.stats().pages_swapped, 0u);
    expect_same(pool, id, twin, tid, 1);
    // Decoding goes on as if nothing happened, across page boundaries.
    for (int t = 0; t < 40; ++t) {
      feed(pool, id, 1, 500 + t);
      feed(twin, tid, 1, 500 + t);
    }
    expect_same(pool, id, twin, tid, 2);
  }
}

TEST(PoolSwap, ASwappedSequenceRefusesWhatReadsOrWritesItsPages) {
  using Pool = PoolOf<PerToken4>::type;
  Pool pool = make_pool<Pool>(256, 4, 8);
  HostSwapTarget target;
  const SeqId id = pool.create_sequence().value(), ok = pool.create_sequence().value();
  feed(pool, id, 70, 1);
  feed(pool, ok, 70, 2);
  ASSERT_TRUE(pool.swap_out(id, target));
  const std::vector<float> row(static_cast<std::size_t>(kShape.kv_heads) * kShape.head_dim, 0.5f);
  const std::vector<std::int32_t> pos{70};
  auto expect_not_present = [](Errc code, const std::string& message, const char* what) {
    EXPECT_EQ(code, Errc::not_present) << what;
    EXPECT_NE(message.find("swapped out"), std::string::npos) << what << ": " << message;
  };
  auto a = pool.append(id, 0, row, row, pos);
  expect_not_present(a.error().code, a.error().message, "append");
  std::vector<float> q(static_cast<std::size_t>(kShape.q_heads) * kShape.head_dim, 0.1f), o(q.size());
  Workspace ws;
  auto at = pool.attend(id, 0, q, o, ws);
  expect_not_present(at.error().code, at.error().message, "attend");
  std::vector<float> q2(2 * q.size(), 0.1f), o2(q2.size());
  std::vector<Workspace> wss(1);
  const std::vector<SeqId> batch{ok, id};
  auto b = pool.attend_batch(0, batch, q2, o2, Executor{}, wss);
  expect_not_present(b.error().code, b.error().message, "attend_batch");
  EXPECT_NE(b.error().message.find("sequence 1 of the batch"), std::string::npos) << b.error().message;
  auto f = pool.fork(id);
  expect_not_present(f.error().code, f.error().message, "fork");
  auto t = pool.truncate(id, 65);
  expect_not_present(t.error().code, t.error().message, "truncate");
  auto pg = pool.pages(id, 0, 0);
  expect_not_present(pg.error().code, pg.error().message, "pages");
  auto rb = pool.read_back(id, 0, 0);
  expect_not_present(rb.error().code, rb.error().message, "read_back");
  const std::vector<std::int32_t> tokens(64, 7);
  auto pub = pool.publish_prefix(id, "m", tokens);
  expect_not_present(pub.error().code, pub.error().message, "publish_prefix");
  auto again = pool.swap_out(id, target);
  expect_not_present(again.error().code, again.error().message, "swap_out twice");
  auto in_ok = pool.swap_in(ok);
  EXPECT_EQ(in_ok.error().code, Errc::invalid_argument) << "not swapped out";
  EXPECT_EQ(pool.tokens(id, 1).value(), 70);
  EXPECT_TRUE(pool.block_positions(id, 0));
  // Back in, everything works again, rollback included (its fp32 copies stayed in memory).
  ASSERT_TRUE(pool.swap_in(id));
  ASSERT_TRUE(pool.truncate(id, 65));
  ASSERT_TRUE(pool.append(id, 0, row, row, std::vector<std::int32_t>{65}));
}

TEST(PoolSwap, SharedPagesStayResidentAndBothSidesStayExact) {
  using Pool = PoolOf<PerToken4>::type;
  Pool pool = make_pool<Pool>(), twin = make_pool<Pool>();
  HostSwapTarget target;
  const SeqId parent = pool.create_sequence().value(), tparent = twin.create_sequence().value();
  feed(pool, parent, 80, 3);  // 2 full pages and a partial one per (layer, head), 8 residual rows
  feed(twin, tparent, 80, 3);
  const SeqId child = pool.fork(parent).value(), tchild = twin.fork(tparent).value();
  feed(pool, parent, 20, 4);  // the parent's open page is copied (copy-on-write): it now holds that one alone
  feed(twin, tparent, 20, 4);
  std::size_t alone = 0;  // the parent's copied open pages and its new ones
  for (int l = 0; l < kShape.layers; ++l)
    for (int h = 0; h < kShape.kv_heads; ++h) {
      const auto views = pool.pages(parent, l, h).value();
      for (const PageView& v : views) alone += v.refs == 1;
    }
  ASSERT_GT(alone, 0u);
  auto out = pool.swap_out(parent, target);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(*out, alone) << "only the pages the parent held alone left";
  EXPECT_GT(pool.stats().pages_shared, 0u);
  expect_same(pool, child, twin, tchild, 5);  // the child reads the shared pages as before
  feed(pool, child, 40, 6);
  feed(twin, tchild, 40, 6);
  ASSERT_TRUE(pool.swap_in(parent));
  expect_same(pool, parent, twin, tparent, 7);
  expect_same(pool, child, twin, tchild, 8);
}

/// A target that fails on purpose: store() after `store_ok` successes, load() of the
/// `load_fail_at`-th page (auth_failed, as a tampered encrypted record), or loads a foreign header.
class FaultyTarget final : public PageSwapTarget {
 public:
  HostSwapTarget inner;
  int store_ok = 1 << 30, load_fail_at = -1, loads = 0;
  bool foreign_header = false;
  Status store(const SwapPageKey& k, const BlockHeader& h, std::span<const std::byte> p) override {
    if (store_ok-- <= 0) return fail(Errc::io_error, "disk full (test)");
    return inner.store(k, h, p);
  }
  Status load(const SwapPageKey& k, BlockHeader& h, std::span<std::byte> p) override {
    if (loads++ == load_fail_at) return fail(Errc::auth_failed, "tag mismatch (test)");
    Status s = inner.load(k, h, p);
    if (s && foreign_header) h.k_bits = 3;
    return s;
  }
  void erase(const SwapPageKey& k) noexcept override { inner.erase(k); }
};

TEST(PoolSwap, FailuresChangeNothing) {
  using Pool = PoolOf<Kivi4>::type;
  Pool pool = make_pool<Pool>(24), twin = make_pool<Pool>(24);
  const SeqId id = pool.create_sequence().value(), tid = twin.create_sequence().value();
  feed(pool, id, 95, 11);
  feed(twin, tid, 95, 11);
  const std::size_t held = pool.stats().pages_used;
  // A store that fails part way: the copies made are erased, the sequence stays resident.
  FaultyTarget target;
  target.store_ok = 3;
  auto out = pool.swap_out(id, target);
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, Errc::io_error);
  EXPECT_NE(out.error().message.find("disk full"), std::string::npos) << out.error().message;
  EXPECT_EQ(target.inner.pages(), 0u);
  EXPECT_EQ(pool.stats().pages_used, held);
  EXPECT_FALSE(pool.swapped_out(id).value());
  expect_same(pool, id, twin, tid, 1);
  target.store_ok = 1 << 30;
  ASSERT_TRUE(pool.swap_out(id, target));
  // The pool short of pages: swap_in refuses, the sequence stays out with its copies.
  const SeqId hog = pool.create_sequence().value();
  while (pool.stats().pages_free > 0) feed(pool, hog, 32, 13);
  auto in = pool.swap_in(id);
  ASSERT_FALSE(in);
  EXPECT_EQ(in.error().code, Errc::capacity_exceeded);
  EXPECT_TRUE(pool.swapped_out(id).value());
  EXPECT_EQ(target.inner.pages(), held);
  ASSERT_TRUE(pool.free_sequence(hog));
  // A load that fails verification, then a foreign header: nothing taken, copies kept.
  const std::size_t free_before = pool.stats().pages_free;
  target.loads = 0, target.load_fail_at = 2;  // the third page of this swap_in
  in = pool.swap_in(id);
  ASSERT_FALSE(in);
  EXPECT_EQ(in.error().code, Errc::auth_failed);
  EXPECT_NE(in.error().message.find("page"), std::string::npos) << in.error().message;
  EXPECT_EQ(pool.stats().pages_free, free_before);
  target.load_fail_at = -1;
  target.foreign_header = true;
  in = pool.swap_in(id);
  ASSERT_FALSE(in);
  EXPECT_EQ(in.error().code, Errc::corrupt_data);
  EXPECT_EQ(pool.stats().pages_free, free_before);
  EXPECT_TRUE(pool.swapped_out(id).value());
  EXPECT_EQ(target.inner.pages(), held);
  target.foreign_header = false;
  ASSERT_TRUE(pool.swap_in(id));
  expect_same(pool, id, twin, tid, 2);
}

TEST(PoolSwap, FreeingOrDestroyingErasesTheCopies) {
  using Pool = PoolOf<Sink8>::type;
  HostSwapTarget target;
  {
    Pool pool = make_pool<Pool>();
    const SeqId a = pool.create_sequence().value(), b = pool.create_sequence().value();
    feed(pool, a, 70, 1);
    feed(pool, b, 70, 2);
    ASSERT_TRUE(pool.swap_out(a, target));
    ASSERT_TRUE(pool.swap_out(b, target));
    const std::size_t both = target.pages();
    ASSERT_GT(both, 0u);
    ASSERT_TRUE(pool.free_sequence(a));
    EXPECT_EQ(target.pages(), both / 2);
    EXPECT_FALSE(pool.valid(a));
    EXPECT_EQ(pool.stats().pages_swapped, both / 2);
  }  // the pool goes with b still swapped out
  EXPECT_EQ(target.pages(), 0u);
  EXPECT_EQ(target.bytes(), 0u);
}

}  // namespace pool_swap_test
