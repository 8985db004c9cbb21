// PagedCache::attend_batch: one decode query per sequence over sequences of lengths 1, 31, 33,
// 95, 200 (GQA), serially and on several threads, bit-identical to attend() of each sequence
// alone; bad batches are errors with `out` untouched. The prefix cache: a sequence that attaches
// published pages decodes bit-identically to one that appended the whole prompt itself;
// import_pages copies full pages in all or nothing (pool exhausted: nothing changes). Pages store
// no positions: only pages whose tokens sit at their indices are published, attached and imported
// tokens take their indices.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "support/pool_twin.hpp"

namespace pool_batch_test {

using namespace kvpack;  // NOLINT: test file

using Pool = PagedCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<16>, Blocks<64>>;
const ModelShape kShape{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};
const std::size_t kRow = 2 * 64, kQRow = 6 * 64;

void feed(Pool& pool, SeqId id, int first, int n, int seed) {
  for (int l = 0; l < kShape.layers; ++l)
    ASSERT_TRUE(pool.append(id, l, kvtest::normal(static_cast<size_t>(n) * kRow, static_cast<std::uint32_t>(seed + l)),
                            kvtest::normal(static_cast<size_t>(n) * kRow, static_cast<std::uint32_t>(seed + 50 + l)),
                            kvtest::iota_positions(first, n)));
}

TEST(PoolBatch, EqualsPerSequenceAttendSeriallyAndOnThreads) {
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 8}).value();
  std::vector<SeqId> seqs;
  int seed = 1;
  for (int len : {1, 31, 33, 95, 200}) {
    seqs.push_back(pool.create_sequence().value());
    if (len > 1) feed(pool, seqs.back(), 0, len - 1, seed += 100);
    feed(pool, seqs.back(), len - 1, 1, seed += 100);  // the decode token
  }
  seqs.push_back(pool.fork(seqs[3]).value());  // a forked sequence (shared pages) in the batch
  feed(pool, seqs.back(), 95, 1, seed += 100);
  const std::size_t N = seqs.size();
  const auto q = kvtest::normal(N * kQRow, 9);
  for (int layer = 0; layer < kShape.layers; ++layer) {
    std::vector<float> want;
    for (std::size_t i = 0; i < N; ++i) {
      const std::vector<float> qi(q.begin() + static_cast<std::ptrdiff_t>(i * kQRow), q.begin() + static_cast<std::ptrdiff_t>((i + 1) * kQRow));
      const auto o = kvtest::pool_attend(pool, seqs[i], layer, qi);
      want.insert(want.end(), o.begin(), o.end());
    }
    for (int workers : {1, 3, 8}) {
      std::vector<Workspace> ws(static_cast<std::size_t>(workers));
      for (const Executor& ex : {Executor{}, serial_executor(), thread_executor(workers)}) {
        std::vector<float> out(q.size(), -1.f);
        auto st = pool.attend_batch(layer, seqs, q, out, ex, ws);
        ASSERT_TRUE(st) << st.error().message;
        EXPECT_TRUE(kvtest::same_bits(out, want)) << "layer " << layer << " workers " << workers;
      }
    }
  }
}

TEST(PoolBatch, BadBatchesAreErrorsAndLeaveOutUntouched) {
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 22, .max_sequences = 4}).value();
  const SeqId a = pool.create_sequence().value(), empty = pool.create_sequence().value();
  feed(pool, a, 0, 33, 1);
  std::vector<Workspace> ws(2);
  auto q = kvtest::normal(2 * kQRow, 3);
  std::vector<float> out(q.size(), 7.f);
  auto check = [&](Status st, Errc code) {
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, code) << st.error().message;
    for (float x : out) ASSERT_EQ(x, 7.f);
  };
  const std::vector<SeqId> with_empty{a, empty};
  check(pool.attend_batch(0, with_empty, q, out, {}, ws), Errc::invalid_argument);  // length 0: nothing to attend
  SeqId freed = pool.create_sequence().value();
  ASSERT_TRUE(pool.free_sequence(freed));
  const std::vector<SeqId> with_freed{a, freed};
  check(pool.attend_batch(0, with_freed, q, out, {}, ws), Errc::invalid_argument);
  const std::vector<SeqId> two_a{a, a};
  check(pool.attend_batch(2, two_a, q, out, {}, ws), Errc::invalid_argument);
  check(pool.attend_batch(0, two_a, std::span<const float>(q).first(kQRow), out, {}, ws), Errc::invalid_argument);
  check(pool.attend_batch(0, two_a, q, out, {}, std::span<Workspace>{}), Errc::invalid_argument);
  q[kQRow + 5] = std::nanf("");
  check(pool.attend_batch(0, two_a, q, out, {}, ws), Errc::non_finite);
}

