// CUDA kernels over kvpack's block layout (include/kvpack/cache/block.hpp):
//
//  * decode_split_kernel + decode_combine_kernel: split-K flash-decoding (FlashDecoding, Dao et
//    al. 2023) of one decode query per query head. Grid (kv_heads, splits): each CTA takes one
//    KV head and a contiguous range of tiles (a tile = one quantized block of B tokens, or B fp32
//    "exact" rows such as the current token), stages each block's codes and metadata into shared
//    memory with cp.async (double buffered: the next block is in flight while one is computed),
//    dequantizes K and V chunk by chunk in registers,
//    scores EVERY query head of the GQA group against each key it loads (K and V read once per
//    KV head, not once per query head), keeps an online softmax per query head (fp32), and
//    writes one partial (m, l, acc[D]) per (query head, split). The combine kernel merges the
//    partials (helpers.cuh combine_channel). A block whose validity words are all zero is skipped
//    without reading its payload; within a block only slots whose bit is set are read (eviction
//    masks; every set slot is visible to the decode query, as in the scalar kernel).
//  * append_kernel: the device quantizer. One thread quantizes one group (G values of one token,
//    one KV head, K or V) with helpers.cuh quantize_group, so codes and metadata are
//    bit-identical to the host encode_row (CASES C4), writes the position and sets the slot's
//    validity bit.
//  * first_non_finite_kernel: index of the first NaN/Inf of a buffer (append rejects it).
//
// Per-token keys only (per-channel/KIVI keys are not implemented on the device); grouped codecs
// only (Int8, Int4, Fp8E4M3, Fp8E5M2); head_dim a multiple of 8 and <= 256; GQA group <= 8;
// two blocks' codes + metadata must fit in shared memory (sm_80+: cp.async).
// The host API that launches these and checks every CUDA call is kernels/cuda/device_cache.cuh.
// The scalar kernel (kernels/scalar/attention.hpp) is the specification: outputs agree to 1e-5
// relative (tests/cuda/test_cuda_decode.cu).
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/attention.cuh contains CUDA kernels: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/helpers.cuh"

namespace kvpack::cuda {

inline constexpr int kDecodeWarps = 4;                     ///< warps per decode CTA
inline constexpr int kDecodeThreads = 32 * kDecodeWarps;  ///< threads per decode CTA
inline constexpr int kMaxHeadDim = 256;                    ///< largest head_dim of the device kernels
inline constexpr int kMaxGroup = 8;                        ///< largest GQA group (q_heads / kv_heads)

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
  std::int64_t k_codes = 0, k_meta = 0, v_codes = 0, v_meta = 0, positions = 0;  ///< BlockLayout offsets
  std::int64_t k_row = 0, v_row = 0, k_meta_token = 0, v_meta_token = 0;         ///< bytes per token
};

/// Full-precision rows read exactly by the decode kernel after the blocks (sinks, the residual
/// window, the current token): row t of KV head h at k + t * stride + h * head_dim (floats).
struct DeviceRows {
  const float* k = nullptr;
  const float* v = nullptr;
  std::int64_t stride = 0;  ///< floats between consecutive rows (kv_heads * head_dim when packed)
  int count = 0;            ///< rows
};

/// Arguments of one decode launch (one layer, one query token).
struct DecodeArgs {
  DeviceBlocks blocks;
  int n_blocks = 0;            ///< block slots scanned per KV head
  DeviceRows exact;            ///< fp32 rows after the blocks
  const float* q = nullptr;    ///< [q_heads][head_dim], query head h*group + j uses KV head h
  int head_dim = 0, group = 1, kv_heads = 0;
  float scale = 1.f;           ///< softmax scale applied to q . k
  int tiles_per_split = 0, n_splits = 1;
  int tile_bytes = 0;          ///< bytes of a block staged in shared memory (BlockLayout::positions rounded up to 16)
  float* part_m = nullptr;     ///< [q_heads][n_splits]
  float* part_l = nullptr;     ///< [q_heads][n_splits]
  float* part_acc = nullptr;   ///< [q_heads][n_splits][head_dim]
};

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

/// Dequantized chunk (8 channels starting at channel 8 * chunk) of token t of a block.
template <class DC>
__device__ inline void load_block_chunk(const std::uint8_t* blk, std::int64_t codes, std::int64_t meta,
                                        std::int64_t row, std::int64_t meta_token, int t, int chunk, float* out) {
  const std::uint8_t* code_ptr = blk + codes + t * row + chunk * (kChunk * DC::bits / 8);
  const ChunkCodes c = load_chunk<DC::bits>(code_ptr);
  const int g = chunk * kChunk / DC::group;
  const GroupParams p = load_group_params<DC>(blk + meta + t * meta_token + g * DC::meta_bytes);
  dequantize_chunk<DC>(c, p, out);
}

}  // namespace device_detail

