// File backend, whole-transfer loops and the file/host tiers.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvpack/offload/file_backend.hpp"
#include "kvpack/offload/tiers.hpp"
#include "support/offload_fixtures.hpp"

namespace ko = kvpack::offload;
using kvpack::Errc;
using ko::testing::random_payload;
using ko::testing::TempDir;

namespace {

struct OpenFile {
  std::shared_ptr<ko::FaultInjectingBackend> be;
  int fd = -1;
  std::string path;
  OpenFile(const TempDir& dir, std::shared_ptr<ko::FaultInjectingBackend> b) : be(std::move(b)) {
    path = dir.path() + "/f";
    fd = static_cast<int>(ko::PosixFileBackend().open(path, O_RDWR | O_CREAT | O_TRUNC, 0600).value);
  }
  ~OpenFile() { ::close(fd); }
};

std::vector<std::byte> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), {});
  std::vector<std::byte> b(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) b[i] = static_cast<std::byte>(c[i]);
  return b;
}

ko::CacheId some_cache() {
  ko::CacheId c;
  for (std::size_t i = 0; i < 16; ++i) c.bytes[i] = static_cast<std::byte>(0xC0 + i);
  return c;
}

}  // namespace

TEST(OffloadBackend, WholeTransfersRoundTrip) {
  TempDir dir;
  OpenFile f(dir, std::make_shared<ko::FaultInjectingBackend>());
  const auto data = random_payload(10000, 1);
  ASSERT_TRUE(ko::write_all(*f.be, f.fd, data, 100, "test"));
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(ko::read_exact(*f.be, f.fd, back, 100, "test"));
  EXPECT_EQ(back, data);
  EXPECT_EQ(f.be->calls(), 2u);
}

TEST(OffloadBackend, EintrIsRetried) {
  TempDir dir;
  OpenFile f(dir, std::make_shared<ko::FaultInjectingBackend>());
  const auto data = random_payload(4096, 2);
  f.be->inject(0, ko::Fault::eintr());
  f.be->inject(1, ko::Fault::eintr());
  ASSERT_TRUE(ko::write_all(*f.be, f.fd, data, 0, "test"));
  f.be->inject(3, ko::Fault::eintr());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(ko::read_exact(*f.be, f.fd, back, 0, "test"));
  EXPECT_EQ(back, data);
  EXPECT_EQ(f.be->faults_fired(), 3u);
}

TEST(OffloadBackend, ShortTransfersAreContinued) {
  TempDir dir;
  OpenFile f(dir, std::make_shared<ko::FaultInjectingBackend>());
  const auto data = random_payload(4097, 3);
  f.be->inject(0, ko::Fault::short_transfer());
  f.be->inject(1, ko::Fault::short_transfer());
  ASSERT_TRUE(ko::write_all(*f.be, f.fd, data, 7, "test"));
  EXPECT_EQ(f.be->calls(), 3u);  // half, a quarter, the rest
  f.be->inject(3, ko::Fault::short_transfer());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(ko::read_exact(*f.be, f.fd, back, 7, "test"));
  EXPECT_EQ(back, data);
  EXPECT_EQ(file_bytes(f.path).size(), 7 + data.size());
}

TEST(OffloadBackend, ShortWriteThenDiskFullIsAnError) {
  TempDir dir;
  OpenFile f(dir, std::make_shared<ko::FaultInjectingBackend>());
  const auto data = random_payload(1000, 4);
  f.be->inject(0, ko::Fault::short_transfer());
  f.be->inject(1, ko::Fault::enospc());
  auto s = ko::write_all(*f.be, f.fd, data, 0, "block (layer 1, kv_head 0, block 2)");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::io_error);
  EXPECT_NE(s.error().message.find("ENOSPC"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("block (layer 1, kv_head 0, block 2)"), std::string::npos);
  EXPECT_NE(s.error().message.find("after 500 bytes"), std::string::npos) << s.error().message;
}

TEST(OffloadBackend, ReadPastEndIsTruncationAndWipes) {
  TempDir dir;
  OpenFile f(dir, std::make_shared<ko::FaultInjectingBackend>());
  const auto data = random_payload(100, 5);
  ASSERT_TRUE(ko::write_all(*f.be, f.fd, data, 0, "t"));
  std::vector<std::byte> back(101, std::byte{0xEE});
  auto s = ko::read_exact(*f.be, f.fd, back, 0, "t");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::io_error);
  EXPECT_NE(s.error().message.find("truncated"), std::string::npos);
  for (std::byte b : back) ASSERT_EQ(b, std::byte{0});
  f.be->inject(f.be->calls(), ko::Fault::eio());
  std::vector<std::byte> b2(10);
  EXPECT_NE(ko::read_exact(*f.be, f.fd, b2, 0, "t").error().message.find("EIO"), std::string::npos);
}

