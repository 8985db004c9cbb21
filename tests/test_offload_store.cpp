// OffloadStore without a background thread (deterministic): placement, C11 through the
// host and file tiers, tampering with stored records, and fault injection at every I/O call.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kvpack/offload.hpp"
#include "support/offload_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::c11_layout;
using ko::testing::kC11KvHeads;
using ko::testing::kC11PayloadBytes;
using ko::testing::random_payload;
using ko::testing::TempDir;

namespace test_offload_store {  // own scope: compiled in one unity file with other tests
namespace {

constexpr uint64_t kBlock = kC11PayloadBytes;

ko::StoreConfig sync_config(uint64_t budget_blocks) {
  ko::StoreConfig c;
  c.layout = c11_layout();
  c.resident_budget_bytes = budget_blocks * kBlock;
  c.background = false;
  return c;
}

std::vector<std::byte> payload_for(const ko::BlockKey& k, int generation = 0) {
  return random_payload(kC11PayloadBytes, static_cast<uint64_t>(k.layer * 100000 + k.kv_head * 1000 + k.block_index) * 31 +
                                              static_cast<uint64_t>(generation));
}

std::vector<std::byte> bytes_of(const ko::BlockHandle& h) { return {h.bytes().begin(), h.bytes().end()}; }

// Reads / writes raw bytes of the (kept) offload file.
std::vector<std::byte> read_at(const std::string& path, uint64_t off, std::size_t n) {
  std::vector<std::byte> b(n);
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_EQ(::pread(fd, b.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n));
  ::close(fd);
  return b;
}
void write_at(const std::string& path, uint64_t off, std::span<const std::byte> b) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  EXPECT_EQ(::pwrite(fd, b.data(), b.size(), static_cast<off_t>(off)), static_cast<ssize_t>(b.size()));
  ::close(fd);
}

struct KeptFileStore {
  TempDir dir;
  ko::StaticKeyProvider keys = ko::StaticKeyProvider::create(std::vector<std::byte>(32, std::byte{7})).value();
  std::unique_ptr<ko::OffloadStore> store;
  explicit KeptFileStore(uint64_t budget_blocks = 0) {
    auto c = sync_config(budget_blocks);
    c.file = ko::FileTier{.directory = dir.path(), .keep_file = true};
    store = ko::OffloadStore::create(c, &keys).value();
  }
  ko::FileRecordTier& file() { return dynamic_cast<ko::FileRecordTier&>(*store->tier(0)); }
  uint64_t offset(const ko::BlockKey& k) { return file().slot_offset(store->location(k)->slot); }
  std::size_t size(const ko::BlockKey& k) { return store->location(k)->record_bytes; }
};

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

// ---- tampering with the file -------------------------------------------------------------------

TEST(OffloadStoreFile, EveryBitFlipOfAStoredBlockIsRejected) {
  KeptFileStore s;
  const ko::BlockKey k{1, 2, 3};
  ASSERT_TRUE(s.store->put(k, 64, payload_for(k)));
  const std::string path = s.file().path();
  const uint64_t off = s.offset(k);
  const std::size_t n = s.size(k);
  auto rec = read_at(path, off, n);
  const int fd = ::open(path.c_str(), O_RDWR);
  for (std::size_t bit = 0; bit < n * 8; ++bit) {
    std::byte b = rec[bit / 8] ^ static_cast<std::byte>(1u << (bit % 8));
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(off + bit / 8)), 1);
    auto got = s.store->acquire(k);
    ASSERT_FALSE(got) << "bit " << bit << " accepted";
    ASSERT_TRUE(got.error().code == Errc::auth_failed || got.error().code == Errc::corrupt_data) << "bit " << bit;
    ASSERT_EQ(::pwrite(fd, &rec[bit / 8], 1, static_cast<off_t>(off + bit / 8)), 1);
  }
  ::close(fd);
  EXPECT_EQ(s.store->metrics().fetch_failures, n * 8);
  auto got = s.store->acquire(k);
  ASSERT_TRUE(got);
  EXPECT_EQ(bytes_of(*got), payload_for(k));
}

TEST(OffloadStoreFile, TruncatedFileIsAnError) {
  KeptFileStore s;
  const ko::BlockKey a{0, 0, 0}, b{0, 0, 1};
  ASSERT_TRUE(s.store->put(a, 64, payload_for(a)));
  ASSERT_TRUE(s.store->put(b, 64, payload_for(b)));
  const uint64_t end = s.offset(b) + s.size(b);
  ASSERT_EQ(::truncate(s.file().path().c_str(), static_cast<off_t>(end - 1)), 0);
  auto got = s.store->acquire(b);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, Errc::io_error);
  EXPECT_NE(got.error().message.find("block (layer 0, kv_head 0, block 1)"), std::string::npos);
  EXPECT_NE(got.error().message.find("truncated"), std::string::npos) << got.error().message;
  auto ok = s.store->acquire(a);
  ASSERT_TRUE(ok);
  EXPECT_EQ(bytes_of(*ok), payload_for(a));
}

