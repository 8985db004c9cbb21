// The serialized header in front of every offloaded block record, and the layout it is
// checked against on restore.
//
// Header byte layout (32 bytes, all integers little-endian, independent of the host):
//
//   offset size field
//        0    4 magic            'K' 'V' 'P' 'B'
//        4    2 format_version   kFormatVersion (1)
//        6    1 aead             Aead id of the record (0 none, 1 XChaCha20-Poly1305, 2 AES-256-GCM)
//        7    1 flags            bit 0: keys quantized per-channel (KIVI); bit 1: keys stored before
//                                RoPE (PreRope<>); other bits 0
//        8    4 codec_format     the K/V codecs' format id (opaque here, see cache_layout.hpp;
//                                tells apart codecs of equal bits, e.g. FP8 E4M3 vs E5M2,
//                                symmetric vs asymmetric, fp16 vs fp32 metadata)
//       12    1 k_bits           bits per key code (4 INT4, 8 INT8/FP8, 16 fp16, 32 fp32)
//       13    1 v_bits           bits per value code
//       14    2 k_group          key group size (channels per group per-token, tokens per group
//                                per-channel; 1 for ungrouped codecs)
//       16    2 v_group          value group size (channels per group)
//       18    2 head_dim         values per token per head
//       20    2 block_tokens     tokens a full block holds (Blocks<B>, 32 or 64 typically)
//       22    2 token_count      tokens this block holds (<= block_tokens)
//       24    4 payload_bytes    bytes of the compressed payload that follows (plaintext size)
//       28    4 reserved         must be 0
//
// The header is stored in clear (it names no user data) and is part of the AEAD associated
// data, so changing any byte fails authentication; a header describing another layout is
// rejected before decryption with Errc::corrupt_data.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvpack/result.hpp"

namespace kvpack::offload {

/// How a record is protected. `none` still authenticates (keyed BLAKE2b-128 over the same
/// associated data and the payload) but does not encrypt; used only for in-RAM host tiers
/// configured without encryption. Files always use an AEAD.
enum class Aead : uint8_t {
  none = 0,               ///< authenticated (keyed BLAKE2b, 16-byte tag), payload in clear
  xchacha20poly1305 = 1,  ///< XChaCha20-Poly1305 IETF, 24-byte random nonce, 16-byte tag
  aes256gcm = 2,          ///< AES-256-GCM, 12-byte counter nonce, 16-byte tag (AES-NI only)
};

/// Printable name of an Aead.
[[nodiscard]] constexpr const char* to_string(Aead a) noexcept {
  switch (a) {
    case Aead::none: return "none (BLAKE2b MAC only)";
    case Aead::xchacha20poly1305: return "XChaCha20-Poly1305";
    case Aead::aes256gcm: return "AES-256-GCM";
  }
  return "unknown";
}

/// Shape of the blocks a cache offloads (the offload-side mirror of kvpack::BlockHeader's layout
/// fields plus the codec identity). Every restored header must match all fields but
/// `max_payload_bytes` exactly; that one bounds payload_bytes and sizes file slots.
struct RecordLayout {
  uint32_t codec_format = 0;       ///< K/V codec format id (cache_layout.hpp derives it)
  uint8_t k_bits = 0, v_bits = 0;  ///< bits per key / value code, 1..32
  uint8_t flags = 0;               ///< bit 0: keys per-channel; bit 1: keys before RoPE (PreRope<>)
  uint16_t k_group = 0, v_group = 0;  ///< group sizes, > 0 (1 for ungrouped codecs)
  uint16_t head_dim = 0;           ///< values per token per head, > 0
  uint16_t block_tokens = 0;       ///< tokens per full block, > 0
  uint32_t max_payload_bytes = 0;  ///< bytes of the largest payload (a full block), > 0

  friend bool operator==(const RecordLayout&, const RecordLayout&) = default;

