// Out-of-line members of kvpack::cuda::DeviceCache that move data between host and device:
// upload (host blocks copied as bytes), set_valid, block_bytes, valid_words, check (the device's
// error state), the decode argument check; and the byte-wise comparison with the host KVCache
// it mirrors (tests and debugging: proves the device quantizer bit-identical to the host, CASES
// C4/C12). Included at the end of kernels/cuda/device_cache.cuh; all synchronous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <algorithm>
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
/// unused slots, zero on both sides; a PreRope host keeps positions per layer, and the device's
/// slot positions must equal them), and the validity bits equal the host's token counts. OK, or
/// Errc::corrupt_data naming the first difference (layer, KV head, block, byte and section).
template <class HostCache>
Status compare_device_blocks(const DeviceCache<HostCache>& dev, const HostCache& host) {
  const ModelShape& shape = dev.shape();
  const BlockLayout& L = dev.layout();
  const std::size_t host_bytes = host.block_layout().bytes;  // L.bytes, or L.positions when only the device stores them
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
        for (std::size_t i = 0; i < host_bytes; ++i)
          if ((*bytes)[i] != blocks[b].data[i])
            return fail(Errc::corrupt_data, at + " block " + std::to_string(b) + " byte " + std::to_string(i) + " (" +
                                                device_detail::block_section(L, i) + ") differs: host " +
                                                std::to_string(static_cast<int>(blocks[b].data[i])) + ", device " +
                                                std::to_string(static_cast<int>((*bytes)[i])));
        if constexpr (!HostCache::slot_positions && DeviceCache<HostCache>::slot_positions)
          for (int t = 0; t < HostCache::block_tokens; ++t) {
            std::int32_t p;
            std::memcpy(&p, bytes->data() + L.positions + static_cast<std::size_t>(t) * sizeof p, sizeof p);
            const std::int32_t want = t < blocks[b].header.count ? host.block_positions(l).at(static_cast<std::int64_t>(b) * HostCache::block_tokens + t) : 0;
            if (p != want)
              return fail(Errc::corrupt_data, at + " block " + std::to_string(b) + " slot " + std::to_string(t) +
                                                  ": device position " + std::to_string(p) + ", host " + std::to_string(want));
          }
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

template <class HostCache>
Status DeviceCache<HostCache>::upload(const HostCache& host) {
  static_assert(!HostCache::evicts, "DeviceCache::upload: eviction caches keep private slot masks; use set_valid");
  KVPACK_CUDA_ON_DEVICE(device_);
  const ModelShape& hs = host.shape();
  if (hs.layers != shape_.layers || hs.kv_heads != shape_.kv_heads || hs.q_heads != shape_.q_heads ||
      hs.head_dim != shape_.head_dim)
    return fail(Errc::invalid_argument, "DeviceCache::upload: the host cache has another shape");
  if constexpr (pre_rope)
    if (Status s = check_rope_upload(host, shape_, rope_.view().positions); !s) return s;
  std::vector<std::uint64_t> words(static_cast<std::size_t>(shape_.kv_heads) * static_cast<std::size_t>(max_blocks_) *
                                   static_cast<std::size_t>(words_));
  // A PreRope host keeps positions per layer; the device block ends with them (slot_positions).
  const std::size_t host_bytes = host.block_layout().bytes;
  std::vector<std::int32_t> tail(slot_positions && !HostCache::slot_positions ? static_cast<std::size_t>(block_tokens) : 0);
  for (int l = 0; l < shape_.layers; ++l) {
    std::fill(words.begin(), words.end(), 0);
    KVPACK_CUDA_TRY(cudaMemsetAsync(layer_data(l), 0, layer_bytes(), stream_));
    std::int64_t n_tokens = 0;
    for (int h = 0; h < shape_.kv_heads; ++h) {
      const std::span<const Block> blocks = host.blocks(l, h);
      if (blocks.size() > static_cast<std::size_t>(max_blocks_))
        return fail(Errc::capacity_exceeded, "DeviceCache::upload: layer " + std::to_string(l) + " holds " +
                                                 std::to_string(blocks.size()) + " blocks, more than " +
                                                 std::to_string(max_blocks_));
      std::int64_t head_tokens = 0;
      for (std::size_t b = 0; b < blocks.size(); ++b) {
        KVPACK_CUDA_TRY(cudaMemcpyAsync(block_ptr(l, h, static_cast<int>(b)), blocks[b].data.get(), host_bytes,
                                        cudaMemcpyHostToDevice, stream_));
        const int count = blocks[b].header.count;
        if (!tail.empty()) {
          for (int t = 0; t < block_tokens; ++t)
            tail[static_cast<std::size_t>(t)] = t < count ? host.block_positions(l).at(static_cast<std::int64_t>(b) * block_tokens + t) : 0;
          KVPACK_CUDA_TRY(cudaMemcpyAsync(block_ptr(l, h, static_cast<int>(b)) + layout_.positions, tail.data(),
                                          tail.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
          KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));  // `tail` is reused for the next block
        }
        for (int t = 0; t < count; ++t)
          words[(static_cast<std::size_t>(h) * static_cast<std::size_t>(max_blocks_) + b) * static_cast<std::size_t>(words_) +
                static_cast<std::size_t>(t / 64)] |= std::uint64_t{1} << (t % 64);
        head_tokens = static_cast<std::int64_t>(b) * block_tokens + count;
      }
      n_tokens = std::max(n_tokens, head_tokens);
    }
    KVPACK_CUDA_TRY(cudaMemcpyAsync(layer_valid(l), words.data(), words.size() * sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, stream_));
    tokens_[static_cast<std::size_t>(l)] = n_tokens;
    KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));  // `words` is reused for the next layer
  }
  KVPACK_CUDA_TRY(cudaMemcpyAsync(counts_.get(), tokens_.data(), tokens_.size() * sizeof(std::int64_t),
                                  cudaMemcpyHostToDevice, stream_));
  KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
  return {};
}

