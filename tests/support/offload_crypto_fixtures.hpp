// Shared helpers of the offload crypto tests (test_offload_record.cpp, test_offload_keys.cpp):
// a fresh random key and a deterministic cache id per seed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvpack/offload/block_id.hpp"
#include "kvpack/offload/crypto.hpp"

namespace kvpack::offload::testing {

/// A fresh random key of kKeyBytes (a data key or a key-encryption key).
[[nodiscard]] inline SecretBytes random_key() { return SecretBytes::random(kKeyBytes).value(); }

/// A cache id whose bytes are seed, seed + 7, seed + 14, ... (distinct seeds: distinct ids).
[[nodiscard]] inline CacheId cache_id(uint8_t seed) {
  CacheId c;
  for (std::size_t i = 0; i < c.bytes.size(); ++i) c.bytes[i] = static_cast<std::byte>(seed + 7 * i);
  return c;
}

}  // namespace kvpack::offload::testing