TEST(PoolPrefix, AttachedPagesDecodeAsTheWholePromptWould) {
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 4}).value();
  std::vector<std::int32_t> prompt(300);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>(i * 7 % 1000);
  // K/V of token t depend only on t (the same prefix gives the same K/V).
  auto kv = [](int first, int n, int which, int layer) {
    std::vector<float> x;
    for (int t = first; t < first + n; ++t) {
      const auto r = kvtest::normal(kRow, static_cast<std::uint32_t>(t * 8 + which * 2 + layer));
      x.insert(x.end(), r.begin(), r.end());
    }
    return x;
  };
  auto feed_tokens = [&](SeqId id, int first, int n) {
    for (int l = 0; l < kShape.layers; ++l)
      ASSERT_TRUE(pool.append(id, l, kv(first, n, 0, l), kv(first, n, 1, l), kvtest::iota_positions(first, n)));
  };
  const SeqId pub = pool.create_sequence().value();
  feed_tokens(pub, 0, 250);  // 234 committed: 3 full pages
  auto published = pool.publish_prefix(pub, "smollm2-135m", std::span<const std::int32_t>(prompt).first(250));
  ASSERT_TRUE(published);
  EXPECT_EQ(*published, 3);
  EXPECT_EQ(*pool.publish_prefix(pub, "smollm2-135m", std::span<const std::int32_t>(prompt).first(250)), 0);
  const std::size_t used_after_publish = pool.stats().pages_used;
  ASSERT_TRUE(pool.free_sequence(pub));
  EXPECT_EQ(pool.stats().pages_used, 3u * 2 * 2) << "the prefix cache keeps its pages";

  const SeqId hit = pool.create_sequence().value(), solo = pool.create_sequence().value();
  auto miss = pool.attach_prefix(hit, "another-model", prompt);
  ASSERT_TRUE(miss);
  EXPECT_EQ(*miss, 0);
  auto got = pool.attach_prefix(hit, "smollm2-135m", prompt);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, 192);
  EXPECT_EQ(pool.stats().pages_used, 3u * 2 * 2) << "attaching copies no page";
  EXPECT_LT(pool.stats().pages_used, used_after_publish);
  feed_tokens(hit, 192, 108);
  feed_tokens(solo, 0, 192);
  feed_tokens(solo, 192, 108);
  kvtest::expect_same_pages(pool, hit, pool, solo);
  for (int t = 300; t < 310; ++t) {
    feed_tokens(hit, t, 1);
    feed_tokens(solo, t, 1);
    const auto q = kvtest::normal(kQRow, static_cast<std::uint32_t>(t));
    for (int l = 0; l < kShape.layers; ++l)
      ASSERT_TRUE(kvtest::same_bits(kvtest::pool_attend(pool, hit, l, q), kvtest::pool_attend(pool, solo, l, q))) << t;
  }
  // A different prompt matches only its common prefix; a short prompt attaches nothing it would not commit.
  std::vector<std::int32_t> other = prompt;
  other[70] += 1;
  const SeqId partial = pool.create_sequence().value();
  EXPECT_EQ(*pool.attach_prefix(partial, "smollm2-135m", other), 64);
  EXPECT_FALSE(pool.attach_prefix(partial, "smollm2-135m", other)) << "not empty any more";
  ASSERT_TRUE(pool.free_sequence(partial));
  const SeqId shortp = pool.create_sequence().value();
  EXPECT_EQ(*pool.attach_prefix(shortp, "smollm2-135m", std::span<const std::int32_t>(prompt).first(140)), 64)
      << "140 tokens commit 96 (residual 16, groups of 32): one full page";
  pool.clear_prefix_cache();
  EXPECT_EQ(pool.stats().prefix_entries, 0u);
}