  /// Checks the ranges above; Errc::invalid_argument naming the bad field.
  [[nodiscard]] Status validate() const {
    if (k_bits < 1 || k_bits > 32 || v_bits < 1 || v_bits > 32)
      return fail(Errc::invalid_argument, "block layout: k_bits and v_bits must be 1..32, got " +
                                              std::to_string(k_bits) + " and " + std::to_string(v_bits));
    if (k_group == 0 || v_group == 0) return fail(Errc::invalid_argument, "block layout: group sizes must be > 0");
    if (flags > 3) return fail(Errc::invalid_argument, "block layout: unknown flags " + std::to_string(flags));
    if (head_dim == 0) return fail(Errc::invalid_argument, "block layout: head_dim must be > 0");
    if (block_tokens == 0) return fail(Errc::invalid_argument, "block layout: block_tokens must be > 0");
    if (max_payload_bytes == 0)
      return fail(Errc::invalid_argument, "block layout: max_payload_bytes must be > 0");
    return {};
  }
};

/// Decoded form of the 32-byte header (see the table at the top of this file).
struct RecordHeader {
  static constexpr std::array<std::byte, 4> kMagic{std::byte{'K'}, std::byte{'V'}, std::byte{'P'},
                                                   std::byte{'B'}};
  static constexpr uint16_t kFormatVersion = 1;
  static constexpr std::size_t kBytes = 32;

  uint16_t format_version = kFormatVersion;
  Aead aead = Aead::xchacha20poly1305;
  uint8_t flags = 0;
  uint32_t codec_format = 0;
  uint8_t k_bits = 0, v_bits = 0;
  uint16_t k_group = 0, v_group = 0;
  uint16_t head_dim = 0;
  uint16_t block_tokens = 0;
  uint16_t token_count = 0;
  uint32_t payload_bytes = 0;

  friend bool operator==(const RecordHeader&, const RecordHeader&) = default;

  /// Header of a block of `layout` holding `token_count` tokens in `payload_bytes` bytes.
  [[nodiscard]] static RecordHeader make(const RecordLayout& layout, Aead aead, uint16_t token_count,
                                        uint32_t payload_bytes) noexcept {
    RecordHeader h;
    h.aead = aead;
    h.flags = layout.flags;
    h.codec_format = layout.codec_format;
    h.k_bits = layout.k_bits;
    h.v_bits = layout.v_bits;
    h.k_group = layout.k_group;
    h.v_group = layout.v_group;
    h.head_dim = layout.head_dim;
    h.block_tokens = layout.block_tokens;
    h.token_count = token_count;
    h.payload_bytes = payload_bytes;
    return h;
  }

