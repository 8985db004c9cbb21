// Offload tiers: where blocks live when they are not in the hot tier.
//
//   DeviceTier  the hot tier, where attention reads blocks. Built without CUDA it is ordinary
//               host RAM owned by the OffloadStore (SecureBytes, wiped on free).
//   HostTier    a RAM tier holding sealed records (encrypted by default; authenticated
//               always). Under CUDA it is meant to be pinned host memory (not yet).
//   FileTier    one file per cache in a configurable directory, fixed-size slots reached by
//               positioned I/O, a free list of slots; unlinked right after it is created
//               unless keep_file (no persistence unless asked), created lazily on the first
//               offload (nothing touches the disk unless a block is actually offloaded).
//
// Config structs (HostTier, FileTier) are plain data; the runtime tiers (HostRecordTier,
// FileRecordTier) implement RecordTier and are created by the OffloadStore.
#pragma once

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvpack/offload/block_id.hpp"
#include "kvpack/offload/crypto.hpp"
#include "kvpack/offload/file_backend.hpp"
#include "kvpack/offload/secure_memory.hpp"
#include "kvpack/result.hpp"

namespace kvpack::offload {

// ---------------------------------------------------------------------------------------------
// Configuration (also the policy vocabulary of Offload<...>)
// ---------------------------------------------------------------------------------------------

/// The hot tier: blocks attention reads. Without CUDA it is host RAM; its size is the store's
/// resident budget (StoreConfig::resident_budget_bytes).
struct DeviceTier {
  static constexpr bool device_memory = false;  ///< true once the CUDA hot tier exists
};

/// RAM tier of sealed records.
struct HostTier {
  uint64_t capacity_bytes = UINT64_MAX;  ///< bytes of records it may hold (record sizes summed)
  bool encrypt = true;                   ///< false: authenticated only (Aead::none), faster
};

/// File tier: one file per cache.
struct FileTier {
  std::string directory{};               ///< where the file is created; empty: $TMPDIR or /tmp
  uint64_t capacity_bytes = UINT64_MAX;  ///< bytes of slots it may hold
  bool keep_file = false;                ///< false: unlinked right after creation
  bool durable = false;                  ///< fsync after every record (only useful with keep_file)
  std::shared_ptr<FileBackend> backend{};  ///< null: PosixFileBackend
};

/// Lookahead of the prefetcher, in layers (Prefetch<2>: while layer l computes, layers l+1
/// and l+2 are fetched).
template <int N>
struct Prefetch {
  static_assert(N >= 0, "Prefetch<N>: N is a number of layers, >= 0");
  static constexpr int lookahead_layers = N;
};

// ---------------------------------------------------------------------------------------------
// Runtime tiers
// ---------------------------------------------------------------------------------------------

/// A tier of sealed records addressed by slot. Thread-safe. The store never loads or releases
/// a slot while a store() into it or a release() of it is running.
class RecordTier {
 public:
  virtual ~RecordTier() = default;
  /// "host" or "file".
  [[nodiscard]] virtual std::string_view name() const = 0;
  /// Protection records in this tier must have (Aead::none only for an unencrypted host tier).
  [[nodiscard]] virtual bool needs_encryption() const = 0;
  /// Stores `record` in a free slot and returns the slot. Errc::capacity_exceeded when full,
  /// Errc::io_error (naming `what`, the block) when the write fails; the slot is then free
  /// again and nothing else changed.
  [[nodiscard]] virtual Result<uint64_t> store(std::span<const std::byte> record, const std::string& what) = 0;
  /// Reads the record in `slot` into `out` (its exact size). On error `out` is zeroed.
  [[nodiscard]] virtual Status load(uint64_t slot, std::span<std::byte> out, const std::string& what) = 0;
  /// Frees `slot` (its bytes are wiped in RAM tiers).
  virtual void release(uint64_t slot) = 0;
  /// Bytes held now (records in RAM; slots in files).
  [[nodiscard]] virtual uint64_t used_bytes() const = 0;
  /// Whether a record of `bytes` bytes fits now.
  [[nodiscard]] virtual bool has_room(std::size_t bytes) const = 0;
};

/// HostTier at run time: each record in its own wiped-on-free buffer.
class HostRecordTier final : public RecordTier {
 public:
  explicit HostRecordTier(HostTier cfg) : cfg_(cfg) {}

  [[nodiscard]] std::string_view name() const override { return "host"; }
  [[nodiscard]] bool needs_encryption() const override { return cfg_.encrypt; }

  [[nodiscard]] Result<uint64_t> store(std::span<const std::byte> record, const std::string& what) override {
    SecureBytes copy = SecureBytes::copy_of(record);
    std::lock_guard lock(mu_);
    if (used_ + record.size() > cfg_.capacity_bytes)
      return fail(Errc::capacity_exceeded, what + ": host tier full (" + std::to_string(used_) + " of " +
                                               std::to_string(cfg_.capacity_bytes) + " bytes)");
    uint64_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = slots_.size();
      slots_.emplace_back();
    }
    slots_[slot] = std::move(copy);
    used_ += record.size();
    return slot;
  }

