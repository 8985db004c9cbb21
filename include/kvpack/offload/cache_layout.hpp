// Bridge from the core's block storage (include/kvpack/cache/block.hpp) to the offload layer:
// the codec format id that goes into every record header, and the offload BlockLayout of a
// KVCache type. Header-only; needs no libsodium by itself.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/offload/block_header.hpp"

namespace kvpack::offload {

/// 16-bit description of one codec, stable across builds (it is stored in record headers):
///   bits 0-3  family: 1 fp32/fp16 (ungrouped), 2 integer, 3 FP8 E4M3FN, 4 FP8 E5M2
///   bit  4    asymmetric (zero-point stored)
///   bits 5-7  metadata bytes per group scalar: 0 none, 2 fp16, 4 fp32
///   bits 8-13 bits per code (4, 8, 16, 32)
/// The group size is a separate header field.
template <class C>
[[nodiscard]] constexpr uint16_t codec_descriptor() noexcept {
  uint16_t family = 0, asym = 0, meta = 0;
  if constexpr (!C::grouped) {
    family = 1;
  } else {
    if constexpr (requires { typename C::format; }) {
      family = std::is_same_v<typename C::format, E4M3> ? 3 : std::is_same_v<typename C::format, E5M2> ? 4 : 15;
    } else {
      family = 2;
    }
    asym = C::asymmetric ? 1 : 0;
    meta = static_cast<uint16_t>(C::meta_bytes_per_group / (C::asymmetric ? 2 : 1));
  }
  return static_cast<uint16_t>(family | (asym << 4) | (meta << 5) | (static_cast<uint16_t>(C::bits) << 8));
}

/// Codec format id of a (key codec, value codec) pair: key descriptor in the low 16 bits,
/// value descriptor in the high 16 bits.
template <class KeyCodec, class ValueCodec>
[[nodiscard]] constexpr uint32_t codec_format_id() noexcept {
  return static_cast<uint32_t>(codec_descriptor<KeyCodec>()) |
         (static_cast<uint32_t>(codec_descriptor<ValueCodec>()) << 16);
}

/// The offload layout of `cache`'s blocks (a kvpack::KVCache<...>): codec id, K/V bits and group
/// sizes, key axis, head_dim, Blocks<B>, and the payload size of a full block
/// (kvpack::BlockLayout::bytes: codes, metadata and positions of one (layer, kv_head) block).
template <class Cache>
[[nodiscard]] BlockLayout layout_for(const Cache& cache) noexcept {
  using KC = typename Cache::key_codec;
  using VC = typename Cache::value_codec;
  BlockLayout l;
  l.codec_format = codec_format_id<KC, VC>();
  l.k_bits = static_cast<uint8_t>(KC::bits);
  l.v_bits = static_cast<uint8_t>(VC::bits);
  l.flags = Cache::keys_per_channel ? 1 : 0;
  l.k_group = static_cast<uint16_t>(KC::group_size);
  l.v_group = static_cast<uint16_t>(VC::group_size);
  l.head_dim = static_cast<uint16_t>(cache.shape().head_dim);
  l.block_tokens = static_cast<uint16_t>(Cache::block_tokens);
  l.max_payload_bytes = static_cast<uint32_t>(cache.block_layout().bytes);
  return l;
}

}  // namespace kvpack::offload
