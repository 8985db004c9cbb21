// Zeroing that the optimizer may not remove (memory about to be freed still holds user data).
#pragma once

#include <cstddef>

namespace kvpack::detail {

/// Overwrites n bytes at p with zeros through a volatile pointer, so the stores survive even when
/// the memory is freed right after.
inline void secure_zero(void* p, std::size_t n) noexcept {
  auto* b = static_cast<volatile unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = 0;
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
