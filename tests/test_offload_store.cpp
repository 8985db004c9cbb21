// OffloadStore without a background thread (deterministic): placement, and CASES C11 through the
// host and file tiers. Tampering with stored records and I/O fault injection:
// test_offload_store_file.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvpack/offload.hpp"
#include "support/offload_store_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::bytes_of;
using ko::testing::kC11KvHeads;
using ko::testing::kC11PayloadBytes;
using ko::testing::payload_for;
using ko::testing::sync_config;
using ko::testing::TempDir;

namespace test_offload_store {  // own scope: compiled in one unity file with other tests
namespace {
constexpr uint64_t kBlock = kC11PayloadBytes;
}  // namespace

// ---- placement ---------------------------------------------------------------------------------

TEST(OffloadStore, InMemoryStoreKeepsEverythingResident) {
  auto store = ko::OffloadStore::create(sync_config(1)).value();
  EXPECT_EQ(store->tier_count(), 0u);
  for (int b = 0; b < 4; ++b) ASSERT_TRUE(store->put({0, 0, b}, 64, payload_for({0, 0, b})));
  EXPECT_EQ(store->metrics().resident_blocks, 4u);  // over budget, nowhere to go: soft limit
  EXPECT_EQ(store->offload({0, 0, 0}).error().code, Errc::capacity_exceeded);
  EXPECT_TRUE(store->rebalance());  // nothing can move; not an error
  auto h = store->acquire({0, 0, 2});
  ASSERT_TRUE(h);
  EXPECT_EQ(bytes_of(*h), payload_for({0, 0, 2}));
}

TEST(OffloadStore, BudgetEvictsOldestBlocksFirst) {
  auto c = sync_config(3);
  c.host = ko::HostTier{};
  auto store = ko::OffloadStore::create(c).value();
  for (int b = 0; b < 8; ++b) ASSERT_TRUE(store->put({0, 0, b}, 64, payload_for({0, 0, b})));
  const auto m = store->metrics();
  EXPECT_EQ(m.resident_bytes, 3 * kBlock);
  EXPECT_EQ(m.offloaded_blocks, 5u);
  EXPECT_EQ(m.offloads, 5u);
  EXPECT_EQ(m.bytes_written, 5 * ko::record_bytes(kBlock));
  EXPECT_EQ(m.host_tier_bytes, 5 * ko::record_bytes(kBlock));
  for (int b = 0; b < 8; ++b) EXPECT_EQ(store->is_resident({0, 0, b}), b >= 5) << b;
  for (int b = 0; b < 8; ++b) {
    auto h = store->acquire({0, 0, b});
    ASSERT_TRUE(h) << h.error().message;
    EXPECT_EQ(bytes_of(*h), payload_for({0, 0, b})) << b;
    EXPECT_EQ(h->token_count(), 64);
  }
  // Acquiring old blocks 0..4 displaces the newest (5 comes back once more): 6 fetches.
  EXPECT_EQ(store->metrics().fetches, 6u);
  EXPECT_LE(store->metrics().resident_bytes, 3 * kBlock);
  EXPECT_GT(store->metrics().fetch_p50_us, 0.0);
  EXPECT_GE(store->metrics().fetch_p99_us, store->metrics().fetch_p50_us);
}

TEST(OffloadStore, LeastRecentlyUsedOrder) {
  auto c = sync_config(2);
  c.host = ko::HostTier{};
  c.order = ko::EvictionOrder::least_recently_used;
  auto store = ko::OffloadStore::create(c).value();
  ASSERT_TRUE(store->put({0, 0, 0}, 64, payload_for({0, 0, 0})));
  ASSERT_TRUE(store->put({0, 0, 1}, 64, payload_for({0, 0, 1})));
  ASSERT_TRUE(store->acquire({0, 0, 0}));  // 0 is now more recent than 1
  ASSERT_TRUE(store->put({0, 0, 2}, 64, payload_for({0, 0, 2})));
  EXPECT_TRUE(store->is_resident({0, 0, 0}));
  EXPECT_FALSE(store->is_resident({0, 0, 1}));
  EXPECT_TRUE(store->is_resident({0, 0, 2}));
}

TEST(OffloadStore, PinnedLayersProtectedLayersAndHandlesStayResident) {
  auto c = sync_config(2);
  c.host = ko::HostTier{};
  auto store = ko::OffloadStore::create(c).value();
  store->pin_layer(0, true);
  for (int b = 0; b < 3; ++b) ASSERT_TRUE(store->put({0, 0, b}, 64, payload_for({0, 0, b})));
  for (int b = 0; b < 3; ++b) EXPECT_TRUE(store->is_resident({0, 0, b}));  // over budget, pinned
  ASSERT_TRUE(store->put({1, 0, 0}, 64, payload_for({1, 0, 0})));
  EXPECT_FALSE(store->is_resident({1, 0, 0}));  // the only evictable block
  store->pin_layer(0, false);                   // unpinning rebalances
  EXPECT_EQ(store->metrics().resident_bytes, 2 * kBlock);

  // A live handle keeps its block resident; the prefetch window protects its layers.
  {
    auto h = store->acquire({0, 0, 0}).value();
    ASSERT_TRUE(store->acquire({1, 0, 0}));  // resident now: {0,0,0} (in use) and {1,0,0}
    store->prefetch({1, 1});
    ASSERT_TRUE(store->put({2, 0, 5}, 64, payload_for({2, 0, 5})));
    ASSERT_TRUE(store->put({2, 0, 6}, 64, payload_for({2, 0, 6})));
    EXPECT_TRUE(store->is_resident({0, 0, 0}));
    EXPECT_TRUE(store->is_resident({1, 0, 0}));
    EXPECT_FALSE(store->is_resident({2, 0, 5}));
    EXPECT_FALSE(store->is_resident({2, 0, 6}));
    EXPECT_EQ(bytes_of(h), payload_for({0, 0, 0}));
  }
  store->prefetch({});  // no protection, no handle: {0,0,0} (least recently used of index 0) goes next
  ASSERT_TRUE(store->put({3, 0, 7}, 64, payload_for({3, 0, 7})));
  EXPECT_FALSE(store->is_resident({0, 0, 0}));
  EXPECT_TRUE(store->is_resident({1, 0, 0}));
  EXPECT_EQ(store->metrics().resident_bytes, 2 * kBlock);
}

TEST(OffloadStore, HandleOutlivesReplaceEraseAndStore) {
  auto c = sync_config(10);
  c.host = ko::HostTier{};
  auto store = ko::OffloadStore::create(c).value();
  ASSERT_TRUE(store->put({0, 1, 2}, 64, payload_for({0, 1, 2}, 0)));
  auto h = store->acquire({0, 1, 2}).value();
  const auto v1 = h.version();
  ASSERT_TRUE(store->put({0, 1, 2}, 32, payload_for({0, 1, 2}, 1)));
  auto h2 = store->acquire({0, 1, 2}).value();
  EXPECT_GT(h2.version(), v1);
  EXPECT_EQ(h2.token_count(), 32);
  EXPECT_EQ(bytes_of(h2), payload_for({0, 1, 2}, 1));
  EXPECT_EQ(bytes_of(h), payload_for({0, 1, 2}, 0));  // the old view is intact
  ASSERT_TRUE(store->erase({0, 1, 2}));
  EXPECT_EQ(store->acquire({0, 1, 2}).error().code, Errc::not_present);
  EXPECT_EQ(store->erase({0, 1, 2}).error().code, Errc::not_present);
  store.reset();
  EXPECT_EQ(bytes_of(h2), payload_for({0, 1, 2}, 1));
}

TEST(OffloadStore, PutValidatesArguments) {
  auto store = ko::OffloadStore::create(sync_config(1)).value();
  const auto p = payload_for({0, 0, 0});
  EXPECT_EQ(store->put({-1, 0, 0}, 64, p).error().code, Errc::invalid_argument);
  EXPECT_EQ(store->put({0, 0, 0}, 65, p).error().code, Errc::invalid_argument);
  std::vector<std::byte> big(kC11PayloadBytes + 1);
  auto s = store->put({3, 1, 4}, 64, big);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("block (layer 3, kv_head 1, block 4)"), std::string::npos);
  EXPECT_EQ(store->acquire({9, 9, 9}).error().code, Errc::not_present);
  EXPECT_EQ(store->try_acquire({9, 9, 9}).error().code, Errc::not_present);
}

