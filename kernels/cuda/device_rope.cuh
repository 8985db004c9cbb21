// The RoPE half of a kvpack::cuda::DeviceCache over a PreRope<OriginalPositions> host cache
// (policy.hpp; the host side is cache/rope_state.hpp and kernels/rope.hpp): the cos/sin table in
// device memory and the checks of positions. The decode kernel is rope_decode_kernel.cuh; the
// API (DeviceCache::decode with a query position) is in device_cache.cuh.
//
// Table: kernels::RopeTable's floats (angles pos * theta_i and their cos/sin in double, rounded
// to float once: error <= 0.5 ulp of each cos/sin), for positions [0, max_tokens), computed on
// the host and copied to the device once by create(): max_tokens * rope_dims * 4 bytes (128k
// positions of rope_dims 128: 64 MiB). A position outside [0, max_tokens) is an error: appends
// and uploads reject it (Errc::invalid_argument), decode records it for check() (see
// DeviceCache::decode), the kernels clamp it only to keep their reads in bounds.
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/device_rope.cuh uses the CUDA runtime: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <string>
#include <utility>

#include "kvpack/cache/block.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/kernels/cuda/device_memory.cuh"
#include "kvpack/kernels/cuda/rope_decode_kernel.cuh"
#include "kvpack/kernels/rope.hpp"
#include "kvpack/result.hpp"

namespace kvpack::cuda {

/// The RoPE cos/sin table of a PreRope device cache in device memory (see the file comment).
/// Empty (no allocation, view().table == nullptr) for post-RoPE caches. Move-only.
class DeviceRopeTable {
 public:
  /// Table for positions [0, shape.max_tokens) with the shape's rope_base, rope_dims (0 = head_dim)
  /// and pairing, allocated and filled on `stream` (synchronous: the host staging copy is freed
  /// before returning). Errors: invalid RoPE fields (Errc::invalid_argument, validate_rope), host
  /// memory (Errc::out_of_memory), CUDA errors (device_memory.cuh).
  [[nodiscard]] static Result<DeviceRopeTable> create(const ModelShape& shape, cudaStream_t stream) {
    if (Status s = validate_rope(shape); !s) return s.error();
    const int dims = shape.rope_dims > 0 ? shape.rope_dims : shape.head_dim;
    DeviceRopeTable t;
    t.view_.pairs = dims / 2;
    t.view_.neox = shape.rope_neox;
    t.view_.positions = shape.max_tokens;
    if (t.view_.pairs == 0) return Result<DeviceRopeTable>(std::move(t));  // rope_dims 0 of head_dim 0: nothing rotates
    const std::size_t bytes = static_cast<std::size_t>(shape.max_tokens) * 2 * sizeof(float) * static_cast<std::size_t>(t.view_.pairs);
    auto buf = device_alloc(bytes, stream, "DeviceCache RoPE table");
    if (!buf) return buf.error();
    try {
      kernels::RopeTable host(static_cast<double>(shape.rope_base), t.view_.pairs);
      host.ensure(shape.max_tokens);
      KVPACK_CUDA_TRY(cudaMemcpyAsync(buf->get(), host.data(), bytes, cudaMemcpyHostToDevice, stream));
      KVPACK_CUDA_TRY(cudaStreamSynchronize(stream));  // `host` is freed on return
    } catch (const std::bad_alloc&) {
      return fail(Errc::out_of_memory, "DeviceCache::create: no host memory for the RoPE table staging copy (" +
                                           std::to_string(bytes) + " bytes)");
    }
    t.buf_ = std::move(*buf);
    t.view_.table = static_cast<const float*>(t.buf_.get());
    t.bytes_ = bytes;
    return Result<DeviceRopeTable>(std::move(t));
  }

  DeviceRopeTable() = default;
  DeviceRopeTable(DeviceRopeTable&&) noexcept = default;
  DeviceRopeTable& operator=(DeviceRopeTable&&) noexcept = default;

  /// What the kernels read: table pointer, positions (rows), pairs, pairing.
  [[nodiscard]] const RopeTableView& view() const noexcept { return view_; }
  /// Device bytes of the table.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  DeviceBuffer buf_;
  RopeTableView view_;
  std::size_t bytes_ = 0;
};

/// Position of slot t of block b of (layer l, KV head h) in a host cache without eviction: from the
/// payload when its blocks store them (layout L), else from the layer's runs (KVCache::block_positions).
template <class HostCache>
[[nodiscard]] std::int32_t host_slot_position(const HostCache& host, const BlockLayout& L, int l, int h, std::size_t b, int t) {
  if constexpr (HostCache::slot_positions) {
    std::int32_t p;
    std::memcpy(&p, host.blocks(l, h)[b].data.get() + L.positions + static_cast<std::size_t>(t) * sizeof p, sizeof p);
    return p;
  } else {
    (void)L, (void)h;
    return host.block_positions(l).at(static_cast<std::int64_t>(b) * HostCache::block_tokens + t);
  }
}

/// Checks, before an upload changes anything, that a PreRope host cache's RoPE matches the
/// device cache's shape (rope_base, rope_dims, rope_neox: Errc::invalid_argument otherwise) and
/// that every position of its blocks' slots lies in [0, positions) (Errc::invalid_argument naming
/// layer, KV head, block, slot and position).
template <class HostCache>
[[nodiscard]] Status check_rope_upload(const HostCache& host, const ModelShape& dev, std::int64_t positions) {
  const ModelShape& hs = host.shape();
  const int hd = hs.rope_dims > 0 ? hs.rope_dims : hs.head_dim, dd = dev.rope_dims > 0 ? dev.rope_dims : dev.head_dim;
  if (hs.rope_base != dev.rope_base || hd != dd || hs.rope_neox != dev.rope_neox)
    return fail(Errc::invalid_argument, "DeviceCache::upload: the host cache's RoPE (rope_base, rope_dims, rope_neox) "
                                        "differs from the device cache's");
  const BlockLayout L = make_block_layout<typename HostCache::key_codec, typename HostCache::value_codec, false>(
      HostCache::block_tokens, hs.head_dim, HostCache::slot_positions);
  for (int l = 0; l < hs.layers; ++l)
    for (int h = 0; h < hs.kv_heads; ++h) {
      const std::span<const Block> blocks = host.blocks(l, h);
      for (std::size_t b = 0; b < blocks.size(); ++b)
        for (int t = 0; t < blocks[b].header.count; ++t) {
          const std::int32_t p = host_slot_position(host, L, l, h, b, t);
          if (p < 0 || p >= positions)
            return fail(Errc::invalid_argument, "DeviceCache::upload: layer " + std::to_string(l) + " kv head " +
                                                    std::to_string(h) + " block " + std::to_string(b) + " slot " +
                                                    std::to_string(t) + " has RoPE position " + std::to_string(p) +
                                                    ", outside the device table [0, max_tokens = " +
                                                    std::to_string(positions) + ")");
        }
    }
  return {};
}

}  // namespace kvpack::cuda
