// Zeroing that the optimizer may not remove (memory about to be freed still holds user data).
#pragma once

#include <cstddef>
#include <cstring>

namespace kvpack::detail {

/// Overwrites n bytes at p with zeros so that the stores survive even when the memory is freed
/// right after: memset (vectorised, ~memory speed), then an empty asm statement that takes p and
/// clobbers memory, so the compiler must assume the zeros are read and cannot drop them (the
/// pattern of glibc's explicit_bzero and BoringSSL's OPENSSL_cleanse). Other compilers: stores
/// through a volatile pointer, one byte at a time.
inline void secure_zero(void* p, std::size_t n) noexcept {
  if (n == 0) return;
#if defined(__GNUC__) || defined(__clang__)
  std::memset(p, 0, n);
  __asm__ __volatile__("" : : "r"(p) : "memory");
#else
  auto* b = static_cast<volatile unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = 0;
#endif
}

/// Zeroes a contiguous container's whole capacity, then releases it.
template <class Vec>
void wipe_vector(Vec& v) noexcept {
  v.resize(v.capacity());
  if (!v.empty()) secure_zero(v.data(), v.size() * sizeof(v[0]));
  v.clear();
  v.shrink_to_fit();
}

}  // namespace kvpack::detail
