// Bridge from the core's block storage (include/kvpack/cache/block.hpp) to the offload layer:
// the codec format id that goes into every record header, and the offload RecordLayout of a
// KVCache type. Header-only; needs no libsodium by itself.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kvpack/cache/block.hpp"
#include "kvpack/cache/rope_state.hpp"
#include "kvpack/codec/format_id.hpp"
#include "kvpack/offload/block_header.hpp"

namespace kvpack::offload {

using kvpack::codec_descriptor;
using kvpack::codec_format_id;

/// The offload layout of `cache`'s blocks (a kvpack::KVCache<...>), as its codec hook states it
/// (Cache::codec_hook::format_id() and the block header it stamps: K/V bits, group sizes, key
/// axis), with head_dim, Blocks<B>, and the payload size of a full block (kvpack::BlockLayout::
/// bytes: codes, metadata and positions of one (layer, kv_head) block).
template <class Cache>
[[nodiscard]] RecordLayout layout_for(const Cache& cache) noexcept {
  using Codec = typename Cache::codec_hook;
  const kvpack::BlockHeader h = Codec::header(cache.shape().head_dim);
  RecordLayout l;
  l.codec_format = Codec::format_id();
  l.k_bits = h.k_bits;
  l.v_bits = h.v_bits;
  // Keys before RoPE are another basis: such records never open in a post-RoPE cache (page keys
  // hash the layout, headers must match it).
  l.flags = static_cast<uint8_t>(h.flags | (kvpack::takes_pre_rope_v<Cache> ? 2 : 0));
  l.k_group = h.k_group;
  l.v_group = h.v_group;
  l.head_dim = h.head_dim;
  l.block_tokens = static_cast<uint16_t>(Cache::block_tokens);
  l.max_payload_bytes = static_cast<uint32_t>(cache.block_layout().bytes);
  return l;
}

/// The RecordLayout of a shared prefix page (RemotePrefixShare, RemotePoolPrefixShare):
/// layout_for(cache) with the payload of a block plus an int32 position per slot. Blocks that
/// hold none (PagedCache pages, KVCache::slot_positions false) add them from their position runs,
/// so caches and pools of one policy address and open the same records.
template <class Cache>
[[nodiscard]] RecordLayout prefix_layout_for(const Cache& cache) noexcept {
  RecordLayout l = layout_for(cache);
  const kvpack::BlockLayout& b = cache.block_layout();
  if (b.pos_bytes == 0) l.max_payload_bytes = static_cast<uint32_t>(b.bytes + static_cast<std::size_t>(b.tokens) * 4);
  return l;
}

}  // namespace kvpack::offload