TEST(OffloadBackend, StickyFaultsAndClear) {
  TempDir dir;
  OpenFile f(dir, std::make_shared<ko::FaultInjectingBackend>());
  const auto data = random_payload(10, 6);
  f.be->inject_from(1, ko::Fault::enospc());
  EXPECT_TRUE(ko::write_all(*f.be, f.fd, data, 0, "t"));
  EXPECT_FALSE(ko::write_all(*f.be, f.fd, data, 0, "t"));
  EXPECT_FALSE(ko::write_all(*f.be, f.fd, data, 0, "t"));
  f.be->clear();
  EXPECT_TRUE(ko::write_all(*f.be, f.fd, data, 0, "t"));
  EXPECT_EQ(f.be->faults_fired(), 2u);
}

// ---- host tier ---------------------------------------------------------------------------------

TEST(OffloadHostTier, StoreLoadReleaseAndCapacity) {
  ko::HostRecordTier t(ko::HostTier{.capacity_bytes = 250, .encrypt = true});
  const auto a = random_payload(100, 1), b = random_payload(100, 2), c = random_payload(100, 3);
  auto sa = t.store(a, "a").value();
  auto sb = t.store(b, "b").value();
  EXPECT_EQ(t.used_bytes(), 200u);
  EXPECT_FALSE(t.has_room(100));
  EXPECT_EQ(t.store(c, "c").error().code, Errc::capacity_exceeded);
  std::vector<std::byte> back(100);
  ASSERT_TRUE(t.load(sb, back, "b"));
  EXPECT_EQ(back, b);
  t.release(sa);
  EXPECT_EQ(t.used_bytes(), 100u);
  auto sc = t.store(c, "c").value();
  EXPECT_EQ(sc, sa);  // the freed slot is reused
  ASSERT_TRUE(t.load(sc, back, "c"));
  EXPECT_EQ(back, c);
  std::vector<std::byte> wrong(99, std::byte{1});
  EXPECT_EQ(t.load(sc, wrong, "c").error().code, Errc::corrupt_data);
  EXPECT_EQ(t.load(77, back, "x").error().code, Errc::corrupt_data);
}

// ---- file tier ---------------------------------------------------------------------------------

TEST(OffloadFileTier, CreatedLazilyAndUnlinkedByDefault) {
  TempDir dir;
  {
    ko::FileRecordTier t(ko::FileTier{.directory = dir.path()}, some_cache(), ko::Aead::xchacha20poly1305, 5000,
                         std::nullopt);
    EXPECT_EQ(t.slot_bytes(), 8192u);
    EXPECT_EQ(dir.entries(), 0u);  // nothing on disk before the first record
    EXPECT_EQ(t.path(), "");
    const auto a = random_payload(5000, 1);
    auto s = t.store(a, "a");
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_EQ(dir.entries(), 0u);  // already unlinked
    EXPECT_FALSE(std::filesystem::exists(t.path()));
    std::vector<std::byte> back(5000);
    ASSERT_TRUE(t.load(*s, back, "a"));
    EXPECT_EQ(back, a);
  }
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(OffloadFileTier, KeptFileHasSuperblockAndPrivateMode) {
  TempDir dir;
  ko::WrappedKey wk{};
  for (std::size_t i = 0; i < wk.size(); ++i) wk[i] = static_cast<std::byte>(i + 1);
  std::string path;
  {
    ko::FileRecordTier t(ko::FileTier{.directory = dir.path(), .keep_file = true}, some_cache(), ko::Aead::aes256gcm,
                         100, wk);
    const auto a = random_payload(100, 1), b = random_payload(60, 2);
    const auto sa = t.store(a, "a").value();
    const auto sb = t.store(b, "b").value();
    EXPECT_EQ(t.used_bytes(), 2 * 4096u);
    path = t.path();
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    const auto bytes = file_bytes(path);
    ASSERT_EQ(bytes.size(), 4096u + 4096u + 60u);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), 8), "KVPKFILE");
    EXPECT_EQ(std::to_integer<int>(bytes[8]), 1);                 // format version
    EXPECT_EQ(std::to_integer<int>(bytes[13]), 4096 >> 8);        // slot bytes
    EXPECT_EQ(std::to_integer<int>(bytes[16]), 0xC0);             // cache id
    EXPECT_EQ(std::to_integer<int>(bytes[32]), 2);                // aead
    EXPECT_EQ(std::to_integer<int>(bytes[33]), 1);                // wrapped key present
    EXPECT_EQ(std::to_integer<int>(bytes[34]), 1);                // first wrapped-key byte
    EXPECT_TRUE(std::equal(a.begin(), a.end(), bytes.begin() + 4096 + static_cast<std::ptrdiff_t>(sa * 4096)));
    EXPECT_TRUE(std::equal(b.begin(), b.end(), bytes.begin() + 4096 + static_cast<std::ptrdiff_t>(sb * 4096)));
    // C11: file truncated by one byte -> the last record cannot be read.
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(bytes.size() - 1)), 0);
    std::vector<std::byte> back(60, std::byte{0xEE});
    auto r = t.load(sb, back, "block b");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::io_error);
    for (std::byte x : back) ASSERT_EQ(x, std::byte{0});
    std::vector<std::byte> ok(100);
    EXPECT_TRUE(t.load(sa, ok, "a"));
  }
  EXPECT_TRUE(std::filesystem::exists(path));  // kept on close
}