TEST(OffloadStoreFile, SwappedRecordsAreRejected) {
  KeptFileStore s;
  const ko::BlockKey a{0, 0, 0}, b{0, 1, 0};  // same block index, other head
  ASSERT_TRUE(s.store->put(a, 64, payload_for(a)));
  ASSERT_TRUE(s.store->put(b, 64, payload_for(b)));
  const std::string path = s.file().path();
  const auto ra = read_at(path, s.offset(a), s.size(a)), rb = read_at(path, s.offset(b), s.size(b));
  write_at(path, s.offset(a), rb);
  write_at(path, s.offset(b), ra);
  EXPECT_EQ(s.store->acquire(a).error().code, Errc::auth_failed);
  EXPECT_EQ(s.store->acquire(b).error().code, Errc::auth_failed);
  write_at(path, s.offset(a), ra);
  write_at(path, s.offset(b), rb);
  EXPECT_TRUE(s.store->acquire(a));
  EXPECT_TRUE(s.store->acquire(b));
}

TEST(OffloadStoreFile, ReplayedOldVersionIsRejected) {
  KeptFileStore s;
  const ko::BlockKey a{2, 0, 5};
  ASSERT_TRUE(s.store->put(a, 64, payload_for(a, 0)));
  const std::string path = s.file().path();
  const auto old_record = read_at(path, s.offset(a), s.size(a));
  ASSERT_TRUE(s.store->put(a, 64, payload_for(a, 1)));  // new version, written again
  ASSERT_FALSE(s.store->is_resident(a));
  write_at(path, s.offset(a), old_record);
  auto got = s.store->acquire(a);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, Errc::auth_failed);

  // Versions never repeat, also after erase(): same content put again is still a new version.
  ASSERT_TRUE(s.store->erase(a));
  ASSERT_TRUE(s.store->put(a, 64, payload_for(a, 0)));
  write_at(path, s.offset(a), old_record);
  EXPECT_EQ(s.store->acquire(a).error().code, Errc::auth_failed);
}

TEST(OffloadStoreFile, RecordFromAnotherCacheIsRejected) {
  KeptFileStore s1, s2;  // same KEK, different cache ids and data keys
  const ko::BlockKey a{0, 3, 1};
  ASSERT_TRUE(s1.store->put(a, 64, payload_for(a, 0)));
  ASSERT_TRUE(s2.store->put(a, 64, payload_for(a, 1)));
  const auto foreign = read_at(s1.file().path(), s1.offset(a), s1.size(a));
  write_at(s2.file().path(), s2.offset(a), foreign);
  auto got = s2.store->acquire(a);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, Errc::auth_failed);
}

TEST(OffloadStoreFile, HeaderWithAnotherLayoutIsRejected) {
  KeptFileStore s;
  const ko::BlockKey a{0, 0, 0};
  ASSERT_TRUE(s.store->put(a, 64, payload_for(a)));
  const std::string path = s.file().path();
  const auto rec = read_at(path, s.offset(a), s.size(a));
  struct Field {
    std::size_t at;
    uint8_t value;
    const char* name;
  };
  for (const Field f : {Field{18, 64, "head_dim"}, Field{14, 64, "k_group"}, Field{12, 8, "k_bits"}, Field{13, 8, "v_bits"}}) {
    auto t = rec;
    t[f.at] = static_cast<std::byte>(f.value);
    write_at(path, s.offset(a), t);
    auto got = s.store->acquire(a);
    ASSERT_FALSE(got) << f.name;
    EXPECT_EQ(got.error().code, Errc::corrupt_data) << f.name;
    EXPECT_NE(got.error().message.find(f.name), std::string::npos) << got.error().message;
  }
  write_at(path, s.offset(a), rec);
  EXPECT_TRUE(s.store->acquire(a));
}

TEST(OffloadStoreFile, NothingOnDiskUntilABlockLeaves) {
  TempDir dir;
  auto c = sync_config(4);
  c.file = ko::FileTier{.directory = dir.path(), .keep_file = true};
  auto keys = ko::StaticKeyProvider::create(std::vector<std::byte>(32, std::byte{1})).value();
  auto store = ko::OffloadStore::create(c, &keys).value();
  for (int b = 0; b < 4; ++b) ASSERT_TRUE(store->put({0, 0, b}, 64, payload_for({0, 0, b})));
  EXPECT_EQ(dir.entries(), 0u);
  ASSERT_TRUE(store->put({0, 0, 4}, 64, payload_for({0, 0, 4})));
  EXPECT_EQ(dir.entries(), 1u);
}

// ---- faults ------------------------------------------------------------------------------------

