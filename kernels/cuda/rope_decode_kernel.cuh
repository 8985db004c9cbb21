// Split-K decode over kvpack's quantized blocks for PreRope<OriginalPositions> caches: keys are
// stored before RoPE, so every key is dequantized, rotated at its stored position and only then
// scored; the query is rotated at its position once per CTA. (kernels/rope.hpp is the host
// convention: pair i of rope_dims / 2 rotates by pos * theta_i, theta_i = base^(-2i / rope_dims),
// adjacent (2i, 2i + 1) or NeoX (i, i + rope_dims / 2) pairs, channels >= rope_dims untouched.)
//
// Not the instruction-budget kernel of decode_kernel.cuh: RoPE mixes channel pairs that its
// scoring lanes keep apart (NeoX pairs lie D / 2 apart), so this kernel works on fp32 tiles:
// Grid (KV-head CTAs, splits), kRopeThreads threads, static shared memory (< 48 KiB, no opt-in).
// A CTA takes one KV head, up to GMAX of its query heads, and a contiguous range of tiles of
// kRopeTile = 32 tokens (the block slots [0, tokens) first, then the exact rows). Per tile:
//  1. the tile's keys are dequantized into shared memory (a thread per 8-channel chunk, the
//     host codec's decode_value, so the same floats as the host read_back), with each slot's
//     validity bit and stored position (exact rows: DeviceRows::pos);
//  2. each live row is rotated at its position, a thread per (row, pair), cos/sin from the device
//     table (DeviceRopeTable: the host RopeTable's floats, double-precision angles);
//  3. scores q . k (fp32, sequential over channels), one online-softmax step per query head
//     (decode_kernel.cuh's softmax_step); 4. the values are dequantized into the same buffer and
//     accumulated, each thread owning GMAX * D / kRopeThreads output channels in registers.
// The partials (m, l, acc) go to decode_combine_kernel, as the main kernel's.
// Errors: a query or exact-row position outside the table is recorded in DeviceStatus (code
// kStatusPosition; DeviceCache::check reports it) by CTA (0, 0) and clamped for the reads.
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/rope_decode_kernel.cuh contains CUDA kernels: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kvpack/kernels/cuda/attention.cuh"
#include "kvpack/kernels/cuda/decode_kernel.cuh"
#include "kvpack/kernels/cuda/device_memory.cuh"
#include "kvpack/kernels/cuda/helpers.cuh"
#include "kvpack/kernels/cuda/transform_helpers.cuh"

