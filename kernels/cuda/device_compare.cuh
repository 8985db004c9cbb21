// Byte-wise comparison of a kvpack::cuda::DeviceCache with the host KVCache it mirrors (tests and
// debugging: proves the device quantizer bit-identical to the host, CASES C4/C12). Included at
// the end of kernels/cuda/device_cache.cuh; synchronous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvpack/result.hpp"

namespace kvpack::cuda {

namespace device_detail {
/// Which part of a block byte i of the payload belongs to.
[[nodiscard]] inline const char* block_section(const BlockLayout& L, std::size_t i) noexcept {
  return i < L.k_meta ? "K codes" : i < L.v_codes ? "K metadata" : i < L.v_meta ? "V codes" : i < L.positions ? "V metadata" : "positions";
}
}  // namespace device_detail

/// Every block of `dev` equals the host cache's byte for byte (codes, metadata, positions, and
/// unused slots, zero on both sides), and the validity bits equal the host's token counts. OK, or
/// Errc::corrupt_data naming the first difference (layer, KV head, block, byte and section).
template <class HostCache>
Status compare_device_blocks(const DeviceCache<HostCache>& dev, const HostCache& host) {
  const ModelShape& shape = dev.shape();
  const BlockLayout& L = dev.layout();
  for (int l = 0; l < shape.layers; ++l) {
    for (int h = 0; h < shape.kv_heads; ++h) {
      const std::span<const Block> blocks = host.blocks(l, h);
      const std::string at = "DeviceCache::compare: layer " + std::to_string(l) + " kv head " + std::to_string(h);
      if (static_cast<int>(blocks.size()) != dev.blocks_in_use(l))
        return fail(Errc::corrupt_data, at + ": host has " + std::to_string(blocks.size()) + " blocks, device " +
                                            std::to_string(dev.blocks_in_use(l)));
      for (std::size_t b = 0; b < blocks.size(); ++b) {
        auto bytes = dev.block_bytes(l, h, static_cast<int>(b));
        if (!bytes) return bytes.error();
        for (std::size_t i = 0; i < L.bytes; ++i)
          if ((*bytes)[i] != blocks[b].data[i])
            return fail(Errc::corrupt_data, at + " block " + std::to_string(b) + " byte " + std::to_string(i) + " (" +
                                                device_detail::block_section(L, i) + ") differs: host " +
                                                std::to_string(static_cast<int>(blocks[b].data[i])) + ", device " +
                                                std::to_string(static_cast<int>((*bytes)[i])));
        auto words = dev.valid_words(l, h, static_cast<int>(b));
        if (!words) return words.error();
        for (int t = 0; t < HostCache::block_tokens; ++t) {
          const bool bit = ((*words)[static_cast<std::size_t>(t / 64)] >> (t % 64)) & 1u;
          if (bit != (t < blocks[b].header.count))
            return fail(Errc::corrupt_data, at + " block " + std::to_string(b) + " slot " + std::to_string(t) +
                                                ": validity bit differs from the host count");
        }
      }
    }
  }
  return {};
}

}  // namespace kvpack::cuda