// C11: a write failing with ENOSPC leaves the block in memory and usable.
TEST(OffloadStoreFaults, DiskFullKeepsBlocksResident) {
  TempDir dir;
  auto be = std::make_shared<ko::FaultInjectingBackend>();
  auto c = sync_config(1);
  c.file = ko::FileTier{.directory = dir.path(), .backend = be};
  auto store = ko::OffloadStore::create(c).value();
  ASSERT_TRUE(store->put({0, 0, 0}, 64, payload_for({0, 0, 0})));
  be->inject_from(be->calls(), ko::Fault::enospc());
  ASSERT_TRUE(store->put({0, 0, 1}, 64, payload_for({0, 0, 1})));  // the put itself succeeds
  auto err = store->flush();
  ASSERT_FALSE(err);
  EXPECT_EQ(err.error().code, Errc::io_error);
  EXPECT_NE(err.error().message.find("ENOSPC"), std::string::npos) << err.error().message;
  EXPECT_NE(err.error().message.find("block (layer 0, kv_head 0, block 0)"), std::string::npos);
  EXPECT_EQ(store->offload({0, 0, 1}).error().code, Errc::io_error);
  for (int b = 0; b < 2; ++b) {
    EXPECT_TRUE(store->is_resident({0, 0, b}));
    auto h = store->acquire({0, 0, b});
    ASSERT_TRUE(h);
    EXPECT_EQ(bytes_of(*h), payload_for({0, 0, b}));
  }
  EXPECT_GE(store->metrics().offload_failures, 2u);
  EXPECT_EQ(store->metrics().offloads, 0u);
  be->clear();  // space again
  ASSERT_TRUE(store->rebalance());
  EXPECT_EQ(store->metrics().resident_blocks, 1u);
  for (int b = 0; b < 2; ++b) EXPECT_EQ(bytes_of(store->acquire({0, 0, b}).value()), payload_for({0, 0, b}));
}

namespace {

// A fixed workload over a file tier whose backend may fail: puts over budget, reads back,
// replaces a block, forces everything out, reads everything again. Any acquire that succeeds
// must show the latest content; failures are tolerated. Returns the expected content.
std::map<ko::BlockKey, std::vector<std::byte>> run_workload(ko::OffloadStore& store, bool& saw_wrong_bytes) {
  std::map<ko::BlockKey, std::vector<std::byte>> want;
  auto put = [&](ko::BlockKey k, int gen) {
    auto p = payload_for(k, gen);
    if (store.put(k, 64, p)) want[k] = p;
  };
  auto get = [&](ko::BlockKey k) {
    auto h = store.acquire(k);
    if (h && bytes_of(*h) != want[k]) saw_wrong_bytes = true;
  };
  for (int b = 0; b < 5; ++b) put({0, b % 2, b}, 0);
  for (int b = 0; b < 5; ++b) get({0, b % 2, b});
  put({0, 0, 2}, 1);
  for (int b = 0; b < 5; ++b) (void)store.offload({0, b % 2, b});
  for (int b = 4; b >= 0; --b) get({0, b % 2, b});
  (void)store.erase({0, 1, 3});
  want.erase({0, 1, 3});
  for (int b = 0; b < 5; ++b) (void)store.offload({0, b % 2, b});
  return want;
}

}  // namespace

// Fault injection at every I/O call of the workload, for each kind of fault: afterwards (the
// fault cleared) every block reads back with its latest content: nothing is lost, and no
// acquire ever returned wrong bytes.
TEST(OffloadStoreFaults, FaultAtEveryIoCallLosesNothing) {
  for (bool durable : {false, true}) {
    uint64_t total_calls = 0;
    {
      TempDir dir;
      auto be = std::make_shared<ko::FaultInjectingBackend>();
      auto c = sync_config(2);
      c.file = ko::FileTier{.directory = dir.path(), .durable = durable, .backend = be};
      auto store = ko::OffloadStore::create(c).value();
      bool wrong = false;
      run_workload(*store, wrong);
      ASSERT_FALSE(wrong);
      total_calls = be->calls();
    }
    ASSERT_GT(total_calls, 15u);
    const std::vector<std::pair<const char*, ko::Fault>> faults{{"EIO", ko::Fault::eio()},
                                                                {"ENOSPC", ko::Fault::enospc()},
                                                                {"short", ko::Fault::short_transfer()},
                                                                {"EINTR", ko::Fault::eintr()}};
    for (const auto& [fname, fault] : faults) {
      for (uint64_t i = 0; i < total_calls; ++i) {
        SCOPED_TRACE(std::string(fname) + " at call " + std::to_string(i) + (durable ? " durable" : ""));
        TempDir dir;
        auto be = std::make_shared<ko::FaultInjectingBackend>();
        be->inject(i, fault);
        auto c = sync_config(2);
        c.file = ko::FileTier{.directory = dir.path(), .durable = durable, .backend = be};
        auto store = ko::OffloadStore::create(c).value();
        bool wrong = false;
        const auto want = run_workload(*store, wrong);
        ASSERT_EQ(be->faults_fired(), 1u);
        ASSERT_FALSE(wrong);
        (void)store->flush();
        for (const auto& [k, bytes] : want) {
          auto h = store->acquire(k);
          ASSERT_TRUE(h) << ko::describe(k) << ": " << h.error().message;
          ASSERT_EQ(bytes_of(*h), bytes) << ko::describe(k);
        }
        EXPECT_EQ(store->contains({0, 1, 3}), false);
        store.reset();
        EXPECT_EQ(dir.entries(), 0u);  // no file left behind, even when unlink failed once
      }
    }
  }
}

// CASES C2's offload round trip (constant groups exact after restore) and C11 with real encoded
// INT4 blocks: test_offload_codec.cpp.
}  // namespace test_offload_store