  [[nodiscard]] Status load(uint64_t slot, std::span<std::byte> out, const std::string& what) override {
    std::lock_guard lock(mu_);
    if (slot >= slots_.size() || slots_[slot].size() != out.size()) {
      std::fill(out.begin(), out.end(), std::byte{0});
      return fail(Errc::corrupt_data, what + ": host tier slot " + std::to_string(slot) + " holds no record of " +
                                          std::to_string(out.size()) + " bytes");
    }
    std::memcpy(out.data(), slots_[slot].data(), out.size());
    return {};
  }

  void release(uint64_t slot) override {
    std::lock_guard lock(mu_);
    if (slot >= slots_.size() || slots_[slot].size() == 0) return;
    used_ -= slots_[slot].size();
    slots_[slot] = SecureBytes();  // wipes
    free_.push_back(slot);
  }

  [[nodiscard]] uint64_t used_bytes() const override {
    std::lock_guard lock(mu_);
    return used_;
  }
  [[nodiscard]] bool has_room(std::size_t bytes) const override {
    std::lock_guard lock(mu_);
    return used_ + bytes <= cfg_.capacity_bytes;
  }

  /// Test hook: the stored bytes of `slot` (to tamper with them). Not for production use.
  [[nodiscard]] std::span<std::byte> raw_slot_for_testing(uint64_t slot) {
    std::lock_guard lock(mu_);
    return slot < slots_.size() ? slots_[slot].span() : std::span<std::byte>{};
  }

 private:
  HostTier cfg_;
  mutable std::mutex mu_;
  std::vector<SecureBytes> slots_;
  std::vector<uint64_t> free_;
  uint64_t used_ = 0;
};

/// FileTier at run time.
///
/// File layout: a 4096-byte superblock, then slots of `slot_bytes` bytes (a multiple of 4096,
/// at least one record of the largest payload). Slot s starts at 4096 + s * slot_bytes; a
/// record occupies the front of its slot.
/// Superblock: "KVPKFILE" (8) | format version u32 = 1 | slot_bytes u32 | cache id (16) |
/// aead u8 | wrapped-key flag u8 | wrapped data key (72, zero if none) | zero fill.
/// Freed slots are reused, not overwritten: their bytes are ciphertext under a key that is
/// wiped when the cache ends.
class FileRecordTier final : public RecordTier {
 public:
  static constexpr uint64_t kSuperblockBytes = 4096;

  /// `max_record_bytes`: size of the largest record; `wrapped_key`: written to the
  /// superblock when present. Opens nothing yet.
  FileRecordTier(FileTier cfg, const CacheId& cache, Aead aead, std::size_t max_record_bytes,
                 std::optional<WrappedKey> wrapped_key)
      : cfg_(std::move(cfg)), cache_(cache), aead_(aead), wrapped_(wrapped_key) {
    if (!cfg_.backend) cfg_.backend = PosixFileBackend::shared();
    if (cfg_.directory.empty()) {
      const char* t = std::getenv("TMPDIR");
      cfg_.directory = (t && *t) ? t : "/tmp";
    }
    slot_bytes_ = (max_record_bytes + 4095) / 4096 * 4096;
  }
  FileRecordTier(const FileRecordTier&) = delete;
  FileRecordTier& operator=(const FileRecordTier&) = delete;
  ~FileRecordTier() override {
    std::lock_guard lock(mu_);
    if (fd_ >= 0) (void)cfg_.backend->close(fd_);
    for (const auto& p : pending_unlink_) (void)cfg_.backend->unlink(p);
  }

  [[nodiscard]] std::string_view name() const override { return "file"; }
  [[nodiscard]] bool needs_encryption() const override { return true; }
  /// Bytes per slot.
  [[nodiscard]] uint64_t slot_bytes() const noexcept { return slot_bytes_; }
  /// Path of the current file ("" before the first offload). With keep_file false the name
  /// is already unlinked.
  [[nodiscard]] std::string path() const {
    std::lock_guard lock(mu_);
    return path_;
  }
  /// Byte offset of `slot` in the file.
  [[nodiscard]] uint64_t slot_offset(uint64_t slot) const noexcept { return kSuperblockBytes + slot * slot_bytes_; }