/// Split-K decode, first pass. Grid (kv_heads, n_splits), kDecodeThreads threads. B = tokens per
/// block, GMAX >= group (register arrays are sized by it).
///
/// Thread mapping: a token's D / 8 chunks are spread over `lpt` lanes (the power of two >= D / 8),
/// so a warp covers 32 / lpt tokens per step; each lane keeps its chunk of every group query in
/// registers and its chunk of the group's accumulators.
template <class KC, class VC, int B, int GMAX>
__global__ void __launch_bounds__(kDecodeThreads) decode_split_kernel(const DecodeArgs a) {
  using DK = DeviceCodec<KC>;
  using DV = DeviceCodec<VC>;
  __shared__ float s_p[GMAX][B];  // scores, then probabilities, of the current tile
  __shared__ float s_m[GMAX], s_l[GMAX], s_corr[GMAX];
  __shared__ float s_red[GMAX][kMaxHeadDim];
  extern __shared__ __align__(16) std::uint8_t s_tiles[];  // 2 x a.tile_bytes: staged blocks

  const int h = static_cast<int>(blockIdx.x);
  const int split = static_cast<int>(blockIdx.y);
  const int D = a.head_dim;
  const int C = D / kChunk;
  int lpt = 1;
  while (lpt < C) lpt <<= 1;
  const int tpw = 32 / lpt;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int chunk = lane & (lpt - 1);
  const bool has_chunk = chunk < C;
  const int step = kDecodeWarps * tpw;
  const int my_tok = warp * tpw + lane / lpt;

  float qr[GMAX][kChunk];
  float acc[GMAX][kChunk];
#pragma unroll
  for (int j = 0; j < GMAX; ++j) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      qr[j][e] = (j < a.group && has_chunk)
                     ? a.q[static_cast<std::int64_t>(h * a.group + j) * D + chunk * kChunk + e]
                     : 0.f;
      acc[j][e] = 0.f;
    }
  }
  if (threadIdx.x < GMAX) {
    s_m[threadIdx.x] = kNegInf;
    s_l[threadIdx.x] = 0.f;
    s_corr[threadIdx.x] = 1.f;
  }
  __syncthreads();

  const int exact_tiles = (a.exact.count + B - 1) / B;
  const int units = a.n_blocks + exact_tiles;
  const int u0 = split * a.tiles_per_split;
  const int u1 = min(units, u0 + a.tiles_per_split);
  // Quantized blocks are staged into shared memory by cp.async (16-byte, coalesced), double
  // buffered: block u + 1 is in flight while block u is computed. Empty blocks are never copied.
  auto block_index = [&](int u) { return static_cast<std::int64_t>(h) * a.blocks.max_blocks + u; };
  auto has_tokens = [&](int u) {
    const std::uint64_t* w = a.blocks.valid + block_index(u) * a.blocks.words;
    std::uint64_t any = 0;
    for (int i = 0; i < a.blocks.words; ++i) any |= w[i];
    return any != 0;
  };
  auto stage = [&](int u) {
    const std::uint8_t* src = a.blocks.data + block_index(u) * a.blocks.block_stride;
    std::uint8_t* dst = s_tiles + (u & 1) * a.tile_bytes;
    for (int i = static_cast<int>(threadIdx.x) * 16; i < a.tile_bytes; i += kDecodeThreads * 16)
      device_detail::cp_async16(dst + i, src + i);
  };
  if (u0 < u1 && u0 < a.n_blocks && has_tokens(u0)) stage(u0);
  device_detail::cp_async_commit();
  for (int u = u0; u < u1; ++u) {
    if (u + 1 < u1 && u + 1 < a.n_blocks && has_tokens(u + 1)) stage(u + 1);
    device_detail::cp_async_commit();
    device_detail::cp_async_wait_all_but_last();  // block u has landed (this thread's copies)
    __syncthreads();                               // ... and every other thread's
    const bool quant = u < a.n_blocks;
    const std::uint8_t* blk = nullptr;
    const std::uint64_t* vw = nullptr;
    const float* ek = nullptr;
    const float* ev = nullptr;
    int n_tok = B;
    if (quant) {
      if (!has_tokens(u)) continue;  // empty block (all slots evicted or unused): payload never read
      vw = a.blocks.valid + block_index(u) * a.blocks.words;
      blk = s_tiles + (u & 1) * a.tile_bytes;
    } else {
      const int t0 = (u - a.n_blocks) * B;
      n_tok = min(B, a.exact.count - t0);
      ek = a.exact.k + static_cast<std::int64_t>(t0) * a.exact.stride + static_cast<std::int64_t>(h) * D;
      ev = a.exact.v + static_cast<std::int64_t>(t0) * a.exact.stride + static_cast<std::int64_t>(h) * D;
    }

    // Phase 1: scores of every group query against each key of the tile.
    for (int base = 0; base < B; base += step) {
      const int t = base + my_tok;
      bool live = t < n_tok;
      if (live && quant) live = ((vw[t >> 6] >> (t & 63)) & 1u) != 0;
      float dot[GMAX];
#pragma unroll
      for (int j = 0; j < GMAX; ++j) dot[j] = 0.f;
      if (live && has_chunk) {
        float k[kChunk];
        if (quant) {
          device_detail::load_block_chunk<DK>(blk, a.blocks.k_codes, a.blocks.k_meta, a.blocks.k_row,
                                              a.blocks.k_meta_token, t, chunk, k);
        } else {
#pragma unroll
          for (int e = 0; e < kChunk; ++e) k[e] = ek[static_cast<std::int64_t>(t) * a.exact.stride + chunk * kChunk + e];
        }
#pragma unroll
        for (int j = 0; j < GMAX; ++j)
#pragma unroll
          for (int e = 0; e < kChunk; ++e) dot[j] += qr[j][e] * k[e];
      }
      for (int off = lpt >> 1; off > 0; off >>= 1)
#pragma unroll
        for (int j = 0; j < GMAX; ++j) dot[j] += __shfl_xor_sync(0xFFFFFFFFu, dot[j], off);
      if (chunk == 0 && t < B) {
#pragma unroll
        for (int j = 0; j < GMAX; ++j)
          if (j < a.group) s_p[j][t] = live ? dot[j] * a.scale : kNegInf;
      }
    }
    __syncthreads();

    // Phase 2: one warp per query head: tile maximum, probabilities, running (m, l).
    for (int j = warp; j < a.group; j += kDecodeWarps) {
      float mx = kNegInf;
      for (int t = lane; t < B; t += 32) mx = fmaxf(mx, s_p[j][t]);
      mx = device_detail::warp_max(mx);
      const float m_old = s_m[j];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int t = lane; t < B; t += 32) {
        const float s = s_p[j][t];
        const float p = (s == kNegInf) ? 0.f : exp_f32(s - m_new);
        s_p[j][t] = p;
        sum += p;
      }
      sum = device_detail::warp_sum(sum);
      if (lane == 0) {
        const float corr = (m_old == kNegInf) ? 0.f : exp_f32(m_old - m_new);
        s_l[j] = s_l[j] * corr + sum;
        s_m[j] = m_new;
        s_corr[j] = corr;
      }
    }
    __syncthreads();

    // Phase 3: rescale the accumulators, add p * v for the tile's keys.