template <class HostCache>
Status DeviceCache<HostCache>::set_valid(int layer, int kv_head, int block, std::span<const std::uint64_t> words) {
  if (!in_range(layer, kv_head, block) || words.size() != static_cast<std::size_t>(words_))
    return fail(Errc::invalid_argument, "DeviceCache::set_valid: layer, kv_head, block or word count out of range");
  KVPACK_CUDA_ON_DEVICE(device_);
  KVPACK_CUDA_TRY(cudaMemcpyAsync(valid_ptr(layer, kv_head, block), words.data(), words.size() * sizeof(std::uint64_t),
                                  cudaMemcpyHostToDevice, stream_));
  KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
  return {};
}

template <class HostCache>
Result<std::vector<std::byte>> DeviceCache<HostCache>::block_bytes(int layer, int kv_head, int block) const {
  if (!in_range(layer, kv_head, block))
    return fail(Errc::invalid_argument, "DeviceCache::block_bytes: layer, kv_head or block out of range");
  KVPACK_CUDA_ON_DEVICE(device_);
  std::vector<std::byte> out(layout_.bytes);
  KVPACK_CUDA_TRY(cudaMemcpyAsync(out.data(), block_ptr(layer, kv_head, block), out.size(), cudaMemcpyDeviceToHost,
                                  stream_));
  KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
  return out;
}

template <class HostCache>
Result<std::vector<std::uint64_t>> DeviceCache<HostCache>::valid_words(int layer, int kv_head, int block) const {
  if (!in_range(layer, kv_head, block))
    return fail(Errc::invalid_argument, "DeviceCache::valid_words: layer, kv_head or block out of range");
  KVPACK_CUDA_ON_DEVICE(device_);
  std::vector<std::uint64_t> out(static_cast<std::size_t>(words_));
  KVPACK_CUDA_TRY(cudaMemcpyAsync(out.data(), valid_ptr(layer, kv_head, block), out.size() * sizeof(std::uint64_t),
                                  cudaMemcpyDeviceToHost, stream_));
  KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
  return out;
}

template <class HostCache>
Status DeviceCache<HostCache>::check() {
  KVPACK_CUDA_ON_DEVICE(device_);
  DeviceStatus st{};
  KVPACK_CUDA_TRY(cudaMemcpyAsync(&st, status_.get(), sizeof st, cudaMemcpyDeviceToHost, stream_));
  KVPACK_CUDA_TRY(cudaMemcpyAsync(tokens_.data(), counts_.get(), tokens_.size() * sizeof(std::int64_t),
                                  cudaMemcpyDeviceToHost, stream_));
  KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
  KVPACK_CUDA_TRY(cudaGetLastError());
  if (st.code == kStatusOk) return {};
  KVPACK_CUDA_TRY(cudaMemsetAsync(&static_cast<DeviceStatus*>(status_.get())->code, 0, sizeof(int), stream_));
  KVPACK_CUDA_TRY(cudaStreamSynchronize(stream_));
  return append_error(st, shape_.kv_heads, shape_.head_dim, shape_.max_tokens);
}

template <class HostCache>
Status DeviceCache<HostCache>::check_decode(int layer, const float* d_q, const float* d_out, const DeviceRows& exact) const {
  if (layer < 0 || layer >= shape_.layers)
    return fail(Errc::invalid_argument, "DeviceCache::decode: layer " + std::to_string(layer) + " out of range");
  if (!d_q || !d_out || exact.count < 0 || (exact.count > 0 && (!exact.k || !exact.v)))
    return fail(Errc::invalid_argument, "DeviceCache::decode: null buffer or negative exact row count");
  return {};
}

}  // namespace kvpack::cuda
