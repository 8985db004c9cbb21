// Shared structures and the append path of kvpack's CUDA kernels over its block layout
// (include/kvpack/cache/block.hpp); the decode kernels are in kernels/cuda/decode_kernel.cuh.
//
//  * append_kernel: the device quantizer. One thread quantizes one group (G values of one token,
//    one KV head, K or V) with helpers.cuh quantize_group, so codes and metadata are
//    bit-identical to the host encode_row (CASES C4), writes the position and sets the slot's
//    validity bit. The first slot is the layer's token count in device memory; commit_kernel
//    advances it afterwards, so an append is enqueued without the host knowing the count.
//  * scan_non_finite_kernel: index of the first NaN/Inf of K and of V (append rejects them:
//    append_kernel then writes nothing and records the error in DeviceStatus, read by the host
//    only when the caller asks, DeviceCache::check).
//
// Per-token keys only (per-channel/KIVI keys are not implemented on the device); grouped codecs
// only (Int8, Int4, Fp8E4M3, Fp8E5M2). The host API is kernels/cuda/device_cache.cuh.
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/attention.cuh contains CUDA kernels: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kvpack/kernels/cuda/decode_plan.cuh"
#include "kvpack/kernels/cuda/helpers.cuh"
#include "kvpack/cache/block.hpp"
#include "kvpack/result.hpp"

