// PagedCache with token-level eviction (pool/paged_eviction.hpp): a pool sequence fed the same
// appends and attends as a KVCache of the same policies holds the same pages (codes, positions,
// counts), tokens and read_back rows, and attends bit-identically, at prompts of 1, 31, 33, 95 and 200 tokens
// (beyond every budget), two layers, GQA 6:2, for SinkWindow, H2O, SnapKV, TOVA, BlockSparse and three
// Protocol<P, FixedBudget> forms. Fork then evict on either side: each side equals a solo KVCache
// of its own history, the other side's pages stay untouched. Exhaustion during a copy-on-write copy, truncate (unsupported), batched decode.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "kvpack/executor.hpp"
#include "support/pool_twin.hpp"

namespace pool_evict_test {

using namespace kvpack;  // NOLINT: test file

using SW = std::tuple<Keys<Int4<>>, Values<Int4<>>, Residual<4>, Blocks<16>, SinkWindow<4, 40>>;
using HH = std::tuple<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Blocks<16>, H2O<16, 16, 2>>;
using Snap = std::tuple<Keys<Int4<>>, Values<Int4<>>, Blocks<16>, SnapKV<24, 8, 3>>;
using Tova = std::tuple<Keys<Int4<>>, Values<Int8<>>, Blocks<32>, TOVA<40, 2>>;
// Protocol forms: budgets resolved against the prompt; SnapKV then evicts continuously by its mass.
using ProtoSK = std::tuple<Keys<Int8<>>, Values<Int4<>>, Blocks<16>, Protocol<SnapKVBudget<Fraction<1, 2>, 8, 3>, FixedBudget>>;
using ProtoHH = std::tuple<Keys<Int4<>>, Values<Int4<>>, Residual<2>, Blocks<16>, Protocol<H2OBudget<Fraction<1, 2>, 2>, FixedBudget>>;
// BlockSparse: a victim block is a page, dropped from the table at once (KVCache masks it until it
// compacts); with fp32 sinks, and a Protocol form whose budget is half the prompt.
using BS = std::tuple<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Blocks<16>, BlockSparse<Tokens<80>, 16, 1, 1>>;
using ProtoBS = std::tuple<Keys<Int4<>>, Values<Int4<>>, Blocks<16>, Protocol<BlockSparse<Fraction<1, 2>, 16, 1, 1>, FixedBudget>>;

template <class T>
using Types = kvtest::PoolTypes<T>;

const ModelShape kShape{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};
constexpr std::size_t kRow = 2 * 64, kQRow = 6 * 64;

/// One step of a history: n tokens appended to every layer, then the last min(n, 8) attended in
/// every layer (what feeds H2O/TOVA mass and SnapKV's observation window); data from `seed`.
struct Step {
  int n;
  std::uint32_t seed;
};
std::vector<Step> steps(int prompt, int decode, std::uint32_t seed) {
  std::vector<Step> s{{prompt, seed}};
  for (int i = 0; i < decode; ++i) s.push_back({1, seed + 1 + static_cast<std::uint32_t>(i)});
  return s;
}

/// Feeds one step to a pool sequence and a KVCache; expects equal attention bits, pages and held
/// tokens after it.
template <class Pool, class Cache>
void feed(Pool& pool, SeqId id, Cache& cache, const Step& s) {
  const std::int64_t first = cache.tokens(0);
  for (int l = 0; l < kShape.layers; ++l) {
    const auto k = kvtest::normal(static_cast<std::size_t>(s.n) * kRow, s.seed * 16 + 2 * l);
    const auto v = kvtest::normal(static_cast<std::size_t>(s.n) * kRow, s.seed * 16 + 2 * l + 1);
    const auto pos = kvtest::iota_positions(first, s.n);
    auto a = pool.append(id, l, k, v, pos);
    ASSERT_TRUE(a) << a.error().message;
    ASSERT_TRUE(cache.append(l, k, v, pos));
  }
  Workspace ws;
  for (int l = 0; l < kShape.layers; ++l) {
    const int n_q = std::min(s.n, 8);
    const auto q = kvtest::normal(static_cast<std::size_t>(n_q) * kQRow, s.seed * 16 + 8 + l);
    std::vector<float> got(q.size()), want(q.size());
    ASSERT_TRUE(pool.attend(id, l, q, got, ws));
    ASSERT_TRUE(cache.attend(l, q, want));
    EXPECT_TRUE(kvtest::same_bits(got, want)) << "layer " << l << " at " << cache.tokens(0) << " tokens";
  }
  for (int l = 0; l < kShape.layers; ++l)
    for (int h = 0; h < kShape.kv_heads; ++h) {
      kvtest::expect_same_pages(pool, id, cache, l, h);
      EXPECT_EQ(*pool.held_tokens(id, l, h), cache.held_tokens(l, h)) << "layer " << l << " head " << h;
      // read_back decodes the same held rows, cache indices and positions (bit for bit).
      const auto got = pool.read_back(id, l, h), want = cache.read_back(l, h);
      ASSERT_TRUE(got && want);
      EXPECT_EQ(got->indices, want->indices) << "layer " << l << " head " << h;
      EXPECT_EQ(got->positions, want->positions) << "layer " << l << " head " << h;
      EXPECT_TRUE(kvtest::same_bits(got->k, want->k) && kvtest::same_bits(got->v, want->v)) << "layer " << l << " head " << h;
    }
}

template <class Pool>
Pool make_pool(std::size_t budget = std::size_t{1} << 22, int max_seq = 4) {
  auto p = Pool::create({.shape = kShape, .byte_budget = budget, .max_sequences = max_seq});
  EXPECT_TRUE(p) << (p ? "" : p.error().message);
  return std::move(p).value();
}
template <class Cache>
Cache make_cache() {
  auto c = Cache::create(kShape);
  EXPECT_TRUE(c);
  return std::move(c).value();
}
// A KVCache fed `hist` (the solo run a pool sequence is compared with), checked against the pool.
template <class Pool, class Cache>
void replay(Pool& pool, SeqId id, Cache& cache, const std::vector<Step>& hist) {
  for (const Step& s : hist) {
    feed(pool, id, cache, s);
    if (::testing::Test::HasFatalFailure()) return;
  }
}
// Every page byte of a sequence (all layers and heads), to check that it does not change.
template <class Pool>
std::vector<std::byte> snapshot(const Pool& pool, SeqId id) {
  std::vector<std::byte> out;
  for (int l = 0; l < kShape.layers; ++l)
    for (int h = 0; h < kShape.kv_heads; ++h) {
      const auto pages = pool.pages(id, l, h);
      for (const PageView& p : *pages) out.insert(out.end(), p.data, p.data + pool.block_layout().bytes);
    }
  return out;
}

template <class T>
class PoolEvict : public ::testing::Test {};
using Configs = ::testing::Types<SW, HH, Snap, Tova, ProtoSK, ProtoHH, BS, ProtoBS>;
TYPED_TEST_SUITE(PoolEvict, Configs);

TYPED_TEST(PoolEvict, EqualsKVCacheBitForBit) {
  using Pool = typename Types<TypeParam>::pool;
  using Cache = typename Types<TypeParam>::cache;
  for (int prompt : {1, 31, 33, 95, 200}) {
    Pool pool = make_pool<Pool>();
    Cache cache = make_cache<Cache>();
    const SeqId id = *pool.create_sequence();
    replay(pool, id, cache, steps(prompt, 30, 1000u * static_cast<std::uint32_t>(prompt)));
    EXPECT_EQ(*pool.eviction_budget(id), cache.eviction_budget());
    if (prompt == 200) {
      EXPECT_LT(*pool.held_tokens(id, 0, 0), 200);  // eviction happened
    }
    ASSERT_TRUE(pool.free_sequence(id));
    EXPECT_EQ(pool.stats().pages_free, pool.stats().pages_total);
  }
}

// An append holding NaN/Inf is rejected in the pass that copies it (the sequence's stage),
// before anything is reserved or committed: K reported before V, with layer, KV head, token and
// channel; the sequence attends bit-identically afterwards and takes the next append.
TYPED_TEST(PoolEvict, NonFiniteAppendsChangeNothing) {
  using Pool = typename Types<TypeParam>::pool;
  Pool pool = make_pool<Pool>();
  const SeqId id = *pool.create_sequence();
  for (int l = 0; l < kShape.layers; ++l)
    ASSERT_TRUE(pool.append(id, l, kvtest::normal(40 * kRow, 1 + l), kvtest::normal(40 * kRow, 3 + l), kvtest::iota_positions(0, 40)));
  const auto q = kvtest::normal(kQRow, 9);
  std::vector<float> before(q.size()), after(q.size());
  Workspace ws;
  ASSERT_TRUE(pool.attend(id, 1, q, before, ws));
  const std::size_t free0 = pool.stats().pages_free;
  for (bool in_v : {false, true}) {
    auto k = kvtest::normal(20 * kRow, 5), v = kvtest::normal(20 * kRow, 6);
    (in_v ? v : k)[7 * kRow + 64 + 3] = std::numeric_limits<float>::quiet_NaN();  // token 7, KV head 1, channel 3
    const Status st = pool.append(id, 1, k, v, kvtest::iota_positions(40, 20));
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, Errc::non_finite);
    EXPECT_NE(st.error().message.find(std::string(in_v ? "non-finite V" : "non-finite K") +
                                      " value nan at layer 1, kv head 1, token 7 of the chunk (cache index 47), channel 3"),
              std::string::npos)
        << st.error().message;
  }
  EXPECT_EQ(pool.stats().pages_free, free0);
  ASSERT_TRUE(pool.attend(id, 1, q, after, ws));
  EXPECT_EQ(before, after);
  EXPECT_TRUE(pool.append(id, 1, kvtest::normal(kRow, 7), kvtest::normal(kRow, 8), kvtest::iota_positions(40, 1)));
}

