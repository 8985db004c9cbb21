// The storage block: BlockTokens tokens of one (layer, kv_head), quantized together.
//
// Byte layout of a block's payload (B = tokens per block, D = head_dim):
//   [K codes   B x code_bytes(D)]            token-major rows (INT4: element 2i in the low nibble)
//   [K meta    per-token:   B x (D/G) x mb]  one scale(+zero) per group of G channels per token
//              per-channel: (B/G) x D x mb]  one scale(+zero) per channel per group of G tokens
//   [V codes   B x code_bytes(D)]
//   [V meta    B x (D/G) x mb]
//   [positions B x int32]                    original token positions (kept after eviction)
// Keyframe codecs (codec/keyframe.hpp) replace a role's [codes][meta] pair by one interval
// stream of Keyframe::used_bytes(B, D) bytes (block = one interval); its meta region is empty.
// A BlockHeader travels beside the payload (format, bits, group sizes, head_dim, count, version)
// so offloaded copies can be checked against the cache's layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvpack/codec/keyframe.hpp"
#include "kvpack/codec/rows.hpp"

namespace kvpack {

/// Fixed-size description of a block; 16 bytes. `version` increases whenever the payload changes.
struct BlockHeader {
  std::uint8_t format = 1;  ///< layout version of this struct and the payload
  std::uint8_t k_bits = 0, v_bits = 0;
  std::uint8_t flags = 0;   ///< bit 0: keys per-channel; bit 1 / bit 2: keyframe K / V interval stored in delta mode (else plain)
  std::uint16_t k_group = 0, v_group = 0;
  std::uint16_t head_dim = 0;
  std::uint16_t count = 0;  ///< tokens stored (<= BlockTokens)
  std::uint32_t version = 0;
};
static_assert(sizeof(BlockHeader) == 16, "BlockHeader must stay 16 bytes");

/// Byte offsets and sizes of one block's payload for a (K codec, V codec, key axis, B, D) choice.
struct BlockLayout {
  int tokens = 0;                 ///< B
  int head_dim = 0;               ///< D
  bool k_per_channel = false;
  int k_group = 1;                ///< key group size (tokens per group when per-channel)
  std::size_t k_row = 0, v_row = 0;            ///< code bytes per token row
  std::size_t k_meta_token = 0;                ///< per-token key metadata bytes per token (0 if per-channel)
  std::size_t k_meta_group = 0;                ///< per-channel key metadata bytes per token group
  std::size_t v_meta_token = 0;                ///< value metadata bytes per token
  std::size_t k_codes = 0, k_meta = 0, v_codes = 0, v_meta = 0, positions = 0;  ///< offsets
  std::size_t bytes = 0;                       ///< payload size of a full block
  /// Keyframe codecs only (else 0): bytes of the keyframe row and of one delta row of K / V.
  std::size_t k_kf_row = 0, k_delta_row = 0, v_kf_row = 0, v_delta_row = 0;

  /// Payload bytes actually used by `count` tokens (per-channel metadata counted per full group).
  [[nodiscard]] std::size_t used_bytes(int count) const noexcept {
    const auto n = static_cast<std::size_t>(count);
    const std::size_t kmeta = k_per_channel ? (n / static_cast<std::size_t>(k_group)) * k_meta_group : n * k_meta_token;
    auto stream = [n](std::size_t kf, std::size_t delta) { return n == 0 ? 0 : kf + (n - 1) * delta; };
    return n * (k_row + v_row + v_meta_token + sizeof(std::int32_t)) + kmeta + stream(k_kf_row, k_delta_row) +
           stream(v_kf_row, v_delta_row);
  }
};

/// Computes the layout of a block of `tokens` tokens with head_dim `head_dim`. A keyframe codec
/// needs tokens == its interval (checked by KVCache at compile time).
template <CacheCodec KC, CacheCodec VC, bool KPerChannel>
[[nodiscard]] BlockLayout make_block_layout(int tokens, int head_dim) noexcept {
  BlockLayout L;
  const auto B = static_cast<std::size_t>(tokens);
  const auto D = static_cast<std::size_t>(head_dim);
  L.tokens = tokens;
  L.head_dim = head_dim;
  L.k_per_channel = KPerChannel;
  L.k_group = KC::group_size;
  std::size_t k_stream = 0, v_stream = 0;  // keyframe codecs: interval stream bytes
  if constexpr (is_keyframe_codec_v<KC>) {
    L.k_kf_row = KC::keyframe_bytes(D);
    L.k_delta_row = KC::delta_bytes(D);
    k_stream = KC::used_bytes(B, D);
  } else {
    L.k_row = KC::code_bytes(D);
    if constexpr (KPerChannel) {
      L.k_meta_group = D * static_cast<std::size_t>(KC::meta_bytes_per_group);
    } else {
      L.k_meta_token = row_meta_bytes<KC>(D);
    }
  }
  if constexpr (is_keyframe_codec_v<VC>) {
    L.v_kf_row = VC::keyframe_bytes(D);
    L.v_delta_row = VC::delta_bytes(D);
    v_stream = VC::used_bytes(B, D);
  } else {
    L.v_row = VC::code_bytes(D);
    L.v_meta_token = row_meta_bytes<VC>(D);
  }
  L.k_codes = 0;
  L.k_meta = L.k_codes + B * L.k_row + k_stream;
  const std::size_t k_meta_bytes = KPerChannel ? (B / static_cast<std::size_t>(KC::group_size)) * L.k_meta_group
                                               : B * L.k_meta_token;
  L.v_codes = L.k_meta + k_meta_bytes;
  L.v_meta = L.v_codes + B * L.v_row + v_stream;
  L.positions = L.v_meta + B * L.v_meta_token;
  L.bytes = L.positions + B * sizeof(std::int32_t);
  return L;
}

/// One allocated block: its header and owned payload bytes (BlockLayout::bytes, zeroed).
struct Block {
  BlockHeader header;
  std::unique_ptr<std::byte[]> data;
};

}  // namespace kvpack