namespace kvpack::cuda {

inline constexpr int kMaxHeadDim = 256;  ///< largest head_dim of the device kernels

/// One layer's blocks in device memory. Block b of KV head h starts at
/// data + (h * max_blocks + b) * block_stride and holds BlockLayout's payload (offsets below, in
/// bytes); its validity words (bit t of word t / 64 = slot t holds a token) are at
/// valid + (h * max_blocks + b) * words.
struct DeviceBlocks {
  std::uint8_t* data = nullptr;
  std::uint64_t* valid = nullptr;
  std::int64_t block_stride = 0;  ///< bytes between consecutive blocks (>= BlockLayout::bytes, 256-aligned)
  int max_blocks = 0;             ///< block slots per KV head
  int words = 0;                  ///< validity words per block, (B + 63) / 64
  std::int64_t k_codes = 0, k_meta = 0, v_codes = 0, v_meta = 0, positions = 0;  ///< BlockLayout offsets (positions -1: none stored)
  std::int64_t k_row = 0, v_row = 0, k_meta_token = 0, v_meta_token = 0;         ///< bytes per token
};

/// Full-precision rows read exactly by the decode kernel after the blocks (sinks, the residual
/// window, the current token): row t of KV head h at k + t * stride + h * head_dim (floats).
struct DeviceRows {
  const float* k = nullptr;
  const float* v = nullptr;
  std::int64_t stride = 0;  ///< floats between consecutive rows (kv_heads * head_dim when packed)
  int count = 0;            ///< rows
  /// PreRope caches only (required there when count > 0): device [count] int32, the RoPE position
  /// of each row, in [0, max_tokens) (device_rope.cuh). Ignored by post-RoPE caches.
  const std::int32_t* pos = nullptr;
};

/// Arguments of one decode launch (one layer, one query token).
struct DecodeArgs {
  DeviceBlocks blocks;
  const std::int64_t* tokens = nullptr;  ///< device: tokens in the layer's blocks (read by the kernel)
  DeviceRows exact;            ///< fp32 rows after the blocks
  const float* q = nullptr;    ///< [q_heads][head_dim], query head h*group + j uses KV head h
  int group = 1, kv_heads = 0;
  float scale = 1.f;           ///< softmax scale applied to q . k
  int n_splits = 1;            ///< gridDim.y: split-K partitions (tiles are divided among them on the device)
  DecodeSmem smem;             ///< dynamic shared-memory layout (decode_smem)
  float* part_m = nullptr;     ///< [q_heads][n_splits]
  float* part_l = nullptr;     ///< [q_heads][n_splits]
  float* part_acc = nullptr;   ///< [q_heads][n_splits][head_dim]
};

/// Error state of a DeviceCache in device memory: sticky like a CUDA error; while `code` is not
/// ok every later append is skipped on the device. Read and cleared by DeviceCache::check().
struct DeviceStatus {
  /// Scratch of the current append: first non-finite index of K, V, and (PreRope caches) first
  /// token whose position is outside the RoPE table (~0 = none).
  unsigned long long first_bad[3];
  int code;                         ///< 0 ok, 1 non-finite input, 2 capacity exceeded, 3 RoPE position
  int layer;                        ///< layer of the failing append (or decode)
  /// non-finite: index into [n][kv_heads][head_dim]; which = K (0) or V (1). Position: the row
  /// (token of the chunk, exact row, 0 for the query); which = appended token (2), decode query
  /// (3), exact row (4); `value` the position.
  long long index;
  int which;
  long long first, n;               ///< tokens before the failing append, and its token count
  long long value;                  ///< the offending RoPE position (code 3)
};
inline constexpr int kStatusOk = 0, kStatusNonFinite = 1, kStatusCapacity = 2, kStatusPosition = 3;

/// The kvpack error for a recorded device status (code != kStatusOk) of a cache with this shape.
[[nodiscard]] inline Error append_error(const DeviceStatus& st, int kv_heads, int head_dim, std::int64_t max_tokens) {
  const std::string at = "DeviceCache::append (layer " + std::to_string(st.layer) + ", " + std::to_string(st.n) +
                         " tokens after " + std::to_string(st.first) + "): ";
  const std::string tail = "; nothing was appended from this append on until this check";
  if (st.code == kStatusPosition) {
    const std::string what = st.which == 2 ? at + "token " + std::to_string(st.index) + " of the chunk has"
                             : "DeviceCache::decode (layer " + std::to_string(st.layer) + "): " +
                                   (st.which == 3 ? std::string("the query has") : "exact row " + std::to_string(st.index) + " has");
    return fail(Errc::invalid_argument, what + " RoPE position " + std::to_string(st.value) +
                                            ", outside the device table [0, max_tokens = " + std::to_string(max_tokens) +
                                            ")" + (st.which == 2 ? tail : "; that decode's output is unspecified"));
  }
  if (st.code == kStatusCapacity)
    return fail(Errc::capacity_exceeded, at + "more than max_tokens = " + std::to_string(max_tokens) + tail);
  const auto row = static_cast<unsigned long long>(kv_heads) * static_cast<unsigned long long>(head_dim);
  const auto D = static_cast<unsigned long long>(head_dim);
  const auto bad = static_cast<unsigned long long>(st.index);
  return fail(Errc::non_finite, at + "non-finite " + (st.which == 0 ? "K" : "V") + " value at kv head " +
                                    std::to_string((bad % row) / D) + ", token " + std::to_string(bad / row) +
                                    " of the chunk, channel " + std::to_string(bad % D) + tail);
}

/// Device view of one layer's blocks laid out by L (block_stride bytes apart, `words` validity
/// words per block).
[[nodiscard]] inline DeviceBlocks make_device_blocks(const BlockLayout& L, std::uint8_t* data, std::uint64_t* valid,
                                                     std::int64_t block_stride, int max_blocks, int words) noexcept {
  DeviceBlocks d;
  d.data = data;
  d.valid = valid;
  d.block_stride = block_stride;
  d.max_blocks = max_blocks;
  d.words = words;
  d.k_codes = static_cast<std::int64_t>(L.k_codes), d.k_meta = static_cast<std::int64_t>(L.k_meta);
  d.v_codes = static_cast<std::int64_t>(L.v_codes), d.v_meta = static_cast<std::int64_t>(L.v_meta);
  d.positions = L.pos_bytes ? static_cast<std::int64_t>(L.positions) : -1;
  d.k_row = static_cast<std::int64_t>(L.k_row), d.v_row = static_cast<std::int64_t>(L.v_row);
  d.k_meta_token = static_cast<std::int64_t>(L.k_meta_token), d.v_meta_token = static_cast<std::int64_t>(L.v_meta_token);
  return d;
}

namespace device_detail {

__device__ inline float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, off));
  return x;
}
__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, off);
  return x;
}

/// 16-byte asynchronous global -> shared copy (sm_80+, bypassing L1) and its group fences.
__device__ inline void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until at most the most recently committed group is still pending.
__device__ inline void cp_async_wait_all_but_last() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ inline void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
/// Waits until at most N of the most recently committed groups are still pending.
template <int N>
__device__ inline void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace device_detail

/// Arguments of one append launch: n tokens of K and V ([n][kv_heads][head_dim] fp32, device)
/// and positions ([n] int32) written to slots first_slot .. first_slot + n - 1 of every KV head.
struct AppendArgs {
  DeviceBlocks blocks;
  const float* k = nullptr;
  const float* v = nullptr;
  const std::int32_t* positions = nullptr;
  std::int64_t n = 0;
  std::int64_t* tokens = nullptr;   ///< device: the layer's token count = the first slot written
  DeviceStatus* status = nullptr;   ///< device: sticky error state (see DeviceStatus)
  std::int64_t capacity = 0;        ///< slots per KV head (min(max_tokens, max_blocks * B))
  int layer = 0, kv_heads = 0, head_dim = 0;
};