TEST(OffloadFileTier, SlotsAreReusedAndCapacityHolds) {
  TempDir dir;
  ko::FileRecordTier t(ko::FileTier{.directory = dir.path(), .capacity_bytes = 3 * 4096}, some_cache(),
                       ko::Aead::xchacha20poly1305, 4000, std::nullopt);
  const auto a = random_payload(4000, 1);
  auto s0 = t.store(a, "0").value(), s1 = t.store(a, "1").value(), s2 = t.store(a, "2").value();
  EXPECT_EQ(s0 + s1 + s2, 0u + 1u + 2u);
  EXPECT_FALSE(t.has_room(4000));
  EXPECT_EQ(t.store(a, "3").error().code, Errc::capacity_exceeded);
  t.release(s1);
  EXPECT_TRUE(t.has_room(4000));
  EXPECT_EQ(t.store(a, "4").value(), s1);
  std::vector<std::byte> big(4097);
  EXPECT_EQ(t.store(big, "big").error().code, Errc::invalid_argument);
}

TEST(OffloadFileTier, FailedCreationLeavesNothingAndIsRetried) {
  TempDir dir;
  // call 0 open, 1 unlink, 2 superblock pwrite, 3 record pwrite
  for (int failing = 0; failing < 3; ++failing) {
    auto be = std::make_shared<ko::FaultInjectingBackend>();
    be->inject(static_cast<uint64_t>(failing), ko::Fault::eio());
    {
      ko::FileRecordTier t(ko::FileTier{.directory = dir.path(), .backend = be}, some_cache(),
                           ko::Aead::xchacha20poly1305, 100, std::nullopt);
      const auto a = random_payload(100, 1);
      auto s = t.store(a, "block x");
      ASSERT_FALSE(s) << "call " << failing;
      EXPECT_EQ(s.error().code, Errc::io_error);
      EXPECT_NE(s.error().message.find("block x"), std::string::npos);
      auto again = t.store(a, "block x");
      ASSERT_TRUE(again) << again.error().message;
      std::vector<std::byte> back(100);
      ASSERT_TRUE(t.load(*again, back, "block x"));
      EXPECT_EQ(back, a);
    }
    EXPECT_EQ(dir.entries(), 0u) << "call " << failing << " left a file behind";
  }
}

TEST(OffloadFileTier, DurableModeSyncsAndReportsFsyncFailure) {
  TempDir dir;
  auto be = std::make_shared<ko::FaultInjectingBackend>();
  ko::FileRecordTier t(ko::FileTier{.directory = dir.path(), .durable = true, .backend = be}, some_cache(),
                       ko::Aead::xchacha20poly1305, 100, std::nullopt);
  const auto a = random_payload(100, 1);
  ASSERT_TRUE(t.store(a, "a"));
  const uint64_t calls = be->calls();  // open, unlink, superblock, fsync, record, fsync
  EXPECT_EQ(calls, 6u);
  be->inject(calls + 1, ko::Fault::eio());  // the fsync after the next record
  auto s = t.store(a, "b");
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("fsync"), std::string::npos);
  EXPECT_EQ(t.used_bytes(), 4096u);  // the failed record's slot is free again
}
