// Names of offloaded blocks: which cache, layer, KV head, block index and version.
//
// A *block* (DESIGN.md section 1) holds the compressed K/V of `block_tokens` consecutive tokens
// of one (layer, kv_head). The offload layer treats its payload as opaque bytes; these types
// name it. `BlockKey` is what the cache uses to address a block; `BlockId` adds what a stored
// record is cryptographically bound to (cache id and version), see block_record.hpp.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace kvpack::offload {

/// 128-bit identifier of one cache instance, drawn at random when an OffloadStore is created.
/// Records sealed by one cache are rejected by every other (the id is in the associated data).
struct CacheId {
  std::array<std::byte, 16> bytes{};

  friend bool operator==(const CacheId&, const CacheId&) = default;

  /// Lower-case hex, 32 characters (for messages and file names).
  [[nodiscard]] std::string hex() const {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s;
    s.reserve(32);
    for (std::byte b : bytes) {
      s.push_back(digits[std::to_integer<unsigned>(b) >> 4]);
      s.push_back(digits[std::to_integer<unsigned>(b) & 0xF]);
    }
    return s;
  }
};

/// Address of a block inside one cache: layer, KV head (not query head: under GQA one KV head
/// serves several query heads) and block index along the token axis (tokens
/// [block_index * block_tokens, (block_index + 1) * block_tokens)).
struct BlockKey {
  int32_t layer = 0;
  int32_t kv_head = 0;
  int64_t block_index = 0;

  friend auto operator<=>(const BlockKey&, const BlockKey&) = default;
};

/// "block (layer 3, kv_head 1, block 7)": how every error message names a block.
[[nodiscard]] inline std::string describe(const BlockKey& k) {
  return "block (layer " + std::to_string(k.layer) + ", kv_head " + std::to_string(k.kv_head) +
         ", block " + std::to_string(k.block_index) + ")";
}

/// Everything a stored record is bound to. `version` is unique per store and grows with every
/// put(), also across erase(), so a record of an older content of the same key never verifies.
struct BlockId {
  CacheId cache;
  BlockKey key;
  uint64_t version = 0;

  friend bool operator==(const BlockId&, const BlockId&) = default;

  /// Serialized size in bytes: cache id 16, layer 4, kv_head 4, block_index 8, version 8.
  static constexpr std::size_t kSerializedBytes = 40;

  /// Fixed little-endian serialization used as AEAD associated data (independent of the host).
  [[nodiscard]] std::array<std::byte, kSerializedBytes> serialize() const {
    std::array<std::byte, kSerializedBytes> out{};
    std::size_t at = 0;
    for (std::byte b : cache.bytes) out[at++] = b;
    auto put = [&](uint64_t v, int n) {
      for (int i = 0; i < n; ++i) out[at++] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
    };
    put(static_cast<uint32_t>(key.layer), 4);
    put(static_cast<uint32_t>(key.kv_head), 4);
    put(static_cast<uint64_t>(key.block_index), 8);
    put(version, 8);
    return out;
  }
};

/// Hash of a BlockKey for unordered containers.
struct BlockKeyHash {
  [[nodiscard]] std::size_t operator()(const BlockKey& k) const noexcept {
    uint64_t h = static_cast<uint32_t>(k.layer);
    h = h * 0x9E3779B97F4A7C15ull ^ static_cast<uint32_t>(k.kv_head);
    h = h * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(k.block_index);
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};

}  // namespace kvpack::offload
