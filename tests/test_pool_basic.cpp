// PagedCache basics: a pool sequence equals a KVCache of the same policies bit for bit (page
// bytes, attention output) and, through it, the float64 reference at odd lengths (1, 31, 33, 95);
// handles (freed, stale, too many); pool exhaustion (clear error, nothing changed); memory and
// page layout (line-aligned, ascending per KV head).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "support/pool_twin.hpp"

namespace pool_basic_test {

using namespace kvpack;  // NOLINT: test file

using PerToken4 = std::tuple<Keys<Int4<>>, Values<Int4<>>, Residual<8>, Blocks<32>>;
using Kivi4 = std::tuple<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<16>>;
using Sink8 = std::tuple<Keys<Int8<>>, Values<Int8<>>, Sinks<4>>;

template <class T>
using Types = kvtest::PoolTypes<T>;

template <class T>
class PoolTwin : public ::testing::Test {};
using Configs = ::testing::Types<PerToken4, Kivi4, Sink8>;
TYPED_TEST_SUITE(PoolTwin, Configs);

const ModelShape kShape{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};

template <class Pool>
Pool make_pool(std::size_t budget = std::size_t{1} << 24, int max_seq = 4, int rollback = 0) {
  auto p = Pool::create({.shape = kShape, .byte_budget = budget, .max_sequences = max_seq, .max_rollback_tokens = rollback});
  EXPECT_TRUE(p) << (p ? "" : p.error().message);
  return std::move(p).value();
}

TYPED_TEST(PoolTwin, EqualsKVCacheBitForBitAndTheReference) {
  using Pool = typename Types<TypeParam>::pool;
  using Cache = typename Types<TypeParam>::cache;
  for (int prompt : {1, 31, 33, 95}) {
    Pool pool = make_pool<Pool>();
    kvtest::Harness<Cache> twin(kShape);
    auto id = pool.create_sequence();
    ASSERT_TRUE(id);
    int seed = prompt * 10;
    for (int step = 0; step < 4; ++step) {  // the prompt, then 3 decode tokens
      const int n = step == 0 ? prompt : 1;
      for (int l = 0; l < kShape.layers; ++l) {
        const auto k = kvtest::normal(static_cast<size_t>(n) * twin.row(), ++seed);
        const auto v = kvtest::normal(static_cast<size_t>(n) * twin.row(), ++seed);
        const auto pos = kvtest::iota_positions(twin.tokens() - (l == 0 ? 0 : n), n);
        ASSERT_TRUE(pool.append(*id, l, k, v, pos));
        if (l == 0) twin.append(0, k, v);
        else ASSERT_TRUE(twin.cache().append(l, k, v, pos));
      }
      ASSERT_EQ(*pool.length(*id), twin.tokens());
      for (int l = 0; l < kShape.layers; ++l)
        for (int h = 0; h < kShape.kv_heads; ++h) {
          kvtest::expect_same_pages(pool, *id, twin.cache(), l, h);
          const auto got = pool.read_back(*id, l, h);
          const auto want_rb = twin.cache().read_back(l, h);
          ASSERT_TRUE(got && want_rb);
          EXPECT_EQ(got->k, want_rb->k);
          EXPECT_EQ(got->v, want_rb->v);
          EXPECT_EQ(got->positions, want_rb->positions);
          EXPECT_EQ(got->indices, want_rb->indices);
        }
      const int n_q = std::min(n, 3);
      const auto q = kvtest::normal(static_cast<size_t>(n_q) * twin.qrow(), ++seed);
      std::vector<float> want(q.size());
      ASSERT_TRUE(twin.cache().attend(0, q, want));
      EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(pool, *id, 0, q), want)) << "prompt " << prompt << " step " << step;
      EXPECT_LE(twin.attend_error(0, q), 1e-5) << "prompt " << prompt << " step " << step;
    }
  }
}

TYPED_TEST(PoolTwin, EmptySequenceHasNothingToAttend) {
  using Pool = typename Types<TypeParam>::pool;
  Pool pool = make_pool<Pool>();
  auto id = pool.create_sequence();
  ASSERT_TRUE(id);
  EXPECT_EQ(*pool.length(*id), 0);
  std::vector<float> q(static_cast<size_t>(kShape.q_heads) * kShape.head_dim, 0.5f), out(q.size());
  Workspace ws;
  auto st = pool.attend(*id, 0, q, out, ws);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
  EXPECT_TRUE(pool.append(*id, 0, {}, {}, {}));  // n = 0 is a no-op
  EXPECT_EQ(*pool.length(*id), 0);
}

