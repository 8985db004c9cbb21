// Injectable file I/O for the file tier: a POSIX implementation with positioned I/O, the
// loops that turn single calls into whole reads/writes (EINTR, short transfers), and a
// fault-injecting wrapper for tests.
//
// The backend mirrors POSIX on purpose (each call is one system call, errno-style results) so
// that the retry logic above it is exercised by the fault injector exactly as the kernel would
// exercise it. Everything above this file reports kvpack::Status.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Result of one backend call: `value` (fd or byte count) when `error` is 0, else `error` is
/// an errno value (EINTR, EIO, ENOSPC...).
struct SysResult {
  int64_t value = 0;
  int error = 0;
  [[nodiscard]] bool ok() const noexcept { return error == 0; }
};

/// One system call per method, no retries. Implementations must be thread-safe for
/// concurrent positioned I/O on the same descriptor.
class FileBackend {
 public:
  virtual ~FileBackend() = default;
  /// open(2): value = file descriptor.
  [[nodiscard]] virtual SysResult open(const std::string& path, int flags, unsigned mode) = 0;
  /// pread(2): value = bytes read (may be fewer than asked; 0 at end of file).
  [[nodiscard]] virtual SysResult pread(int fd, std::span<std::byte> buf, uint64_t offset) = 0;
  /// pwrite(2): value = bytes written (may be fewer than asked).
  [[nodiscard]] virtual SysResult pwrite(int fd, std::span<const std::byte> buf, uint64_t offset) = 0;
  /// fsync(2).
  [[nodiscard]] virtual SysResult fsync(int fd) = 0;
  /// ftruncate(2).
  [[nodiscard]] virtual SysResult ftruncate(int fd, uint64_t size) = 0;
  /// close(2); the descriptor is released even when an error is reported (Linux semantics).
  [[nodiscard]] virtual SysResult close(int fd) = 0;
  /// unlink(2).
  [[nodiscard]] virtual SysResult unlink(const std::string& path) = 0;
};

/// The real thing: open/pread/pwrite/fsync/ftruncate/close/unlink of <unistd.h>.
class PosixFileBackend final : public FileBackend {
 public:
  [[nodiscard]] SysResult open(const std::string& path, int flags, unsigned mode) override {
    return wrap(::open(path.c_str(), flags, static_cast<mode_t>(mode)));
  }
  [[nodiscard]] SysResult pread(int fd, std::span<std::byte> buf, uint64_t offset) override {
    return wrap(::pread(fd, buf.data(), buf.size(), static_cast<off_t>(offset)));
  }
  [[nodiscard]] SysResult pwrite(int fd, std::span<const std::byte> buf, uint64_t offset) override {
    return wrap(::pwrite(fd, buf.data(), buf.size(), static_cast<off_t>(offset)));
  }
  [[nodiscard]] SysResult fsync(int fd) override { return wrap(::fsync(fd)); }
  [[nodiscard]] SysResult ftruncate(int fd, uint64_t size) override {
    return wrap(::ftruncate(fd, static_cast<off_t>(size)));
  }
  [[nodiscard]] SysResult close(int fd) override { return wrap(::close(fd)); }
  [[nodiscard]] SysResult unlink(const std::string& path) override { return wrap(::unlink(path.c_str())); }

  /// A shared instance (the backend is stateless).
  [[nodiscard]] static std::shared_ptr<FileBackend> shared() {
    static const std::shared_ptr<FileBackend> instance = std::make_shared<PosixFileBackend>();
    return instance;
  }

 private:
  static SysResult wrap(int64_t rc) { return rc < 0 ? SysResult{0, errno} : SysResult{rc, 0}; }
};

/// "No space left on device (ENOSPC)".
[[nodiscard]] inline std::string errno_text(int err) {
  const char* name = err == ENOSPC ? "ENOSPC" : err == EIO ? "EIO" : err == EINTR ? "EINTR" : err == ENOENT ? "ENOENT" : nullptr;
  std::string s = std::strerror(err);
  if (name) s += std::string(" (") + name + ")";
  return s;
}

/// Reads exactly buf.size() bytes at `offset`, retrying on EINTR and continuing after short
/// reads. Errc::io_error naming `what` on an error or when the file ends early (a truncated
/// file); the bytes read so far are then wiped.
[[nodiscard]] inline Status read_exact(FileBackend& be, int fd, std::span<std::byte> buf, uint64_t offset,
                                       const std::string& what) {
  std::size_t done = 0;
  while (done < buf.size()) {
    const SysResult r = be.pread(fd, buf.subspan(done), offset + done);
    if (!r.ok() && r.error == EINTR) continue;
    if (!r.ok() || r.value == 0) {
      std::fill(buf.begin(), buf.end(), std::byte{0});
      if (!r.ok())
        return fail(Errc::io_error, what + ": pread of " + std::to_string(buf.size()) + " bytes at offset " +
                                        std::to_string(offset) + " failed: " + errno_text(r.error));
      return fail(Errc::io_error, what + ": short read, the file ends after " + std::to_string(done) + " of " +
                                      std::to_string(buf.size()) + " bytes at offset " + std::to_string(offset) +
                                      " (truncated file)");
    }
    done += static_cast<std::size_t>(r.value);
  }
  return {};
}