TEST(PoolPrefix, ImportPagesCopiesFullPagesAllOrNothing) {
  // Pool A's full pages, copied out as payloads [page][layer][kv_head], imported into pool B
  // (PagedCache::import_pages: the remote tier's import side) give B's sequence A's pages.
  auto a = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 2}).value();
  const SeqId src = a.create_sequence().value();
  feed(a, src, 0, 250, 7);  // 234 committed: 3 full pages
  const std::size_t bytes = a.block_layout().bytes;
  std::vector<std::byte> payloads;
  for (std::size_t p = 0; p < 3; ++p)
    for (int l = 0; l < kShape.layers; ++l)
      for (int h = 0; h < kShape.kv_heads; ++h) {
        const auto v = a.pages(src, l, h).value()[p];
        payloads.insert(payloads.end(), v.data, v.data + bytes);
      }
  const std::size_t page = PagePool::stride_for(bytes);
  auto b = Pool::create({.shape = kShape, .byte_budget = 11 * page, .max_sequences = 2}).value();
  const SeqId id = b.create_sequence().value();
  const std::size_t free0 = b.stats().pages_free;
  auto bad = b.import_pages(id, std::span<const std::byte>(payloads).first(payloads.size() - 1));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  auto full = b.import_pages(id, payloads);  // 12 pages needed, 11 in the pool
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, Errc::capacity_exceeded);
  EXPECT_NE(full.error().message.find("12 pages needed, 11 free"), std::string::npos) << full.error().message;
  EXPECT_EQ(b.length(id).value(), 0);
  EXPECT_EQ(b.stats().pages_free, free0);
  const auto two = std::span<const std::byte>(payloads).first(payloads.size() / 3 * 2);
  ASSERT_EQ(b.import_pages(id, two).value(), 128);
  EXPECT_EQ(b.stats().pages_free, free0 - 8);
  for (int l = 0; l < kShape.layers; ++l)
    for (int h = 0; h < kShape.kv_heads; ++h) {
      const auto pa = a.pages(src, l, h).value(), pb = b.pages(id, l, h).value();
      ASSERT_EQ(pb.size(), 2u);
      for (std::size_t p = 0; p < 2; ++p) {
        EXPECT_EQ(pb[p].header.count, 64);
        EXPECT_EQ(pb[p].header.flags, pa[p].header.flags);
        EXPECT_EQ(std::memcmp(pb[p].data, pa[p].data, bytes), 0) << l << "/" << h << "/" << p;
      }
    }
  // The rest of a 150-token prompt (commits 128 + 0: the imported pages are all it commits).
  for (int l = 0; l < kShape.layers; ++l)
    ASSERT_TRUE(b.append(id, l, kvtest::normal(22 * kRow, static_cast<std::uint32_t>(7 + l)),
                         kvtest::normal(22 * kRow, static_cast<std::uint32_t>(57 + l)), kvtest::iota_positions(128, 22)));
  auto again = b.import_pages(id, two);
  ASSERT_FALSE(again) << "holds pending tokens now";
  EXPECT_EQ(again.error().code, Errc::invalid_argument);
  EXPECT_EQ(b.length(id).value(), 150);
  for (int l = 0; l < kShape.layers; ++l) {  // imported tokens at their indices, then the appended ones
    const PositionRuns& runs = *b.block_positions(id, l).value();
    ASSERT_EQ(runs.size(), 128);
    EXPECT_EQ(runs.runs().size(), 1u);
    EXPECT_EQ(runs.at(127), 127);
  }
}

TEST(PoolPrefix, OnlyPagesAtTheirIndicesArePublished) {
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 24, .max_sequences = 4}).value();
  std::vector<std::int32_t> prompt(250);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>(i * 3 % 500);
  auto append = [&](SeqId id, std::vector<std::int32_t> pos) {
    const auto n = pos.size();
    for (int l = 0; l < kShape.layers; ++l)
      ASSERT_TRUE(pool.append(id, l, kvtest::normal(n * kRow, static_cast<std::uint32_t>(l)),
                              kvtest::normal(n * kRow, static_cast<std::uint32_t>(9 + l)), pos));
  };
  const SeqId shifted = pool.create_sequence().value();
  append(shifted, kvtest::iota_positions(1000, 250));  // 3 full pages, none at its indices
  EXPECT_EQ(pool.publish_prefix(shifted, "m", prompt).value(), 0);
  const SeqId jump = pool.create_sequence().value();
  auto pos = kvtest::iota_positions(0, 250);
  for (std::size_t i = 100; i < pos.size(); ++i) pos[i] += 400;  // tokens 0..99 at their indices
  append(jump, pos);
  EXPECT_EQ(pool.publish_prefix(jump, "m", prompt).value(), 1) << "page 0 (tokens 0..63) only";
  const SeqId hit = pool.create_sequence().value();
  EXPECT_EQ(pool.attach_prefix(hit, "m", prompt).value(), 64);
  const auto c = pool.read_back(hit, 1, 1).value();
  ASSERT_EQ(c.positions.size(), 64u);
  for (std::size_t i = 0; i < 64; ++i) EXPECT_EQ(c.positions[i], static_cast<std::int32_t>(i));
}

}  // namespace pool_batch_test