TYPED_TEST(PoolEvict, ForkThenEvictOnEitherSide) {
  using Pool = typename Types<TypeParam>::pool;
  using Cache = typename Types<TypeParam>::cache;
  Pool pool = make_pool<Pool>();
  const std::size_t free0 = pool.stats().pages_free;
  const auto A = steps(95, 3, 1);
  const auto X = steps(1, 25, 500), Y = steps(1, 25, 900), Z = steps(1, 10, 700);
  Cache parent_solo = make_cache<Cache>(), child_solo = make_cache<Cache>();
  const SeqId parent = *pool.create_sequence();
  replay(pool, parent, parent_solo, A);
  {  // the child's solo run needs A too (its scores and policy state are the parent's at the fork)
    Pool scratch = make_pool<Pool>();
    const SeqId s = *scratch.create_sequence();
    replay(scratch, s, child_solo, A);
  }
  const SeqId child = *pool.fork(parent);
  EXPECT_GT(pool.stats().pages_shared, 0u);
  const auto parent_pages = snapshot(pool, parent);
  replay(pool, child, child_solo, X);  // child evicts: copies shared pages first
  EXPECT_EQ(snapshot(pool, parent), parent_pages) << "the child's eviction changed the parent's pages";
  const auto child_pages = snapshot(pool, child);
  replay(pool, parent, parent_solo, Y);  // then the parent
  EXPECT_EQ(snapshot(pool, child), child_pages) << "the parent's eviction changed the child's pages";
  replay(pool, child, child_solo, Z);  // and the child again, after the parent moved on
  const PoolStats st = pool.stats();
  EXPECT_EQ(st.sequences.size(), 2u);
  EXPECT_GT(st.exact_bytes, 0u);
  EXPECT_EQ(pool.memory_bytes(), st.pages_total * st.page_bytes + st.overhead_bytes + st.exact_bytes);
  ASSERT_TRUE(pool.free_sequence(parent));
  ASSERT_TRUE(pool.free_sequence(child));
  EXPECT_EQ(pool.stats().pages_free, free0);
}