TEST(OffloadStore, CreateValidatesConfiguration) {
  auto c = sync_config(1);
  c.layout.head_dim = 0;
  EXPECT_EQ(ko::OffloadStore::create(c).error().code, Errc::invalid_argument);
  c = sync_config(1);
  c.aead = ko::Aead::none;
  EXPECT_EQ(ko::OffloadStore::create(c).error().code, Errc::invalid_argument);
  c = sync_config(1);
  c.file = ko::FileTier{.keep_file = true};
  EXPECT_EQ(ko::OffloadStore::create(c).error().code, Errc::invalid_argument);  // no KeyProvider
  ::unsetenv("KVPACK_OFFLOAD_KEY");
  ko::EnvKeyProvider env;
  EXPECT_EQ(ko::OffloadStore::create(sync_config(1), &env).error().code, Errc::invalid_argument);
}

TEST(OffloadStore, DataKeyIsWrappedByTheProvidersKey) {
  const std::string hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
  ASSERT_EQ(::setenv("KVPACK_OFFLOAD_KEY", hex.c_str(), 1), 0);
  ko::EnvKeyProvider env;
  auto c = sync_config(1);
  c.host = ko::HostTier{};
  auto a = ko::OffloadStore::create(c, &env).value();
  auto b = ko::OffloadStore::create(c, &env).value();
  ::unsetenv("KVPACK_OFFLOAD_KEY");
  ASSERT_TRUE(a->wrapped_data_key());
  EXPECT_NE(a->cache_id(), b->cache_id());
  EXPECT_NE(*a->wrapped_data_key(), *b->wrapped_data_key());
  std::vector<std::byte> kek_bytes(32);
  for (int i = 0; i < 32; ++i) kek_bytes[static_cast<std::size_t>(i)] = static_cast<std::byte>(i);
  auto kek = ko::SecretBytes::copy_of(kek_bytes).value();
  EXPECT_TRUE(ko::unwrap_data_key(kek, *a->wrapped_data_key(), a->cache_id()));
  EXPECT_EQ(ko::unwrap_data_key(kek, *a->wrapped_data_key(), b->cache_id()).error().code, Errc::auth_failed);
}