  /// The 32 header bytes (little-endian, reserved bytes zero).
  [[nodiscard]] std::array<std::byte, kBytes> serialize() const noexcept {
    std::array<std::byte, kBytes> out{};
    for (std::size_t i = 0; i < 4; ++i) out[i] = kMagic[i];
    auto put = [&](std::size_t at, uint64_t v, int n) {
      for (int i = 0; i < n; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
    };
    put(4, format_version, 2);
    put(6, static_cast<uint8_t>(aead), 1);
    put(7, flags, 1);
    put(8, codec_format, 4);
    put(12, k_bits, 1);
    put(13, v_bits, 1);
    put(14, k_group, 2);
    put(16, v_group, 2);
    put(18, head_dim, 2);
    put(20, block_tokens, 2);
    put(22, token_count, 2);
    put(24, payload_bytes, 4);
    return out;
  }

  /// Parses the first 32 bytes of `bytes`. Errc::corrupt_data if fewer than 32 bytes, a wrong
  /// magic, an unknown format version or Aead id, or non-zero reserved bytes.
  [[nodiscard]] static Result<RecordHeader> parse(std::span<const std::byte> bytes) {
    if (bytes.size() < kBytes)
      return fail(Errc::corrupt_data, "block header truncated: " + std::to_string(bytes.size()) +
                                          " of " + std::to_string(kBytes) + " bytes");
    for (std::size_t i = 0; i < 4; ++i)
      if (bytes[i] != kMagic[i]) return fail(Errc::corrupt_data, "block header: bad magic");
    auto get = [&](std::size_t at, int n) {
      uint64_t v = 0;
      for (int i = 0; i < n; ++i) v |= std::to_integer<uint64_t>(bytes[at + static_cast<std::size_t>(i)]) << (8 * i);
      return v;
    };
    RecordHeader h;
    h.format_version = static_cast<uint16_t>(get(4, 2));
    if (h.format_version != kFormatVersion)
      return fail(Errc::corrupt_data,
                  "block header: format version " + std::to_string(h.format_version) + ", expected " +
                      std::to_string(kFormatVersion));
    const auto aead = get(6, 1);
    if (aead > 2) return fail(Errc::corrupt_data, "block header: unknown aead id " + std::to_string(aead));
    h.aead = static_cast<Aead>(aead);
    h.flags = static_cast<uint8_t>(get(7, 1));
    h.codec_format = static_cast<uint32_t>(get(8, 4));
    h.k_bits = static_cast<uint8_t>(get(12, 1));
    h.v_bits = static_cast<uint8_t>(get(13, 1));
    h.k_group = static_cast<uint16_t>(get(14, 2));
    h.v_group = static_cast<uint16_t>(get(16, 2));
    h.head_dim = static_cast<uint16_t>(get(18, 2));
    h.block_tokens = static_cast<uint16_t>(get(20, 2));
    h.token_count = static_cast<uint16_t>(get(22, 2));
    h.payload_bytes = static_cast<uint32_t>(get(24, 4));
    if (get(28, 4) != 0) return fail(Errc::corrupt_data, "block header: reserved bytes are not zero");
    return h;
  }

  /// Checks this header against the cache's layout and protection. Errc::corrupt_data naming the
  /// first field that differs ("head_dim 64, expected 128"), or a token count / payload size
  /// out of range.
  [[nodiscard]] Status check(const RecordLayout& layout, Aead expected_aead) const {
    auto mismatch = [](const char* field, uint64_t got, uint64_t want) {
      return fail(Errc::corrupt_data, std::string("block header layout mismatch: ") + field + " " +
                                          std::to_string(got) + ", expected " + std::to_string(want));
    };
    if (codec_format != layout.codec_format) return mismatch("codec_format", codec_format, layout.codec_format);
    if (flags != layout.flags) return mismatch("flags (key axis, RoPE)", flags, layout.flags);
    if (k_bits != layout.k_bits) return mismatch("k_bits", k_bits, layout.k_bits);
    if (v_bits != layout.v_bits) return mismatch("v_bits", v_bits, layout.v_bits);
    if (k_group != layout.k_group) return mismatch("k_group", k_group, layout.k_group);
    if (v_group != layout.v_group) return mismatch("v_group", v_group, layout.v_group);
    if (head_dim != layout.head_dim) return mismatch("head_dim", head_dim, layout.head_dim);
    if (block_tokens != layout.block_tokens) return mismatch("block_tokens", block_tokens, layout.block_tokens);
    if (aead != expected_aead)
      return fail(Errc::corrupt_data, std::string("block header: protection ") + to_string(aead) +
                                          ", expected " + to_string(expected_aead));
    if (token_count > block_tokens)
      return fail(Errc::corrupt_data, "block header: token_count " + std::to_string(token_count) +
                                          " exceeds block_tokens " + std::to_string(block_tokens));
    if (payload_bytes > layout.max_payload_bytes)
      return fail(Errc::corrupt_data, "block header: payload_bytes " + std::to_string(payload_bytes) +
                                          " exceeds the layout's maximum " +
                                          std::to_string(layout.max_payload_bytes));
    return {};
  }
};

}  // namespace kvpack::offload