// Fork between two prompt chunks (pages already hold the first chunk): the first decode then
// compresses (SnapKV: drops and compaction over shared pages) or evicts on each side in turn.
template <class Pool, class Cache>
void fork_during_prefill() {
  Pool pool = make_pool<Pool>();
  const std::vector<Step> A{{60, 5}, {35, 6}};
  Cache parent_solo = make_cache<Cache>(), child_solo = make_cache<Cache>();
  const SeqId parent = *pool.create_sequence();
  replay(pool, parent, parent_solo, A);
  {
    Pool scratch = make_pool<Pool>();
    replay(scratch, *scratch.create_sequence(), child_solo, A);
  }
  const SeqId child = *pool.fork(parent);
  EXPECT_GT(pool.stats().pages_shared, 0u);
  const auto parent_pages = snapshot(pool, parent);
  replay(pool, child, child_solo, steps(1, 12, 50));
  EXPECT_EQ(snapshot(pool, parent), parent_pages) << "the child's compression changed the parent's pages";
  const auto child_pages = snapshot(pool, child);
  replay(pool, parent, parent_solo, steps(1, 12, 80));
  EXPECT_EQ(snapshot(pool, child), child_pages) << "the parent's compression changed the child's pages";
}
TYPED_TEST(PoolEvict, ForkDuringPrefillThenCompressOnEitherSide) {
  fork_during_prefill<typename Types<TypeParam>::pool, typename Types<TypeParam>::cache>();
}
// SnapKV keeping 88 of 95 prompt tokens: most pages lose no token, so compaction drops its
// reference to pages still shared with the other side without copying them (they must survive).
TEST(PoolEvictSnapKV, CompactionKeepsPagesSharedWithTheOtherSide) {
  using P = Types<std::tuple<Keys<Int4<>>, Values<Int4<>>, Blocks<16>, SnapKV<80, 8, 1>>>;
  fork_during_prefill<P::pool, P::cache>();
}