// ---- C11 through the tiers ---------------------------------------------------------------------

struct TierSetup {
  const char* name;
  bool host, host_encrypt, file;
  uint64_t host_capacity_records;
};

class OffloadC11 : public ::testing::TestWithParam<TierSetup> {};

// 64 tokens x 8 KV heads x head_dim 128, INT4: 8 blocks of layer 0 (and 8 of layer 1) go down
// and come back bit-identical.
TEST_P(OffloadC11, RoundTripIsBitIdentical) {
  TempDir dir;
  const auto& p = GetParam();
  auto c = sync_config(0);
  if (p.host) c.host = ko::HostTier{.capacity_bytes = p.host_capacity_records * ko::record_bytes(kBlock), .encrypt = p.host_encrypt};
  if (p.file) c.file = ko::FileTier{.directory = dir.path()};
  auto store = ko::OffloadStore::create(c).value();
  for (int layer = 0; layer < 2; ++layer)
    for (int h = 0; h < kC11KvHeads; ++h) ASSERT_TRUE(store->put({layer, h, 0}, 64, payload_for({layer, h, 0})));
  auto m = store->metrics();
  EXPECT_EQ(m.resident_blocks, 0u);
  EXPECT_EQ(m.offloaded_blocks, 16u);
  EXPECT_EQ(m.offload_failures, 0u);
  if (p.host && p.file) {
    EXPECT_EQ(m.host_tier_bytes, p.host_capacity_records * ko::record_bytes(kBlock));
    EXPECT_EQ(m.file_tier_bytes, (16 - p.host_capacity_records) * 12288);  // 10568-byte records in 12 KiB slots
  }
  EXPECT_EQ(dir.entries(), 0u);  // the file, if any, is unlinked
  for (int layer = 0; layer < 2; ++layer)
    for (int h = 0; h < kC11KvHeads; ++h) {
      auto got = store->acquire({layer, h, 0});
      ASSERT_TRUE(got) << got.error().message;
      EXPECT_EQ(bytes_of(*got), payload_for({layer, h, 0}));
    }
  EXPECT_EQ(store->metrics().fetches, 16u);
  EXPECT_EQ(store->metrics().bytes_read, 16 * ko::record_bytes(kBlock));
}

// One flipped ciphertext byte in whatever tier holds the record: authentication error naming
// the block, no data, the block is not resident; the record is kept so a repaired record
// reads again.
// (File tier: the OffloadStoreFile tests below.)
TEST(OffloadStoreHost, FlippedStoredByteIsAnAuthError) {
  for (const bool encrypt : {true, false}) {
    SCOPED_TRACE(encrypt ? "encrypted host tier" : "authenticated-only host tier");
    auto c = sync_config(0);
    c.host = ko::HostTier{.encrypt = encrypt};
    auto store = ko::OffloadStore::create(c).value();
    const ko::BlockKey k{4, 6, 9};
    ASSERT_TRUE(store->put(k, 64, payload_for(k)));
    auto& host = dynamic_cast<ko::HostRecordTier&>(*store->tier(0));
    auto raw = host.raw_slot_for_testing(store->location(k)->slot);
    ASSERT_EQ(raw.size(), ko::record_bytes(kBlock));
    const auto body = raw.subspan(56, kBlock);
    const auto plain = payload_for(k);
    EXPECT_EQ(std::equal(body.begin(), body.end(), plain.begin()), !encrypt);  // clear only if asked
    raw[56 + 1234] ^= std::byte{0x80};
    auto got = store->acquire(k);
    ASSERT_FALSE(got);
    EXPECT_EQ(got.error().code, Errc::auth_failed);
    EXPECT_NE(got.error().message.find("block (layer 4, kv_head 6, block 9)"), std::string::npos)
        << got.error().message;
    EXPECT_FALSE(store->is_resident(k));
    EXPECT_EQ(store->try_acquire(k).error().code, Errc::not_present);
    EXPECT_EQ(store->metrics().fetch_failures, 1u);
    raw[56 + 1234] ^= std::byte{0x80};
    auto again = store->acquire(k);
    ASSERT_TRUE(again);
    EXPECT_EQ(bytes_of(*again), plain);
  }
}

void PrintTo(const TierSetup& t, std::ostream* os) { *os << t.name; }

INSTANTIATE_TEST_SUITE_P(Tiers, OffloadC11,
                         ::testing::Values(TierSetup{"HostEncrypted", true, true, false, 100},
                                           TierSetup{"HostMacOnly", true, false, false, 100},
                                           TierSetup{"File", false, true, true, 0},
                                           TierSetup{"HostThenFile", true, true, true, 5}),
                         [](const ::testing::TestParamInfo<TierSetup>& i) { return std::string(i.param.name); });

}  // namespace test_offload_store