#pragma unroll
    for (int j = 0; j < GMAX; ++j) {
      const float corr = j < a.group ? s_corr[j] : 1.f;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) acc[j][e] *= corr;
    }
    for (int base = 0; base < B; base += step) {
      const int t = base + my_tok;
      if (t >= n_tok || !has_chunk) continue;
      float p[GMAX];
      bool any = false;
#pragma unroll
      for (int j = 0; j < GMAX; ++j) {
        p[j] = j < a.group ? s_p[j][t] : 0.f;
        any = any || p[j] != 0.f;
      }
      if (!any) continue;  // masked slot (or a probability that underflowed for every query)
      float v[kChunk];
      if (quant) {
        device_detail::load_block_chunk<DV>(blk, a.blocks.v_codes, a.blocks.v_meta, a.blocks.v_row,
                                            a.blocks.v_meta_token, t, chunk, v);
      } else {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[e] = ev[static_cast<std::int64_t>(t) * a.exact.stride + chunk * kChunk + e];
      }
#pragma unroll
      for (int j = 0; j < GMAX; ++j)
#pragma unroll
        for (int e = 0; e < kChunk; ++e) acc[j][e] += p[j] * v[e];
    }
    __syncthreads();
  }

  device_detail::cp_async_wait_all();  // nothing may stay in flight (the last group is empty)

  // Reduce the accumulators over the tokens a warp covers (lanes with the same chunk), then over
  // warps in a fixed order (deterministic), into s_red.
  for (int off = lpt; off < 32; off <<= 1)