// BlockSparse's victim page goes back to the pool during the append that evicts it: a sequence
// never holds more than the budget's pages (80 tokens, 2 in fp32 sinks: at most 5 pages of 16 per
// KV head), every page the pool counts as used is in its table, while the KVCache twin keeps
// masked-out blocks until it compacts (more blocks than the pool's pages at some step).
TEST(PoolEvictBlockSparse, AVictimPageReturnsToThePoolAtOnce) {
  using Pool = Types<BS>::pool;
  using Cache = Types<BS>::cache;
  Pool pool = make_pool<Pool>();
  Cache twin = make_cache<Cache>();
  const SeqId id = *pool.create_sequence();
  bool twin_held_more = false;
  for (const Step& s : steps(95, 60, 77)) {
    feed(pool, id, twin, s);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    std::size_t in_tables = 0;
    for (int l = 0; l < kShape.layers; ++l)
      for (int h = 0; h < kShape.kv_heads; ++h) {
        const std::size_t pages = pool.pages(id, l, h)->size();
        EXPECT_LE(pages, 5u) << "layer " << l << " head " << h << " at " << twin.tokens(0) << " tokens";
        twin_held_more = twin_held_more || twin.blocks(l, h).size() > pages;
        in_tables += pages;
      }
    EXPECT_EQ(pool.stats().pages_used, in_tables);
  }
  EXPECT_TRUE(twin_held_more);
  ASSERT_TRUE(pool.free_sequence(id));
  EXPECT_EQ(pool.stats().pages_free, pool.stats().pages_total);
}