namespace kvpack::cuda {

inline constexpr int kRopeThreads = 256;  ///< threads per RoPE decode CTA
inline constexpr int kRopeTile = 32;      ///< tokens per tile of the RoPE decode kernel

/// Device view of a RoPE cos/sin table ([positions][pairs][2] floats, kernels::RopeTable layout).
struct RopeTableView {
  const float* table = nullptr;
  std::int64_t positions = 0;  ///< rows; valid positions are [0, positions)
  int pairs = 0;               ///< rotated pairs (rope_dims / 2)
  bool neox = false;           ///< NeoX pairing (i, i + pairs); else adjacent (2i, 2i + 1)
};

/// Arguments of one RoPE decode launch: the main kernel's (DecodeArgs; its smem and part_*
/// fields as there, smem unused) plus the table, the query's position (device, one int32) and
/// where position errors go.
struct RopeDecodeArgs {
  DecodeArgs d;
  RopeTableView rope;
  const std::int32_t* q_pos = nullptr;
  DeviceStatus* status = nullptr;
  int layer = 0;
};

namespace device_detail {

/// Records a RoPE position error (first error only; one thread).
__device__ inline void record_position_error(DeviceStatus* st, int layer, int which, long long row, long long pos) {
  if (st->code != kStatusOk) return;
  st->code = kStatusPosition;
  st->layer = layer;
  st->which = which;
  st->index = row;
  st->value = pos;
  st->first = 0;
  st->n = 0;
}

/// Loads one tile's rows into x[kRopeTile][D]: K (Keys) or V. A slot tile (`slots`) holds block
/// slots t0 + t, dequantized, live when below n_tok and valid; an exact tile holds exact rows
/// t0 + t, live below exact.count. Dead rows are zeros. With Keys, also each row's liveness and
/// position (stored in the block payload, or DeviceRows::pos).
template <class KC, class VC, int B, int D, bool Keys>
__device__ void load_rope_tile(const RopeDecodeArgs& a, int h, bool slots, std::int64_t t0, std::int64_t n_tok, float* x,
                               int* pos, bool* live) {
  using DC = DeviceCodec<std::conditional_t<Keys, KC, VC>>;
  constexpr int CH = D / kChunk;
  const DeviceBlocks& bl = a.d.blocks;
  for (int idx = static_cast<int>(threadIdx.x); idx < kRopeTile * CH; idx += kRopeThreads) {
    const int t = idx / CH, ch = idx % CH;
    const std::int64_t g = t0 + t;
    float* dst = x + t * D + ch * kChunk;
    bool ok = false;
    int p = 0;
    if (slots && g < n_tok) {
      const std::int64_t b = g / B, off = g % B;
      const std::int64_t bi = static_cast<std::int64_t>(h) * bl.max_blocks + b;
      const std::uint8_t* blk = bl.data + bi * bl.block_stride;
      ok = ((bl.valid[bi * bl.words + off / 64] >> (off % 64)) & 1u) != 0;
      const std::int64_t codes = Keys ? bl.k_codes + off * bl.k_row : bl.v_codes + off * bl.v_row;
      const std::int64_t meta = Keys ? bl.k_meta + off * bl.k_meta_token : bl.v_meta + off * bl.v_meta_token;
      const ChunkCodes cc = load_chunk<DC::bits>(blk + codes + ch * DC::bits);
      const GroupParams gp = load_group_params<DC>(blk + meta + (ch * kChunk / DC::group) * DC::meta_bytes);
      dequantize_chunk<DC>(cc, gp, dst);
      if (Keys && ch == 0) p = static_cast<int>(load_le32(blk + bl.positions + off * 4));
    } else if (!slots && g < a.d.exact.count) {
      ok = true;
      const float* src = (Keys ? a.d.exact.k : a.d.exact.v) + g * a.d.exact.stride + static_cast<std::int64_t>(h) * D + ch * kChunk;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) dst[e] = src[e];
      if (Keys && ch == 0) p = a.d.exact.pos[g];
    }
    if constexpr (Keys)
      if (ch == 0) pos[t] = p, live[t] = ok;
    if (!ok)
#pragma unroll
      for (int e = 0; e < kChunk; ++e) dst[e] = 0.f;  // no NaN from stale or uninitialised bytes
  }
}

/// Rotates rows [0, rows) of x[.][D] at their positions, a thread per (row, pair), when live.
__device__ inline void rope_rows(float* x, const int* pos, const bool* live, int rows, int D, const RopeTableView& r) {
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * r.pairs; idx += static_cast<int>(blockDim.x)) {
    const int t = idx / r.pairs, i = idx % r.pairs;
    if (!live[t]) continue;
    const float* cs = rope_table_row(r.table, r.positions, r.pairs, pos[t]);
    const RopePair p = rope_pair(i, r.pairs, r.neox);
    rope_rotate_pair(x[t * D + p.a], x[t * D + p.b], cs[2 * i], cs[2 * i + 1]);
  }
}

}  // namespace device_detail

