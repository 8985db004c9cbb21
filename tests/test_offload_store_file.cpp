// OffloadStore's file tier under attack and failure: every tampering with a stored record
// (bit flips, truncation, swapped, replayed, foreign and wrong-layout records) is rejected, and
// a fault at every I/O call (EIO, ENOSPC, short transfers, EINTR) loses nothing (CASES C11).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "kvpack/offload.hpp"
#include "support/offload_store_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::bytes_of;
using ko::testing::KeptFileStore;
using ko::testing::payload_for;
using ko::testing::read_at;
using ko::testing::sync_config;
using ko::testing::TempDir;
using ko::testing::write_at;

namespace test_offload_store_file {  // own scope: compiled in one unity file with other tests
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
}  // namespace test_offload_store_file