// An append asks for the pages of a compaction only while one can follow: SnapKV before its
// prompt is compressed. A Protocol<BlockSparse> prompt's end (400 tokens of 8-token pages: 50
// pages, halved) runs in a 64-page pool, and SnapKV decodes after its compression with 4 pages
// free (before, every single-token append asked for a fresh copy of all the layer's pages).
template <class Pool>
Pool small_pool(std::size_t pages, const ModelShape& shape) {
  const std::size_t page = Pool::create({.shape = shape, .byte_budget = 1 << 20}).value().stats().page_bytes;
  return Pool::create({.shape = shape, .byte_budget = pages * page, .max_sequences = 2}).value();
}
TEST(PoolEvictPages, NoCompactionPagesAfterThePrompt) {
  const ModelShape shape{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 32, .max_tokens = 4096};
  const std::size_t row = 32, qrow = 64;
  auto prompt = [&](auto& pool, SeqId id) {
    ASSERT_TRUE(pool.append(id, 0, kvtest::normal(400 * row, 1), kvtest::normal(400 * row, 2), kvtest::iota_positions(0, 400)));
    std::vector<float> q(8 * qrow, 0.1f), out(q.size());
    Workspace ws;
    ASSERT_TRUE(pool.attend(id, 0, q, out, ws));
  };
  auto decode = [&](auto& pool, SeqId id) {
    const std::int64_t at = *pool.length(id);
    return pool.append(id, 0, kvtest::normal(row, 3 + static_cast<std::uint32_t>(at)), kvtest::normal(row, 4), kvtest::iota_positions(at, 1));
  };
  {
    auto pool = small_pool<PagedCache<Keys<Int8<>>, Values<Int4<>>, Blocks<8>, Protocol<BlockSparse<Fraction<1, 2>, 8, 1, 1>, FixedBudget>>>(64, shape);
    const SeqId id = *pool.create_sequence();
    prompt(pool, id);
    const Status st = decode(pool, id);
    ASSERT_TRUE(st) << st.error().message;
    EXPECT_LE(pool.stats().pages_used, 26u);  // 200 tokens: 25 pages and the open one
  }
  auto pool = small_pool<PagedCache<Keys<Int8<>>, Values<Int4<>>, Blocks<8>, SnapKV<96, 8, 3>>>(110, shape);
  const SeqId id = *pool.create_sequence();
  prompt(pool, id);
  ASSERT_TRUE(decode(pool, id));  // compresses: 50 pages, then 13 fresh ones
  const SeqId hog = *pool.create_sequence();
  for (std::int64_t t = 0; pool.stats().pages_free > 4; ++t)
    ASSERT_TRUE(pool.append(hog, 0, kvtest::normal(8 * row, 9), kvtest::normal(8 * row, 10), kvtest::iota_positions(8 * t, 8)));
  for (int i = 0; i < 20; ++i) {
    const Status st = decode(pool, id);
    ASSERT_TRUE(st) << "decode " << i << ": " << st.error().message;
  }
}

TYPED_TEST(PoolEvict, ForkThenAttendOnlyChangesOneSide) {
  using Pool = typename Types<TypeParam>::pool;
  using Cache = typename Types<TypeParam>::cache;
  Pool pool = make_pool<Pool>();
  const auto A = steps(60, 2, 3);
  Cache parent_solo = make_cache<Cache>();
  const SeqId parent = *pool.create_sequence();
  replay(pool, parent, parent_solo, A);
  const SeqId child = *pool.fork(parent);
  Workspace ws;
  for (int i = 0; i < 3; ++i) {  // the child attends (changing its scores) without appending
    const auto q = kvtest::normal(kQRow, 77 + static_cast<std::uint32_t>(i));
    std::vector<float> out(q.size());
    ASSERT_TRUE(pool.attend(child, 0, q, out, ws));
  }
  replay(pool, parent, parent_solo, steps(1, 20, 40));  // the parent still equals its solo run
}

