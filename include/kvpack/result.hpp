// kvpack::Result<T> and kvpack::Status: error reporting without exceptions.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace kvpack {

/// Category of a failure; the message carries the specifics (layer, head, token, path...).
enum class Errc {
  invalid_argument,   ///< wrong shape, out-of-range index, bad configuration
  non_finite,         ///< NaN or Inf found in K or V (or another input that must be finite)
  capacity_exceeded,  ///< more tokens than the cache was sized for
  io_error,           ///< a read or write failed (disk full, short read, ...)
  corrupt_data,       ///< a header, layout or checksum does not match
  auth_failed,        ///< an AEAD tag did not verify (tampered, swapped or replayed data)
  not_present,        ///< the requested data is not (yet) resident
  unsupported,        ///< the operation is not available in this build or for this format
  out_of_memory,      ///< an allocation failed (std::bad_alloc caught at the API boundary)
};

/// Human-readable name of an error category.
[[nodiscard]] constexpr const char* to_string(Errc e) noexcept {
  switch (e) {
    case Errc::invalid_argument: return "invalid argument";
    case Errc::non_finite: return "non-finite value";
    case Errc::capacity_exceeded: return "capacity exceeded";
    case Errc::io_error: return "I/O error";
    case Errc::corrupt_data: return "corrupt data";
    case Errc::auth_failed: return "authentication failed";
    case Errc::not_present: return "not present";
    case Errc::unsupported: return "unsupported";
    case Errc::out_of_memory: return "out of memory";
  }
  return "unknown error";
}

/// An error: a category plus a message that names what failed.
struct Error {
  Errc code;
  std::string message;
};

/// Creates an Error; `return kvpack::fail(Errc::invalid_argument, "...")` converts to any Result.
[[nodiscard]] inline Error fail(Errc code, std::string message) { return Error{code, std::move(message)}; }

/// std::expected-like holder of either a T or an Error (C++20 has no std::expected).
/// Accessing value() of an error, or error() of a value, aborts (a programming error).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  [[nodiscard]] bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  [[nodiscard]] T& value() & { check(true); return std::get<0>(v_); }
  [[nodiscard]] const T& value() const& { check(true); return std::get<0>(v_); }
  [[nodiscard]] T&& value() && { check(true); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  [[nodiscard]] const Error& error() const { check(false); return std::get<1>(v_); }

 private:
  void check(bool want_value) const {
    if (has_value() != want_value) std::abort();
  }
  std::variant<T, Error> v_;
};

/// Result of an operation that yields nothing on success.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT: implicit by design

  [[nodiscard]] bool has_value() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  [[nodiscard]] const Error& error() const {
    if (ok_) std::abort();
    return err_;
  }

 private:
  Error err_{Errc::invalid_argument, {}};
  bool ok_ = true;
};

/// Success-or-error of an operation with no value.
using Status = Result<void>;

}  // namespace kvpack