/// The RoPE decode kernel (see the file comment). D: head_dim; GMAX: query heads per CTA.
template <class KC, class VC, int B, int D, int GMAX>
__global__ void __launch_bounds__(kRopeThreads) rope_decode_split_kernel(const RopeDecodeArgs a) {
  constexpr int NACC = (GMAX * D + kRopeThreads - 1) / kRopeThreads;
  __shared__ __align__(16) float s_q[GMAX * D];
  __shared__ __align__(16) float s_x[kRopeTile * D];
  __shared__ float s_p[kRopeTile * GMAX];
  __shared__ float s_stat[3 * GMAX];
  __shared__ int s_pos[kRopeTile];
  __shared__ bool s_live[kRopeTile];

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int q_ctas = (a.d.group + GMAX - 1) / GMAX;
  const int h = static_cast<int>(blockIdx.x) / q_ctas;
  const int j0 = (static_cast<int>(blockIdx.x) % q_ctas) * GMAX;
  const int nq = min(GMAX, a.d.group - j0);
  const int split = static_cast<int>(blockIdx.y);
  const int qp = *a.q_pos;

  if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {  // positions outside the table: an error
    if (qp < 0 || qp >= a.rope.positions) device_detail::record_position_error(a.status, a.layer, 3, 0, qp);
    for (int r = 0; r < a.d.exact.count; ++r) {
      const int p = a.d.exact.pos[r];
      if (p < 0 || p >= a.rope.positions) {
        device_detail::record_position_error(a.status, a.layer, 4, r, p);
        break;
      }
    }
  }
  // The query heads, rotated at the query position, then scaled.
  for (int i = tid; i < GMAX * D; i += kRopeThreads) {
    const int j = i / D;
    s_q[i] = j < nq ? a.d.q[(static_cast<std::int64_t>(h) * a.d.group + j0 + j) * D + i % D] : 0.f;
  }
  if (tid < kRopeTile) s_pos[tid] = qp, s_live[tid] = tid < GMAX;
  if (tid < GMAX) s_stat[tid] = kNegInf, s_stat[GMAX + tid] = 0.f, s_stat[2 * GMAX + tid] = 1.f;
  __syncthreads();
  device_detail::rope_rows(s_q, s_pos, s_live, GMAX, D, a.rope);
  __syncthreads();
  for (int i = tid; i < GMAX * D; i += kRopeThreads) s_q[i] *= a.d.scale;

  const std::int64_t n_tok = min(*a.d.tokens, static_cast<std::int64_t>(a.d.blocks.max_blocks) * B);
  const std::int64_t slot_tiles = (n_tok + kRopeTile - 1) / kRopeTile;
  const std::int64_t units = slot_tiles + (a.d.exact.count + kRopeTile - 1) / kRopeTile;
  const std::int64_t per_split = (units + gridDim.y - 1) / gridDim.y;
  const std::int64_t u0 = split * per_split, u1 = min(units, u0 + per_split);

  float acc[NACC];
#pragma unroll
  for (int k = 0; k < NACC; ++k) acc[k] = 0.f;
  for (std::int64_t u = u0; u < u1; ++u) {
    // Tile u: slots [u * T, u * T + T) (below n_tok), or exact rows from (u - slot_tiles) * T.
    const bool slots = u < slot_tiles;
    const std::int64_t t0 = (slots ? u : u - slot_tiles) * kRopeTile;
    __syncthreads();  // the previous tile's values and probabilities are consumed
    device_detail::load_rope_tile<KC, VC, B, D, true>(a, h, slots, t0, n_tok, s_x, s_pos, s_live);
    __syncthreads();
    device_detail::rope_rows(s_x, s_pos, s_live, kRopeTile, D, a.rope);
    __syncthreads();
    for (int i = tid; i < kRopeTile * GMAX; i += kRopeThreads) {
      const int t = i / GMAX, j = i % GMAX;
      float dot = 0.f;
      for (int c = 0; c < D; ++c) dot = fmaf(s_q[j * D + c], s_x[t * D + c], dot);
      s_p[i] = s_live[t] && j < nq ? dot : kNegInf;
    }
    __syncthreads();
    for (int j = warp; j < nq; j += kRopeThreads / 32) device_detail::softmax_step<kRopeTile, GMAX>(s_p, s_stat, j, lane);
    device_detail::load_rope_tile<KC, VC, B, D, false>(a, h, slots, t0, n_tok, s_x, nullptr, nullptr);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < NACC; ++k) {
      const int o = tid + k * kRopeThreads;
      if (o < GMAX * D) {
        const int j = o / D, c = o % D;
        float s = acc[k] * s_stat[2 * GMAX + j];
#pragma unroll 8
        for (int t = 0; t < kRopeTile; ++t) s = fmaf(s_p[t * GMAX + j], s_x[t * D + c], s);
        acc[k] = s;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < NACC; ++k) {
    const int o = tid + k * kRopeThreads;
    if (o >= GMAX * D || o / D >= nq) continue;
    const std::int64_t qh = static_cast<std::int64_t>(h) * a.d.group + j0 + o / D;
    a.d.part_acc[(qh * a.d.n_splits + split) * D + o % D] = acc[k];
  }
  __syncthreads();
  if (tid < nq) {
    const std::int64_t qh = static_cast<std::int64_t>(h) * a.d.group + j0 + tid;
    a.d.part_m[qh * a.d.n_splits + split] = s_stat[tid];
    a.d.part_l[qh * a.d.n_splits + split] = s_stat[GMAX + tid];
  }
}

/// Flags the first of n positions outside [0, limit): atomically min-ed index into *first_bad
/// (the caller initialises it to ~0ull). Grid-stride loop.
template <int = 0>
__global__ void scan_positions_kernel(const std::int32_t* pos, std::int64_t n, std::int64_t limit,
                                      unsigned long long* first_bad) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    if (pos[i] < 0 || pos[i] >= limit) atomicMin(first_bad, static_cast<unsigned long long>(i));
}

/// Enqueues rope_decode_split_kernel for head_dim (64, 128, 256) and query heads per CTA
/// (1, 2, 4, 8) on `stream` (static shared memory: no opt-in). Launch errors returned.
template <class KC, class VC, int B>
Status launch_rope_decode(const RopeDecodeArgs& a, dim3 grid, int head_dim, int heads_per_cta, cudaStream_t stream) {
  auto for_dim = [&]<int D>() {
    if (heads_per_cta <= 2)
      heads_per_cta == 1 ? rope_decode_split_kernel<KC, VC, B, D, 1><<<grid, kRopeThreads, 0, stream>>>(a)
                         : rope_decode_split_kernel<KC, VC, B, D, 2><<<grid, kRopeThreads, 0, stream>>>(a);
    else
      heads_per_cta == 4 ? rope_decode_split_kernel<KC, VC, B, D, 4><<<grid, kRopeThreads, 0, stream>>>(a)
                         : rope_decode_split_kernel<KC, VC, B, D, 8><<<grid, kRopeThreads, 0, stream>>>(a);
  };
  if (head_dim == 64) for_dim.template operator()<64>();
  else if (head_dim == 128) for_dim.template operator()<128>();
  else for_dim.template operator()<256>();
  KVPACK_CUDA_TRY(cudaGetLastError());
  return {};
}

}  // namespace kvpack::cuda