// Feeds `hist` without checks; false when an append fails (the pool is too small).
template <class Pool>
bool try_feed(Pool& pool, SeqId id, const std::vector<Step>& hist) {
  for (const Step& s : hist) {
    const std::int64_t first = *pool.length(id);
    for (int l = 0; l < kShape.layers; ++l) {
      const auto k = kvtest::normal(static_cast<std::size_t>(s.n) * kRow, s.seed * 16 + 2 * l);
      const auto v = kvtest::normal(static_cast<std::size_t>(s.n) * kRow, s.seed * 16 + 2 * l + 1);
      if (!pool.append(id, l, k, v, kvtest::iota_positions(first, s.n))) return false;
    }
    Workspace ws;
    for (int l = 0; l < kShape.layers; ++l) {
      const int n_q = std::min(s.n, 8);
      const auto q = kvtest::normal(static_cast<std::size_t>(n_q) * kQRow, s.seed * 16 + 8 + l);
      std::vector<float> out(q.size());
      if (!pool.attend(id, l, q, out, ws)) return false;
    }
  }
  return true;
}

TYPED_TEST(PoolEvict, ExhaustionDuringCopyOnWriteChangesNothing) {
  using Pool = typename Types<TypeParam>::pool;
  using Cache = typename Types<TypeParam>::cache;
  const auto A = steps(95, 3, 11);
  std::size_t page_bytes = 0;
  {
    Pool big = make_pool<Pool>();
    page_bytes = big.stats().page_bytes;
  }
  std::size_t pages = 1;  // the smallest pool A runs in: after it, (almost) no page is free
  for (;; ++pages) {
    ASSERT_LT(pages, 200u);
    Pool p = make_pool<Pool>(pages * page_bytes);
    if (try_feed(p, *p.create_sequence(), A)) break;
  }
  Pool pool = make_pool<Pool>(pages * page_bytes, 8);
  Cache parent_solo = make_cache<Cache>(), child_solo = make_cache<Cache>();
  const SeqId parent = *pool.create_sequence();
  replay(pool, parent, parent_solo, A);
  {
    Pool scratch = make_pool<Pool>();
    replay(scratch, *scratch.create_sequence(), child_solo, A);
  }
  const SeqId child = *pool.fork(parent);
  std::vector<SeqId> hogs;  // other sequences take the free pages, one token at a time
  for (int h = 0; h < 6 && pool.stats().pages_free > 0; ++h) {
    hogs.push_back(*pool.create_sequence());
    for (int t = 0; t < 300 && pool.stats().pages_free > 0; ++t)
      if (!try_feed(pool, hogs.back(), {{1, 4000u + 300u * static_cast<std::uint32_t>(h) + static_cast<std::uint32_t>(t)}})) break;
  }
  const auto before = snapshot(pool, child);
  const PoolStats s0 = pool.stats();
  ASSERT_LT(s0.pages_free, s0.pages_shared / 2) << "the pool must be too small to copy layer 0's shared pages";
  const auto k = kvtest::normal(kRow, 5), v = kvtest::normal(kRow, 6);
  auto st = pool.append(child, 0, k, v, kvtest::iota_positions(*pool.length(child), 1));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::capacity_exceeded) << st.error().message;
  EXPECT_NE(st.error().message.find("pages needed"), std::string::npos) << st.error().message;
  EXPECT_EQ(snapshot(pool, child), before);
  EXPECT_EQ(pool.stats().pages_free, s0.pages_free);
  EXPECT_EQ(*pool.tokens(child, 0), *pool.tokens(parent, 0));
  ASSERT_TRUE(pool.free_sequence(parent));  // the child's pages are its own now: it goes on as its solo run
  for (const SeqId h : hogs) ASSERT_TRUE(pool.free_sequence(h));
  replay(pool, child, child_solo, steps(1, 20, 300));
  ASSERT_TRUE(pool.free_sequence(child));
  EXPECT_EQ(pool.stats().pages_free, pool.stats().pages_total);
}