#pragma unroll
    for (int j = 0; j < GMAX; ++j)
#pragma unroll
      for (int e = 0; e < kChunk; ++e) acc[j][e] += __shfl_xor_sync(0xFFFFFFFFu, acc[j][e], off);
  for (int i = static_cast<int>(threadIdx.x); i < GMAX * kMaxHeadDim; i += kDecodeThreads)
    s_red[i / kMaxHeadDim][i % kMaxHeadDim] = 0.f;
  __syncthreads();
  for (int w = 0; w < kDecodeWarps; ++w) {
    if (warp == w && lane < lpt && has_chunk) {
#pragma unroll
      for (int j = 0; j < GMAX; ++j)
#pragma unroll
        for (int e = 0; e < kChunk; ++e) s_red[j][chunk * kChunk + e] += acc[j][e];
    }
    __syncthreads();
  }
  for (int i = static_cast<int>(threadIdx.x); i < a.group * D; i += kDecodeThreads) {
    const int j = i / D, d = i % D;
    const std::int64_t qh = static_cast<std::int64_t>(h) * a.group + j;
    a.part_acc[(qh * a.n_splits + split) * D + d] = s_red[j][d];
  }
  if (static_cast<int>(threadIdx.x) < a.group) {
    const std::int64_t qh = static_cast<std::int64_t>(h) * a.group + threadIdx.x;
    a.part_m[qh * a.n_splits + split] = s_m[threadIdx.x];
    a.part_l[qh * a.n_splits + split] = s_l[threadIdx.x];
  }
}

/// Split-K decode, combine pass: grid q_heads, any block size. out: [q_heads][head_dim].
/// (A template only so that the header may be included by several translation units.)
template <int = 0>
__global__ void decode_combine_kernel(const float* part_m, const float* part_l, const float* part_acc, int n_splits,
                                      int head_dim, float* out) {
  const std::int64_t qh = blockIdx.x;
  const float* m = part_m + qh * n_splits;
  const float* l = part_l + qh * n_splits;
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += static_cast<int>(blockDim.x))
    out[qh * head_dim + d] = combine_channel(m, l, part_acc + qh * n_splits * head_dim + d, n_splits, head_dim);
}

/// Arguments of one append launch: n tokens of K and V ([n][kv_heads][head_dim] fp32, device)
/// and positions ([n] int32) written to slots first_slot .. first_slot + n - 1 of every KV head.
struct AppendArgs {
  DeviceBlocks blocks;
  const float* k = nullptr;
  const float* v = nullptr;
  const std::int32_t* positions = nullptr;
  std::int64_t n = 0;
  std::int64_t first_slot = 0;
  int kv_heads = 0, head_dim = 0;
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
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t th = i / per;
    const int r = static_cast<int>(i % per);
    const std::int64_t t = th / a.kv_heads;
    const int h = static_cast<int>(th % a.kv_heads);
    const std::int64_t slot = a.first_slot + t;
    const std::int64_t b = slot / B;
    const std::int64_t off = slot % B;
    const std::int64_t bi = static_cast<std::int64_t>(h) * a.blocks.max_blocks + b;
    std::uint8_t* blk = a.blocks.data + bi * a.blocks.block_stride;
    const std::int64_t src = (t * a.kv_heads + h) * D;
    if (r < gk) {
      quantize_group<DK>(a.k + src + r * DK::group, 1, blk + a.blocks.k_codes + off * a.blocks.k_row + r * DK::group * DK::bits / 8,
                         blk + a.blocks.k_meta + off * a.blocks.k_meta_token + r * DK::meta_bytes);
      if (r == 0) {
        const auto pos = static_cast<std::uint32_t>(a.positions[t]);
        std::uint8_t* pp = blk + a.blocks.positions + off * 4;
        pp[0] = static_cast<std::uint8_t>(pos);
        pp[1] = static_cast<std::uint8_t>(pos >> 8);
        pp[2] = static_cast<std::uint8_t>(pos >> 16);
        pp[3] = static_cast<std::uint8_t>(pos >> 24);
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

/// Smallest index i < n with x[i] NaN or +-Inf, atomically min-ed into *first (initialise it to
/// ~0ull). Grid-stride loop.
template <int = 0>
__global__ void first_non_finite_kernel(const float* x, std::int64_t n, unsigned long long* first) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if ((__float_as_uint(x[i]) & 0x7F800000u) == 0x7F800000u) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

}  // namespace kvpack::cuda
