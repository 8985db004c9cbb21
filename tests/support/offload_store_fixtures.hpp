// Shared helpers of the OffloadStore tests (test_offload_store*.cpp, test_offload_async.cpp):
// a synchronous store configuration over the CASES C11 layout, deterministic payloads per block,
// raw access to a kept offload file (for tampering), and a store whose file tier keeps its file.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvpack/offload.hpp"
#include "support/offload_fixtures.hpp"

namespace kvpack::offload::testing {

/// A store without a background thread (deterministic) over the C11 layout, holding at most
/// `budget_blocks` blocks in memory.
inline StoreConfig sync_config(uint64_t budget_blocks) {
  StoreConfig c;
  c.layout = c11_layout();
  c.resident_budget_bytes = budget_blocks * kC11PayloadBytes;
  c.background = false;
  return c;
}

/// The payload of block `k` at `generation` (a replaced block gets another generation): random
/// bytes seeded by the key, so every block's content differs and is reproducible.
inline std::vector<std::byte> payload_for(const BlockKey& k, int generation = 0) {
  return random_payload(kC11PayloadBytes, static_cast<uint64_t>(k.layer * 100000 + k.kv_head * 1000 + k.block_index) * 31 +
                                              static_cast<uint64_t>(generation));
}

/// A copy of the bytes a handle shows.
inline std::vector<std::byte> bytes_of(const BlockHandle& h) { return {h.bytes().begin(), h.bytes().end()}; }

/// Reads `n` raw bytes at `off` of the (kept) offload file.
inline std::vector<std::byte> read_at(const std::string& path, uint64_t off, std::size_t n) {
  std::vector<std::byte> b(n);
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_EQ(::pread(fd, b.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n));
  ::close(fd);
  return b;
}

/// Writes raw bytes at `off` of the (kept) offload file.
inline void write_at(const std::string& path, uint64_t off, std::span<const std::byte> b) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  EXPECT_EQ(::pwrite(fd, b.data(), b.size(), static_cast<off_t>(off)), static_cast<ssize_t>(b.size()));
  ::close(fd);
}

/// An encrypted file tier whose file stays on disk (keep_file), with the record offsets and
/// sizes the tampering tests need.
struct KeptFileStore {
  TempDir dir;
  StaticKeyProvider keys = StaticKeyProvider::create(std::vector<std::byte>(32, std::byte{7})).value();
  std::unique_ptr<OffloadStore> store;
  explicit KeptFileStore(uint64_t budget_blocks = 0) {
    auto c = sync_config(budget_blocks);
    c.file = FileTier{.directory = dir.path(), .keep_file = true};
    store = OffloadStore::create(c, &keys).value();
  }
  FileRecordTier& file() { return dynamic_cast<FileRecordTier&>(*store->tier(0)); }
  uint64_t offset(const BlockKey& k) { return file().slot_offset(store->location(k)->slot); }
  std::size_t size(const BlockKey& k) { return store->location(k)->record_bytes; }
};

}  // namespace kvpack::offload::testing