TEST(PoolHandles, FreedAndStaleHandlesAreRejected) {
  using Pool = Types<PerToken4>::pool;
  Pool pool = make_pool<Pool>(std::size_t{1} << 20, 2);
  auto a = pool.create_sequence();
  auto b = pool.create_sequence();
  ASSERT_TRUE(a && b);
  auto c = pool.create_sequence();
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Errc::capacity_exceeded);
  const auto row = static_cast<size_t>(kShape.kv_heads) * kShape.head_dim;
  const auto k = kvtest::normal(40 * row, 1);
  ASSERT_TRUE(pool.append(*a, 0, k, k, kvtest::iota_positions(0, 40)));
  const std::size_t used = pool.stats().pages_used;
  EXPECT_GT(used, 0u);
  ASSERT_TRUE(pool.free_sequence(*a));
  EXPECT_EQ(pool.stats().pages_used, 0u) << "the freed sequence's pages return to the free list";
  EXPECT_FALSE(pool.valid(*a));
  for (auto st : {pool.append(*a, 0, k, k, kvtest::iota_positions(0, 40)), pool.free_sequence(*a), pool.truncate(*a, 0)}) {
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, Errc::invalid_argument);
    EXPECT_NE(st.error().message.find("not live"), std::string::npos) << st.error().message;
  }
  EXPECT_FALSE(pool.length(*a));
  EXPECT_FALSE(pool.fork(*a));
  auto d = pool.create_sequence();  // reuses a's slot with a new generation
  ASSERT_TRUE(d);
  EXPECT_EQ(d->index, a->index);
  EXPECT_FALSE(pool.valid(*a));
  EXPECT_TRUE(pool.valid(*d));
  EXPECT_FALSE(pool.valid(SeqId{}));
  EXPECT_FALSE(pool.valid(SeqId{7, 1}));
  EXPECT_EQ(*pool.length(*d), 0);
  EXPECT_FALSE(pool.read_back(*a, 0, 0));
  EXPECT_FALSE(pool.read_back(*d, 0, 2));
}

TEST(PoolExhaustion, ClearErrorAndNothingChanged) {
  using Pool = Types<PerToken4>::pool;
  using Cache = Types<PerToken4>::cache;
  const std::size_t page = PagePool::stride_for(make_pool<Pool>().block_layout().bytes);
  Pool pool = make_pool<Pool>(page * 9, 2);  // 9 pages: 2 layers x 2 heads x 2 blocks, and one more
  kvtest::Harness<Cache> twin(kShape);
  auto a = pool.create_sequence();
  ASSERT_TRUE(a);
  const auto row = twin.row();
  const auto k = kvtest::normal(72 * row, 2), v = kvtest::normal(72 * row, 3);  // 64 committed: 2 pages per head
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(pool.append(*a, l, k, v, kvtest::iota_positions(0, 72)));
    if (l == 0) twin.append(0, k, v);
    else ASSERT_TRUE(twin.cache().append(1, k, v, kvtest::iota_positions(0, 72)));
  }
  EXPECT_EQ(pool.stats().pages_free, 1u);
  const auto k2 = kvtest::normal(32 * row, 4);  // commits a third page per head: 2 needed, 1 free
  auto st = pool.append(*a, 0, k2, k2, kvtest::iota_positions(72, 32));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Errc::capacity_exceeded);
  EXPECT_NE(st.error().message.find("page pool exhausted"), std::string::npos) << st.error().message;
  EXPECT_EQ(*pool.length(*a), 72);
  EXPECT_EQ(pool.stats().pages_free, 1u);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) kvtest::expect_same_pages(pool, *a, twin.cache(), l, h);
  const auto q = kvtest::normal(twin.qrow(), 5);
  std::vector<float> want(q.size());
  ASSERT_TRUE(twin.cache().attend(0, q, want));
  EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(pool, *a, 0, q), want)) << "the failed append changed nothing";
  // Another sequence fails alike until the first is freed.
  auto b = pool.create_sequence();
  ASSERT_TRUE(b);
  st = pool.append(*b, 0, k2, k2, kvtest::iota_positions(0, 32));  // 24 committed: 2 pages, 1 free
  ASSERT_FALSE(st);
  EXPECT_EQ(*pool.length(*b), 0);
  ASSERT_TRUE(pool.free_sequence(*a));
  ASSERT_TRUE(pool.append(*b, 0, k2, k2, kvtest::iota_positions(0, 32)));
  EXPECT_EQ(pool.stats().pages_free, 7u);
  ASSERT_TRUE(pool.free_sequence(*b));
  EXPECT_EQ(pool.stats().pages_free, 9u);
}