  [[nodiscard]] Result<uint64_t> store(std::span<const std::byte> record, const std::string& what) override {
    if (record.size() > slot_bytes_)
      return fail(Errc::invalid_argument, what + ": record of " + std::to_string(record.size()) +
                                              " bytes exceeds the file slot of " + std::to_string(slot_bytes_));
    int fd;
    uint64_t slot;
    {
      std::lock_guard lock(mu_);
      if (fd_ < 0)
        if (auto s = open_locked(what); !s) return s.error();
      if (free_.empty() && (next_slot_ + 1) * slot_bytes_ > cfg_.capacity_bytes)
        return fail(Errc::capacity_exceeded, what + ": file tier full (" + std::to_string(next_slot_) + " slots of " +
                                                 std::to_string(slot_bytes_) + " bytes)");
      if (!free_.empty()) {
        slot = free_.back();
        free_.pop_back();
      } else {
        slot = next_slot_++;
      }
      ++live_;
      fd = fd_;
    }
    auto s = write_all(*cfg_.backend, fd, record, slot_offset(slot), what + ": file " + path_unlocked());
    if (s && cfg_.durable) {
      const SysResult r = cfg_.backend->fsync(fd);
      if (!r.ok()) s = fail(Errc::io_error, what + ": fsync of " + path_unlocked() + " failed: " + errno_text(r.error));
    }
    if (!s) {
      release(slot);
      return s.error();
    }
    return slot;
  }

  [[nodiscard]] Status load(uint64_t slot, std::span<std::byte> out, const std::string& what) override {
    int fd;
    {
      std::lock_guard lock(mu_);
      fd = fd_;
    }
    if (fd < 0) {
      std::fill(out.begin(), out.end(), std::byte{0});
      return fail(Errc::io_error, what + ": the offload file is not open");
    }
    return read_exact(*cfg_.backend, fd, out, slot_offset(slot), what + ": file " + path_unlocked());
  }

  void release(uint64_t slot) override {
    std::lock_guard lock(mu_);
    free_.push_back(slot);
    --live_;
  }

  [[nodiscard]] uint64_t used_bytes() const override {
    std::lock_guard lock(mu_);
    return live_ * slot_bytes_;
  }
  [[nodiscard]] bool has_room(std::size_t bytes) const override {
    std::lock_guard lock(mu_);
    return bytes <= slot_bytes_ && (!free_.empty() || (next_slot_ + 1) * slot_bytes_ <= cfg_.capacity_bytes);
  }

 private:
  std::string path_unlocked() const {
    std::lock_guard lock(mu_);
    return path_;
  }

  // Creates the file (O_EXCL, mode 0600, no symlink following), unlinks it unless keep_file,
  // writes the superblock. On failure nothing stays open; a name that could not be unlinked
  // is retried later and in the destructor.
  Status open_locked(const std::string& what) {
    for (auto it = pending_unlink_.begin(); it != pending_unlink_.end();) {
      it = cfg_.backend->unlink(*it).ok() ? pending_unlink_.erase(it) : it + 1;
    }
    std::string path = cfg_.directory + "/kvpack-" + cache_.hex() + "-" + std::to_string(attempt_++) + ".kvoff";
    SysResult r{};
    do {
      r = cfg_.backend->open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    } while (!r.ok() && r.error == EINTR);
    if (!r.ok()) return fail(Errc::io_error, what + ": cannot create offload file " + path + ": " + errno_text(r.error));
    const int fd = static_cast<int>(r.value);
    bool unlinked = false;
    auto give_up = [&](Error e) -> Status {
      (void)cfg_.backend->close(fd);
      if (!unlinked && !cfg_.backend->unlink(path).ok()) pending_unlink_.push_back(path);
      return e;
    };
    if (!cfg_.keep_file) {
      const SysResult u = cfg_.backend->unlink(path);
      if (!u.ok())
        return give_up(fail(Errc::io_error, what + ": cannot unlink offload file " + path + ": " + errno_text(u.error)));
      unlinked = true;
    }
    std::array<std::byte, kSuperblockBytes> sb{};
    std::memcpy(sb.data(), "KVPKFILE", 8);
    auto put = [&](std::size_t at, uint64_t v, int n) {
      for (int i = 0; i < n; ++i) sb[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
    };
    put(8, 1, 4);
    put(12, slot_bytes_, 4);
    std::memcpy(sb.data() + 16, cache_.bytes.data(), 16);
    put(32, static_cast<uint8_t>(aead_), 1);
    put(33, wrapped_ ? 1 : 0, 1);
    if (wrapped_) std::memcpy(sb.data() + 34, wrapped_->data(), wrapped_->size());
    if (auto s = write_all(*cfg_.backend, fd, sb, 0, what + ": superblock of " + path); !s) return give_up(s.error());
    if (cfg_.durable) {
      const SysResult f = cfg_.backend->fsync(fd);
      if (!f.ok()) return give_up(fail(Errc::io_error, what + ": fsync of " + path + " failed: " + errno_text(f.error)));
    }
    fd_ = fd;
    path_ = std::move(path);
    return {};
  }

  FileTier cfg_;
  CacheId cache_;
  Aead aead_;
  std::optional<WrappedKey> wrapped_;
  uint64_t slot_bytes_ = 0;
  mutable std::mutex mu_;
  int fd_ = -1;
  std::string path_;
  uint64_t attempt_ = 0;
  std::vector<std::string> pending_unlink_;
  std::vector<uint64_t> free_;
  uint64_t next_slot_ = 0;
  uint64_t live_ = 0;
};

}  // namespace kvpack::offload
