// The storage block: BlockTokens tokens of one (layer, kv_head), quantized together.
//
// Byte layout of a block's payload (B = tokens per block, D = head_dim):
//   [K codes   B x code_bytes(D)]            token-major rows (INT4: element 2i in the low nibble)
//   [K meta    per-token:   B x (D/G) x mb]  one scale(+zero) per group of G channels per token
//              per-channel: (B/G) x D x mb]  one scale(+zero) per channel per group of G tokens
//   [V codes   B x code_bytes(D)]
//   [V meta    B x (D/G) x mb]
//   [positions B x int32]                    original token positions, only where slots need their own
//                                            (eviction reuses slots):
//                                            BlockLayout::pos_bytes is 4 there and 0 otherwise, where
//                                            the store keeps one run-length list per layer instead
//                                            (cache/position_runs.hpp; issue 20: 0.25 bits/value at D 64)
// Keyframe codecs (codec/keyframe.hpp) replace a role's [codes][meta] pair by one interval
// stream (block = one interval; its meta region is empty) whose size follows the interval's mode
// (BlockHeader::flags bit 1 for K, bit 2 for V): Keyframe::used_bytes(B, D, delta). So a keyframe
// block's offsets after its K stream, and its payload size, depend on its flags: BlockLayout
// holds the all-plain layout, BlockLayout::at(flags) the layout of one block. Plain intervals
// cost exactly the plain codec's bytes; delta ones keyframe row + B - 1 delta rows.
// A BlockHeader travels beside the payload (format, bits, group sizes, head_dim, count, version)
// so offloaded copies can be checked against the cache's layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvpack/codec/keyframe.hpp"
#include "kvpack/detail/secure_zero.hpp"
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
/// With keyframe codecs the offsets are those of a block whose keyframe roles are plain (flags
/// bits 1 and 2 clear) and `bytes` bounds every block; at(flags) gives one block's own layout.
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
  /// Bytes of stored position per token slot: 4 (an int32 at `positions` + 4 * slot) or 0 (the
  /// payload holds no positions; the store keeps them, see the file comment).
  std::size_t pos_bytes = sizeof(std::int32_t);
  /// Payload size of a full block; with keyframe codecs the largest one (each keyframe role in
  /// its larger mode): what a block is allocated with before its modes are known. at(flags).bytes
  /// is the size of one block.
  std::size_t bytes = 0;
  /// Keyframe codecs only (else 0): bytes of the keyframe row and of one delta row of K / V.
  std::size_t k_kf_row = 0, k_delta_row = 0, v_kf_row = 0, v_delta_row = 0;

  /// Bytes of K codes and metadata of the first `count` tokens of a block with header flags
  /// `flags` (per-channel metadata counted per full group; keyframe K: its stream in the mode of bit 1).
  [[nodiscard]] std::size_t k_bytes(int count, std::uint8_t flags = 0) const noexcept {
    const auto n = static_cast<std::size_t>(count);
    const std::size_t kmeta = k_per_channel ? (n / static_cast<std::size_t>(k_group)) * k_meta_group : n * k_meta_token;
    return n * k_row + kmeta + stream(n, k_kf_row, k_delta_row, (flags & 2u) != 0);
  }
  /// Bytes of V codes and metadata of the first `count` tokens (keyframe V: mode of flags bit 2).
  [[nodiscard]] std::size_t v_bytes(int count, std::uint8_t flags = 0) const noexcept {
    const auto n = static_cast<std::size_t>(count);
    return n * (v_row + v_meta_token) + stream(n, v_kf_row, v_delta_row, (flags & 4u) != 0);
  }
  /// Payload bytes actually used by `count` tokens of a block with header flags `flags`.
  [[nodiscard]] std::size_t used_bytes(int count, std::uint8_t flags = 0) const noexcept {
    return k_bytes(count, flags) + v_bytes(count, flags) + static_cast<std::size_t>(count) * pos_bytes;
  }
  /// The layout of one block whose header has `flags`: keyframe roles in delta mode move what
  /// follows their stream (V, positions) and change `bytes` to the block's own payload size.
  /// Without keyframe codecs, *this.
  [[nodiscard]] BlockLayout at(std::uint8_t flags) const noexcept {
    BlockLayout L = *this;
    const std::size_t B = static_cast<std::size_t>(tokens);
    // Plain streams are the base; a delta stream adds kf_row - delta_row bytes (negative when the
    // keyframe row is the narrower: size_t wraps and wraps back, the sums stay exact).
    const std::size_t k_end = k_meta + stream(B, k_kf_row, k_delta_row, (flags & 2u) != 0) - B * k_delta_row;
    L.k_meta = k_end;
    L.v_codes = v_codes + (k_end - k_meta);
    L.v_meta = L.v_codes + (v_meta - v_codes) + stream(B, v_kf_row, v_delta_row, (flags & 4u) != 0) - B * v_delta_row;
    L.positions = L.v_meta + (positions - v_meta);
    L.bytes = L.positions + B * pos_bytes;
    return L;
  }

 private:
  // Bytes of the first n tokens of a keyframe stream (0 for a row codec: kf = delta = 0).
  [[nodiscard]] static std::size_t stream(std::size_t n, std::size_t kf, std::size_t delta, bool delta_mode) noexcept {
    if (n == 0) return 0;
    return delta_mode ? kf + (n - 1) * delta : n * delta;
  }
};

