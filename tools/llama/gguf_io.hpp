// Low-level input for the GGUF reader (gguf.hpp): a read-only memory mapping of the file and a
// bounds-checked little-endian cursor over it. Every read is checked against the mapped size.
#pragma once

#include <kvpack/result.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "gguf_types.hpp"

namespace kvpack::llama {

namespace detail {

/// Read-only memory mapping of a whole file (RAII; movable, not copyable).
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      unmap();
      addr_ = std::exchange(o.addr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~MappedFile() { unmap(); }

  /// Maps `path` read-only. Errors (Errc::io_error): cannot open/stat/map, not a regular file.
  [[nodiscard]] static Result<MappedFile> open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(Errc::io_error, "cannot open '" + path + "': " + std::strerror(errno));
    struct ::stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return fail(Errc::io_error, "cannot stat '" + path + "': " + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return fail(Errc::io_error, "'" + path + "' is not a regular file");
    }
    MappedFile m;
    m.size_ = static_cast<size_t>(st.st_size);
    if (m.size_ > 0) {
      void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        return fail(Errc::io_error, "cannot mmap '" + path + "': " + std::strerror(e));
      }
      m.addr_ = p;
    }
    ::close(fd);  // the mapping stays valid after close
    return m;
  }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept {
    return {static_cast<const std::byte*>(addr_), size_};
  }

 private:
  void unmap() noexcept {
    if (addr_ != nullptr) ::munmap(addr_, size_);
    addr_ = nullptr;
    size_ = 0;
  }
  void* addr_ = nullptr;
  size_t size_ = 0;
};

/// Bounds-checked little-endian cursor over the file bytes.
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}

  [[nodiscard]] size_t pos() const noexcept { return pos_; }
  [[nodiscard]] size_t remaining() const noexcept { return bytes_.size() - pos_; }

  /// Reads an unsigned little-endian integer of N bytes; std::nullopt if the file ends first.
  template <class T>
  [[nodiscard]] std::optional<T> read_uint() noexcept {
    static_assert(std::is_unsigned_v<T>);
    if (remaining() < sizeof(T)) return std::nullopt;
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(bytes_[pos_ + i]) << (8 * i));
    pos_ += sizeof(T);
    return v;
  }

  /// Reads `n` raw bytes; std::nullopt if the file ends first.
  [[nodiscard]] std::optional<std::span<const std::byte>> read_bytes(uint64_t n) noexcept {
    if (n > remaining()) return std::nullopt;
    auto s = bytes_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

 private:
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
};

}  // namespace detail

}  // namespace kvpack::llama
