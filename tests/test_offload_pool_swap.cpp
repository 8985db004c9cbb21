// Swapping pool sequences out to an encrypted file tier (offload/pool_swap_target.hpp): the pages
// leave process memory as sealed records (no page's bytes appear in the file in the clear), come
// back bit-identical to a sequence never swapped, and a tampered record is Errc::auth_failed at
// swap_in with the sequence still swapped out and recoverable once the record is intact. A store
// without a lower tier refuses the swap with nothing changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "kvpack/offload.hpp"
#include "support/offload_store_fixtures.hpp"
#include "support/pool_twin.hpp"

namespace offload_pool_swap_test {

using namespace kvpack;           // NOLINT: test file
using namespace kvpack::offload;  // NOLINT: test file
namespace kot = kvpack::offload::testing;

using Pool = PagedCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<>>, Residual<8>, Blocks<32>>;
const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 1024};

Pool make_pool() {
  return Pool::create({.shape = kShape, .byte_budget = 1 << 20, .max_sequences = 4, .max_rollback_tokens = 4}).value();
}

void feed(Pool& pool, SeqId id, int n, int seed) {
  const std::size_t row = static_cast<std::size_t>(kShape.kv_heads) * kShape.head_dim;
  const std::int64_t at = pool.length(id).value();
  for (int l = 0; l < kShape.layers; ++l) {
    auto st = pool.append(id, l, kvtest::normal(static_cast<std::size_t>(n) * row, seed * 3 + l),
                          kvtest::normal(static_cast<std::size_t>(n) * row, seed * 3 + l + 500), kvtest::iota_positions(at, n));
    ASSERT_TRUE(st) << st.error().message;
  }
}

void expect_same(const Pool& a, SeqId ia, const Pool& b, SeqId ib) {
  kvtest::expect_same_pages(a, ia, b, ib);
  const auto q = kvtest::normal(static_cast<std::size_t>(kShape.q_heads) * kShape.head_dim, 77);
  for (int l = 0; l < kShape.layers; ++l)
    EXPECT_TRUE(kvtest::same_bits(kvtest::pool_attend(a, ia, l, q), kvtest::pool_attend(b, ib, l, q))) << "layer " << l;
}

/// An encrypted file tier that keeps its file (for reading and tampering), no background thread.
struct SwapFile {
  kot::TempDir dir;
  StaticKeyProvider keys = StaticKeyProvider::create(std::vector<std::byte>(32, std::byte{9})).value();
  std::unique_ptr<OffloadStore> store;
  explicit SwapFile(const Pool& pool) {
    StoreConfig c;
    c.layout = swap_layout_for(pool);
    c.resident_budget_bytes = 0;
    c.background = false;
    c.file = FileTier{.directory = dir.path(), .keep_file = true};
    store = OffloadStore::create(c, &keys).value();
  }
  std::string path() { return dynamic_cast<FileRecordTier&>(*store->tier(0)).path(); }
  uint64_t offset(const SwapPageKey& k) {
    const auto loc = store->location(StoreSwapTarget::block_key(k));
    EXPECT_TRUE(loc && !loc->resident) << "no record of " << describe(k) << " in the file";
    return loc ? dynamic_cast<FileRecordTier&>(*store->tier(0)).slot_offset(loc->slot) : 0;
  }
};

TEST(OffloadPoolSwap, PagesLeaveSealedAndComeBackBitIdentical) {
  Pool pool = make_pool(), twin = make_pool();
  SwapFile file(pool);
  StoreSwapTarget target(*file.store);
  const SeqId id = pool.create_sequence().value(), tid = twin.create_sequence().value();
  feed(pool, id, 95, 1);
  feed(twin, tid, 95, 1);
  const auto views = pool.pages(id, 1, 1).value();
  const std::vector<std::byte> plain(views.back().data, views.back().data + 64);  // one page's first codes
  const std::size_t held = pool.stats().pages_used;
  auto out = pool.swap_out(id, target);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(*out, held);
  EXPECT_EQ(pool.stats().pages_used, 0u);
  const Metrics m = file.store->metrics();
  EXPECT_EQ(m.offloads, held);
  EXPECT_EQ(m.resident_blocks, 0u) << "write-through: no page stays in memory";
  EXPECT_GT(m.file_tier_bytes, held * pool.block_layout().bytes);
  const auto bytes = kot::read_at(file.path(), 0, static_cast<std::size_t>(std::filesystem::file_size(file.path())));
  EXPECT_EQ(std::search(bytes.begin(), bytes.end(), plain.begin(), plain.end()), bytes.end()) << "page bytes in the clear";
  ASSERT_TRUE(pool.swap_in(id));
  EXPECT_EQ(file.store->metrics().fetches, held);
  expect_same(pool, id, twin, tid);
  feed(pool, id, 20, 2);
  feed(twin, tid, 20, 2);
  ASSERT_TRUE(pool.truncate(id, 112));  // rollback after a round trip
  ASSERT_TRUE(twin.truncate(tid, 112));
  expect_same(pool, id, twin, tid);
}

TEST(OffloadPoolSwap, ATamperedRecordFailsAuthenticationAndNothingIsLost) {
  Pool pool = make_pool(), twin = make_pool();
  SwapFile file(pool);
  StoreSwapTarget target(*file.store);
  const SeqId id = pool.create_sequence().value(), tid = twin.create_sequence().value();
  feed(pool, id, 70, 3);
  feed(twin, tid, 70, 3);
  ASSERT_TRUE(pool.swap_out(id, target));
  const SwapPageKey victim{id, 1, 0, 0};  // 70 tokens - Residual<8>: one 32-token key group committed, page 0
  const uint64_t at = file.offset(victim) + 100;  // inside the sealed payload
  const auto orig = kot::read_at(file.path(), at, 1);
  kot::write_at(file.path(), at, std::vector<std::byte>{orig[0] ^ std::byte{0x20}});
  const std::size_t free_before = pool.stats().pages_free;
  auto in = pool.swap_in(id);
  ASSERT_FALSE(in);
  EXPECT_EQ(in.error().code, Errc::auth_failed) << in.error().message;
  EXPECT_TRUE(pool.swapped_out(id).value());
  EXPECT_EQ(pool.stats().pages_free, free_before) << "pages taken for the swap-in are freed again";
  kot::write_at(file.path(), at, orig);  // the intact record verifies again
  auto again = pool.swap_in(id);
  ASSERT_TRUE(again) << again.error().message;
  expect_same(pool, id, twin, tid);
}

TEST(OffloadPoolSwap, AStoreWithoutALowerTierRefusesAndChangesNothing) {
  Pool pool = make_pool(), twin = make_pool();
  StoreConfig c;
  c.layout = swap_layout_for(pool);
  c.background = false;
  auto store = OffloadStore::create(c).value();  // hot tier only: offload() has nowhere to go
  StoreSwapTarget target(*store);
  const SeqId id = pool.create_sequence().value(), tid = twin.create_sequence().value();
  feed(pool, id, 40, 5);
  feed(twin, tid, 40, 5);
  const std::size_t held = pool.stats().pages_used;
  auto out = pool.swap_out(id, target);
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, Errc::capacity_exceeded) << out.error().message;
  EXPECT_EQ(pool.stats().pages_used, held);
  EXPECT_EQ(store->metrics().resident_blocks, 0u) << "the first page's record was erased";
  EXPECT_FALSE(pool.swapped_out(id).value());
  expect_same(pool, id, twin, tid);
}

}  // namespace offload_pool_swap_test