TEST(PoolCreate, BadConfigurationsAreErrors) {
  using Pool = Types<PerToken4>::pool;
  EXPECT_FALSE(Pool::create({.shape = kShape, .byte_budget = 10, .max_sequences = 1}));
  EXPECT_FALSE(Pool::create({.shape = kShape, .byte_budget = 1 << 20, .max_sequences = 0}));
  EXPECT_FALSE(Pool::create({.shape = kShape, .byte_budget = 1 << 20, .max_sequences = 1, .max_rollback_tokens = -1}));
  ModelShape bad = kShape;
  bad.head_dim = 63;
  EXPECT_FALSE(Pool::create({.shape = bad, .byte_budget = 1 << 20, .max_sequences = 1}));
}

// Pool bytes per token at 32k tokens against the analytic size: codes and metadata at the codecs'
// bits per value, nothing else (pages store no positions: the sequence keeps one run per layer,
// counted in exact_bytes: 8 bytes for these consecutive positions).
TEST(PoolMemory, BytesPerTokenMatchAnalyticAt32k) {
  using Pool = PagedCache<Keys<Int4<>>, Values<Int4<>>, Residual<32>>;
  const ModelShape shape{.layers = 1, .q_heads = 8, .kv_heads = 2, .head_dim = 128, .max_tokens = 32768};
  auto pool = Pool::create({.shape = shape, .byte_budget = std::size_t{64} << 20, .max_sequences = 1}).value();
  auto id = pool.create_sequence().value();
  const size_t row = 2 * 128;
  const auto chunk = kvtest::normal(1024 * row, 7);
  for (int t = 0; t < 32768; t += 1024) ASSERT_TRUE(pool.append(id, 0, chunk, chunk, kvtest::iota_positions(t, 1024)));
  const PoolStats s = pool.stats();
  const double per_token = static_cast<double>(s.bytes_used) / 32768.0;
  const double analytic = 2 * 128 * (Pool::key_bits_per_value + Pool::value_bits_per_value) / 8;
  RecordProperty("pool_bytes_per_token", std::to_string(per_token));
  RecordProperty("analytic_bytes_per_token", std::to_string(analytic));
  EXPECT_NEAR(per_token / analytic, 1.0, 0.02) << per_token << " vs " << analytic;
  EXPECT_GE(per_token, analytic * (1 - 32.0 / 32768)) << "fewer bytes than the codes need";
  EXPECT_EQ(s.sequences.size(), 1u);
  EXPECT_EQ(s.sequences[0].tokens, 32768);
  auto runs = pool.block_positions(id, 0);
  ASSERT_TRUE(runs);
  EXPECT_EQ((*runs)->runs().size(), 1u);
  EXPECT_EQ((*runs)->size(), 32768 - 32);  // the residual window's 32 tokens are pending (fp32)
  EXPECT_EQ(pool.memory_bytes(), s.pages_total * s.page_bytes + s.overhead_bytes + s.exact_bytes);
}

// Page layout, which decode speed depends on (not outputs): every page starts on a 64-byte line
// (calloc alone gives 16 for an arena this large), and the pages one append gives a KV head
// follow each other upward in the arena, so attention reads them as one ascending stream.
TEST(PoolMemory, PagesAreLineAlignedAndAscendPerHead) {
  using Pool = PagedCache<Keys<Int4<>>, Values<Int4<>>, Blocks<64>>;
  auto pool = Pool::create({.shape = kShape, .byte_budget = std::size_t{16} << 20, .max_sequences = 1}).value();
  auto id = pool.create_sequence().value();
  const auto chunk = kvtest::normal(512 * 2 * 64, 3);
  ASSERT_TRUE(pool.append(id, 0, chunk, chunk, kvtest::iota_positions(0, 512)));
  for (int h = 0; h < kShape.kv_heads; ++h) {
    const std::vector<PageView> pages = pool.pages(id, 0, h).value();
    ASSERT_EQ(pages.size(), 8u);
    for (std::size_t i = 0; i < pages.size(); ++i) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pages[i].data) % 64, 0u) << "head " << h << " page " << i;
      if (i > 0) {
        EXPECT_EQ(pages[i].page, pages[i - 1].page + 1) << "head " << h << " page " << i;
      }
    }
  }
}

}  // namespace pool_basic_test
