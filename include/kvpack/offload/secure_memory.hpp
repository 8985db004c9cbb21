// Memory that is wiped when freed: SecureBytes for block payloads and records (plain heap,
// wiped with sodium_memzero), SecretBytes for keys and passphrases (libsodium's guarded
// allocation: guard pages, mlock()ed where the OS allows, wiped and unlocked on free).
//
// Requires libsodium (link `pkg-config --libs libsodium`).
#pragma once

#include <sodium.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "kvpack/result.hpp"

namespace kvpack::offload {

/// Initializes libsodium once per process (thread-safe; later calls are free).
/// Errc::unsupported if sodium_init() fails (no usable random source).
[[nodiscard]] inline Status ensure_sodium() {
  static const int rc = sodium_init();  // 0 first time, 1 if already initialized, -1 failure
  if (rc < 0) return fail(Errc::unsupported, "libsodium could not be initialized (sodium_init failed)");
  return {};
}

/// An owned byte buffer that is overwritten with zeros (sodium_memzero, which the compiler may
/// not elide) before its memory is released. Move-only. Contents are uninitialized after
/// construction. Used for compressed block payloads (the user's conversation in compressed
/// form) and sealed records.
class SecureBytes {
 public:
  SecureBytes() = default;
  /// `n` uninitialized bytes.
  explicit SecureBytes(std::size_t n) : p_(n ? new std::byte[n] : nullptr), n_(n) {}
  /// A copy of `src`.
  [[nodiscard]] static SecureBytes copy_of(std::span<const std::byte> src) {
    SecureBytes b(src.size());
    if (!src.empty()) std::memcpy(b.p_.get(), src.data(), src.size());
    return b;
  }
  SecureBytes(SecureBytes&& o) noexcept : p_(std::move(o.p_)), n_(std::exchange(o.n_, 0)) {}
  SecureBytes& operator=(SecureBytes&& o) noexcept {
    if (this != &o) {
      wipe_and_free();
      p_ = std::move(o.p_);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  SecureBytes(const SecureBytes&) = delete;
  SecureBytes& operator=(const SecureBytes&) = delete;
  ~SecureBytes() { wipe_and_free(); }

  [[nodiscard]] std::span<std::byte> span() noexcept { return {p_.get(), n_}; }
  [[nodiscard]] std::span<const std::byte> span() const noexcept { return {p_.get(), n_}; }
  [[nodiscard]] std::byte* data() noexcept { return p_.get(); }
  [[nodiscard]] const std::byte* data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  void wipe_and_free() noexcept {
    if (p_) sodium_memzero(p_.get(), n_);
    p_.reset();
    n_ = 0;
  }
  std::unique_ptr<std::byte[]> p_;
  std::size_t n_ = 0;
};

/// Secret bytes (keys, passphrases) in libsodium guarded memory: sodium_malloc() places them
/// between guard pages and mlock()s them where RLIMIT_MEMLOCK allows (so they are not swapped
/// out); sodium_free() wipes and unlocks. After seal() the pages are read-only. Move-only.
class SecretBytes {
 public:
  SecretBytes() = default;
  /// `n` bytes (n > 0) of guarded memory, writable until seal(). Errc::capacity_exceeded when
  /// the allocation fails.
  [[nodiscard]] static Result<SecretBytes> allocate(std::size_t n) {
    if (auto s = ensure_sodium(); !s) return s.error();
    if (n == 0) return fail(Errc::invalid_argument, "secret buffer of 0 bytes");
    void* p = sodium_malloc(n);
    if (!p) return fail(Errc::capacity_exceeded, "sodium_malloc of " + std::to_string(n) + " bytes failed");
    SecretBytes s;
    s.p_ = static_cast<std::byte*>(p);
    s.n_ = n;
    return s;
  }
  /// Guarded, read-only copy of `src`.
  [[nodiscard]] static Result<SecretBytes> copy_of(std::span<const std::byte> src) {
    auto s = allocate(src.size());
    if (!s) return s.error();
    std::memcpy(s->p_, src.data(), src.size());
    s->seal();
    return std::move(s).value();
  }
  /// `n` random bytes (randombytes_buf), read-only.
  [[nodiscard]] static Result<SecretBytes> random(std::size_t n) {
    auto s = allocate(n);
    if (!s) return s.error();
    randombytes_buf(s->p_, n);
    s->seal();
    return std::move(s).value();
  }

  SecretBytes(SecretBytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  SecretBytes& operator=(SecretBytes&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  SecretBytes(const SecretBytes&) = delete;
  SecretBytes& operator=(const SecretBytes&) = delete;
  ~SecretBytes() { release(); }

  /// Makes the pages read-only (writes then fault). Idempotent.
  void seal() noexcept {
    if (p_) sodium_mprotect_readonly(p_);
  }
  /// Writable view; only valid before seal().
  [[nodiscard]] std::span<std::byte> writable() noexcept { return {p_, n_}; }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {p_, n_}; }
  [[nodiscard]] const unsigned char* uchar() const noexcept { return reinterpret_cast<const unsigned char*>(p_); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }

 private:
  void release() noexcept {
    if (p_) sodium_free(p_);  // makes the pages writable, wipes, munlocks, unmaps
    p_ = nullptr;
    n_ = 0;
  }
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace kvpack::offload