/// Computes the layout of a block of `tokens` tokens with head_dim `head_dim`; `slot_positions`:
/// whether each token slot stores its int32 position (pos_bytes 4) or the payload holds none
/// (pos_bytes 0). A keyframe codec needs tokens == its interval (checked by KVCache at compile time).
template <CacheCodec KC, CacheCodec VC, bool KPerChannel>
[[nodiscard]] BlockLayout make_block_layout(int tokens, int head_dim, bool slot_positions = true) noexcept {
  BlockLayout L;
  const auto B = static_cast<std::size_t>(tokens);
  const auto D = static_cast<std::size_t>(head_dim);
  L.tokens = tokens;
  L.head_dim = head_dim;
  L.k_per_channel = KPerChannel;
  L.k_group = KC::group_size;
  L.pos_bytes = slot_positions ? sizeof(std::int32_t) : 0;
  std::size_t k_stream = 0, v_stream = 0;  // keyframe codecs: interval stream bytes in plain mode
  std::size_t delta_extra = 0;             // the most delta-mode keyframe streams add to a block
  if constexpr (is_keyframe_codec_v<KC>) {
    L.k_kf_row = KC::keyframe_bytes(D);
    L.k_delta_row = KC::delta_bytes(D);
    k_stream = KC::used_bytes(B, D, false);
    delta_extra += KC::max_used_bytes(B, D) - k_stream;
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
    v_stream = VC::used_bytes(B, D, false);
    delta_extra += VC::max_used_bytes(B, D) - v_stream;
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
  L.bytes = L.positions + B * L.pos_bytes + delta_extra;
  return L;
}

/// One allocated block: its header and owned payload bytes (zeroed when allocated). Its used
/// payload is BlockLayout::used_bytes(header.count, header.flags) bytes.
struct Block {
  BlockHeader header;
  std::unique_ptr<std::byte[]> data;
  std::size_t bytes = 0;  ///< bytes allocated at `data` (BlockLayout::bytes, or a keyframe block's own size)
};

/// Zeroes slots [from, to) of a block payload `d` of layout L (a pool page, a low-tier block):
/// codes, metadata (per-channel key metadata by whole groups only: a range inside one group keeps
/// the group's metadata) and positions (if stored).
inline void zero_slots(const BlockLayout& L, std::byte* d, std::size_t from, std::size_t to) noexcept {
  const std::size_t n = to - from;
  detail::secure_zero(d + L.k_codes + from * L.k_row, n * L.k_row);
  if (L.k_per_channel) {
    const auto G = static_cast<std::size_t>(L.k_group);
    detail::secure_zero(d + L.k_meta + from / G * L.k_meta_group, n / G * L.k_meta_group);
  } else {
    detail::secure_zero(d + L.k_meta + from * L.k_meta_token, n * L.k_meta_token);
  }
  detail::secure_zero(d + L.v_codes + from * L.v_row, n * L.v_row);
  detail::secure_zero(d + L.v_meta + from * L.v_meta_token, n * L.v_meta_token);
  detail::secure_zero(d + L.positions + from * L.pos_bytes, n * L.pos_bytes);
}

}  // namespace kvpack