TYPED_TEST(PoolEvict, TruncateIsUnsupportedAndChangesNothing) {
  using Pool = typename Types<TypeParam>::pool;
  using Cache = typename Types<TypeParam>::cache;
  Pool pool = make_pool<Pool>();
  Cache solo = make_cache<Cache>();
  const SeqId id = *pool.create_sequence();
  replay(pool, id, solo, steps(50, 2, 21));
  auto st = pool.truncate(id, 49);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::unsupported);
  EXPECT_NE(st.error().message.find("eviction"), std::string::npos) << st.error().message;
  replay(pool, id, solo, steps(1, 10, 60));  // unchanged: still its solo run
}

TYPED_TEST(PoolEvict, BatchEqualsPerSequenceAttend) {
  using Pool = typename Types<TypeParam>::pool;
  Pool a = make_pool<Pool>(), b = make_pool<Pool>();
  std::vector<SeqId> sa, sb;
  for (int prompt : {1, 33, 95}) {  // sequences of different lengths and states
    for (auto* p : {&a, &b}) {
      const SeqId s = *p->create_sequence();
      for (int l = 0; l < kShape.layers; ++l) {
        const auto k = kvtest::normal(static_cast<std::size_t>(prompt) * kRow, 10u * static_cast<std::uint32_t>(prompt) + l);
        ASSERT_TRUE(p->append(s, l, k, k, kvtest::iota_positions(0, prompt)));
        Workspace ws;
        std::vector<float> q = kvtest::normal(kQRow, 3u + static_cast<std::uint32_t>(l)), out(kQRow);
        ASSERT_TRUE(p->attend(s, l, q, out, ws));
      }
      (p == &a ? sa : sb).push_back(s);
    }
  }
  for (auto* p : {&a, &b}) (p == &a ? sa : sb).push_back(*p->fork((p == &a ? sa : sb)[2]));  // and a fork
  std::vector<Workspace> ws(2);
  const Executor exec = thread_executor(2);
  for (int step = 0; step < 30; ++step)
    for (int l = 0; l < kShape.layers; ++l) {
      for (std::size_t i = 0; i < sa.size(); ++i) {
        const auto k = kvtest::normal(kRow, 7000u + 100u * static_cast<std::uint32_t>(step) + 10u * static_cast<std::uint32_t>(i) + l);
        const auto pos = kvtest::iota_positions(*a.tokens(sa[i], l), 1);
        ASSERT_TRUE(a.append(sa[i], l, k, k, pos));
        ASSERT_TRUE(b.append(sb[i], l, k, k, pos));
      }
      const auto q = kvtest::normal(sa.size() * kQRow, 9000u + static_cast<std::uint32_t>(step * 2 + l));
      std::vector<float> got(q.size()), want(q.size());
      ASSERT_TRUE(a.attend_batch(l, sa, q, got, exec, ws));
      for (std::size_t i = 0; i < sb.size(); ++i) {
        std::vector<float> qi(q.begin() + static_cast<std::ptrdiff_t>(i * kQRow), q.begin() + static_cast<std::ptrdiff_t>((i + 1) * kQRow)), oi(kQRow);
        ASSERT_TRUE(b.attend(sb[i], l, qi, oi, ws[0]));
        std::copy(oi.begin(), oi.end(), want.begin() + static_cast<std::ptrdiff_t>(i * kQRow));
      }
      EXPECT_TRUE(kvtest::same_bits(got, want)) << "step " << step << " layer " << l;
    }
  for (std::size_t i = 0; i < sa.size(); ++i) kvtest::expect_same_pages(a, sa[i], b, sb[i]);
  const std::vector<SeqId> twice{sa[0], sa[0]};
  std::vector<float> q(2 * kQRow, 0.5f), out(q.size());
  auto st = a.attend_batch(0, twice, q, out, exec, ws);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
}

}  // namespace pool_evict_test