/// Writes all of `buf` at `offset`, retrying on EINTR and continuing after short writes.
/// Errc::io_error naming `what` (ENOSPC, EIO, or a write that makes no progress).
[[nodiscard]] inline Status write_all(FileBackend& be, int fd, std::span<const std::byte> buf, uint64_t offset,
                                      const std::string& what) {
  std::size_t done = 0;
  while (done < buf.size()) {
    const SysResult r = be.pwrite(fd, buf.subspan(done), offset + done);
    if (!r.ok() && r.error == EINTR) continue;
    if (!r.ok())
      return fail(Errc::io_error, what + ": pwrite of " + std::to_string(buf.size()) + " bytes at offset " +
                                      std::to_string(offset) + " failed after " + std::to_string(done) +
                                      " bytes: " + errno_text(r.error));
    if (r.value == 0)
      return fail(Errc::io_error, what + ": pwrite made no progress at offset " + std::to_string(offset + done));
    done += static_cast<std::size_t>(r.value);
  }
  return {};
}

/// What a FaultInjectingBackend does to a call it targets.
struct Fault {
  enum class Kind {
    error,      ///< fail with `error` without doing anything (ENOSPC, EIO, ...)
    short_io,   ///< pread/pwrite transfer only half the bytes (at least 1); other calls unaffected
    interrupt,  ///< fail with EINTR without doing anything (callers must retry)
  };
  Kind kind = Kind::error;
  int error = EIO;

  [[nodiscard]] static Fault enospc() { return {Kind::error, ENOSPC}; }
  [[nodiscard]] static Fault eio() { return {Kind::error, EIO}; }
  [[nodiscard]] static Fault short_transfer() { return {Kind::short_io, 0}; }
  [[nodiscard]] static Fault eintr() { return {Kind::interrupt, EINTR}; }
};

/// Test backend: forwards to `inner` and makes chosen calls fail. Calls are numbered 0, 1, 2...
/// in the order they reach the backend (every method counts). Thread-safe.
class FaultInjectingBackend final : public FileBackend {
 public:
  explicit FaultInjectingBackend(std::shared_ptr<FileBackend> inner = PosixFileBackend::shared())
      : inner_(std::move(inner)) {}

  /// Fails call number `index` once with `f`.
  void inject(uint64_t index, Fault f) {
    std::lock_guard lock(mu_);
    once_[index] = f;
  }
  /// Fails every call from number `index` on with `f` (a disk that stays full); clear() ends it.
  void inject_from(uint64_t index, Fault f) {
    std::lock_guard lock(mu_);
    sticky_from_ = index;
    sticky_ = f;
  }
  /// Removes every pending fault.
  void clear() {
    std::lock_guard lock(mu_);
    once_.clear();
    sticky_from_ = UINT64_MAX;
  }
  /// Calls seen so far.
  [[nodiscard]] uint64_t calls() const { return calls_.load(); }
  /// Faults that fired so far.
  [[nodiscard]] uint64_t faults_fired() const { return fired_.load(); }

  [[nodiscard]] SysResult open(const std::string& path, int flags, unsigned mode) override {
    if (auto f = next(); f && f->kind != Fault::Kind::short_io) return {0, f->error};
    return inner_->open(path, flags, mode);
  }
  [[nodiscard]] SysResult pread(int fd, std::span<std::byte> buf, uint64_t offset) override {
    if (auto f = next()) {
      if (f->kind != Fault::Kind::short_io) return {0, f->error};
      return inner_->pread(fd, buf.first(shorter(buf.size())), offset);
    }
    return inner_->pread(fd, buf, offset);
  }
  [[nodiscard]] SysResult pwrite(int fd, std::span<const std::byte> buf, uint64_t offset) override {
    if (auto f = next()) {
      if (f->kind != Fault::Kind::short_io) return {0, f->error};
      return inner_->pwrite(fd, buf.first(shorter(buf.size())), offset);
    }
    return inner_->pwrite(fd, buf, offset);
  }
  [[nodiscard]] SysResult fsync(int fd) override {
    if (auto f = next(); f && f->kind != Fault::Kind::short_io) return {0, f->error};
    return inner_->fsync(fd);
  }
  [[nodiscard]] SysResult ftruncate(int fd, uint64_t size) override {
    if (auto f = next(); f && f->kind != Fault::Kind::short_io) return {0, f->error};
    return inner_->ftruncate(fd, size);
  }
  [[nodiscard]] SysResult close(int fd) override {
    // The descriptor is released even on an injected error, as on Linux.
    const SysResult r = inner_->close(fd);
    if (auto f = next(); f && f->kind != Fault::Kind::short_io) return {0, f->error};
    return r;
  }
  [[nodiscard]] SysResult unlink(const std::string& path) override {
    if (auto f = next(); f && f->kind != Fault::Kind::short_io) return {0, f->error};
    return inner_->unlink(path);
  }

 private:
  static std::size_t shorter(std::size_t n) { return n <= 1 ? n : n / 2; }
  std::optional<Fault> next() {
    const uint64_t i = calls_.fetch_add(1);
    std::lock_guard lock(mu_);
    std::optional<Fault> f;
    if (auto it = once_.find(i); it != once_.end()) {
      f = it->second;
      once_.erase(it);
    } else if (i >= sticky_from_) {
      f = sticky_;
    }
    if (f) fired_.fetch_add(1);
    return f;
  }

  std::shared_ptr<FileBackend> inner_;
  std::atomic<uint64_t> calls_{0}, fired_{0};
  std::mutex mu_;
  std::map<uint64_t, Fault> once_;
  uint64_t sticky_from_ = UINT64_MAX;
  Fault sticky_{};
};

}  // namespace kvpack::offload