/// The device quantizer: one thread per (token, KV head, K-or-V group); grid-stride loop.
template <class KC, class VC, int B>
__global__ void append_kernel(const AppendArgs a) {
  using DK = DeviceCodec<KC>;
  using DV = DeviceCodec<VC>;
  const int D = a.head_dim;
  const int gk = D / DK::group, gv = D / DV::group;
  const std::int64_t per = gk + gv;
  const std::int64_t total = a.n * a.kv_heads * per;
  // Every thread decides the same: nothing is written when this or an earlier append failed.
  const std::int64_t first = *a.tokens;
  const bool bad_k = a.status->first_bad[0] != ~0ull, bad_v = a.status->first_bad[1] != ~0ull;
  const bool bad_p = a.status->first_bad[2] != ~0ull;  // set by scan_positions_kernel (PreRope only)
  const bool full = first + a.n > a.capacity;
  if (a.status->code != kStatusOk || bad_k || bad_v || bad_p || full) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && a.status->code == kStatusOk) {
      a.status->code = bad_k || bad_v ? kStatusNonFinite : (bad_p ? kStatusPosition : kStatusCapacity);
      a.status->layer = a.layer;
      a.status->which = bad_k ? 0 : (bad_v ? 1 : 2);
      a.status->index = static_cast<long long>(bad_k ? a.status->first_bad[0]
                                                     : (bad_v ? a.status->first_bad[1] : a.status->first_bad[2]));
      if (!bad_k && !bad_v && bad_p) a.status->value = a.positions[a.status->first_bad[2]];
      a.status->first = first;
      a.status->n = a.n;
    }
    return;
  }
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t th = i / per;
    const int r = static_cast<int>(i % per);
    const std::int64_t t = th / a.kv_heads;
    const int h = static_cast<int>(th % a.kv_heads);
    const std::int64_t slot = first + t;
    const std::int64_t b = slot / B;
    const std::int64_t off = slot % B;
    const std::int64_t bi = static_cast<std::int64_t>(h) * a.blocks.max_blocks + b;
    std::uint8_t* blk = a.blocks.data + bi * a.blocks.block_stride;
    const std::int64_t src = (t * a.kv_heads + h) * D;
    if (r < gk) {
      quantize_group<DK>(a.k + src + r * DK::group, 1, blk + a.blocks.k_codes + off * a.blocks.k_row + r * DK::group * DK::bits / 8,
                         blk + a.blocks.k_meta + off * a.blocks.k_meta_token + r * DK::meta_bytes);
      if (r == 0) {
        if (a.blocks.positions >= 0) {  // the host layout's slot positions (KVCache::slot_positions)
          const auto pos = static_cast<std::uint32_t>(a.positions[t]);
          std::uint8_t* pp = blk + a.blocks.positions + off * 4;
          pp[0] = static_cast<std::uint8_t>(pos);
          pp[1] = static_cast<std::uint8_t>(pos >> 8);
          pp[2] = static_cast<std::uint8_t>(pos >> 16);
          pp[3] = static_cast<std::uint8_t>(pos >> 24);
        }
        auto* word = reinterpret_cast<unsigned long long*>(a.blocks.valid + bi * a.blocks.words + off / 64);
        atomicOr(word, 1ull << (off % 64));
      }
    } else {
      const int g = r - gk;
      quantize_group<DV>(a.v + src + g * DV::group, 1, blk + a.blocks.v_codes + off * a.blocks.v_row + g * DV::group * DV::bits / 8,
                         blk + a.blocks.v_meta + off * a.blocks.v_meta_token + g * DV::meta_bytes);
    }
  }
}

/// Smallest index i < n with k[i] (v[i]) NaN or +-Inf, atomically min-ed into first_bad[0]
/// ([1]); the caller initialises both to ~0ull. Grid-stride loop over both arrays.
template <int = 0>
__global__ void scan_non_finite_kernel(const float* k, const float* v, std::int64_t n, unsigned long long* first_bad) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < 2 * n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int which = i < n ? 0 : 1;
    const std::int64_t j = which == 0 ? i : i - n;
    const float x = which == 0 ? k[j] : v[j];
    if ((__float_as_uint(x) & 0x7F800000u) == 0x7F800000u) atomicMin(first_bad + which, static_cast<unsigned long long>(j));
  }
}

/// Advances the layer's device token count by n after append_kernel, unless an error is pending
/// (then the append wrote nothing). One thread.
template <int = 0>
__global__ void commit_tokens_kernel(std::int64_t* tokens, const DeviceStatus* status, std::int64_t n) {
  if (status->code == kStatusOk) *tokens += n;
}

}  // namespace kvpack::cuda
