// Split-K flash-decoding over kvpack's quantized blocks (FlashDecoding, Dao et al. 2023), built
// for the instruction budget of bench/cuda/sass_budget.py: at decode the kernel must move bytes,
// so the inner loop avoids everything that is not an FMA on a code.
//
// Grid (kv_heads x query CTAs, splits), kDecodeThreads threads. A CTA takes one KV head, up to
// kMaxGroupPerCta of its query heads, and a contiguous range of tiles (a tile = one block of B
// tokens, then the fp32 "exact" rows in tiles of B). Per block:
//  * staging: the block's codes and metadata (everything before the positions) go to shared
//    memory by cp.async, kDecodeStages deep (two blocks in flight while one is computed); the
//    block's validity words are read once, when it is staged; a block whose words are all zero
//    is neither copied nor computed (slots inside a partly valid block are still copied);
//  * scores: a lane (or DecodeMapping::lanes_per_token adjacent lanes) per token: the lane reads
//    its token's codes of a segment of channels, turns them into unit values by the magic-number
//    trick (unpack.cuh), and accumulates q . u per group for every query head, then applies the
//    group's scale and zero once: q . k = sum_g s_g (q_g . u_g) + z_g sum(q_g). The query (scaled
//    by the softmax scale) is broadcast from shared memory (a lane cannot hold D x group floats);
//  * softmax: a warp per query head, an online softmax (Milakov & Gimelshein 2018) in fp32;
//  * values: a lane per 8-channel chunk, tokens over warps; p * scale per token and query, and
//    p * zero summed per group (added once at the end), so each code costs one FMA per query.
// The partials (m, l, acc[D]) per (query head, split) are merged by decode_combine_kernel.
// Token counts are read on the device (DecodeArgs::tokens), so the launch does not depend on
// how many tokens the host thinks were appended (CUDA-graph friendly).
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/decode_kernel.cuh contains CUDA kernels: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "kvpack/kernels/cuda/attention.cuh"
#include "kvpack/kernels/cuda/decode_plan.cuh"
#include "kvpack/kernels/cuda/unpack.cuh"

namespace kvpack::cuda {

namespace device_detail {

/// N 32-bit words from 4 * N-byte-aligned shared memory, in the widest loads the alignment allows.
template <int N>
__device__ __forceinline__ void load_words(const std::uint8_t* p, std::uint32_t* w) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i / 4];
      w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i / 2];
      w[i] = v.x, w[i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = reinterpret_cast<const std::uint32_t*>(p)[i];
  }
}

/// Effective (scale, zero) of a group from 2- or 4-byte-aligned shared memory.
template <class DC>
__device__ __forceinline__ GroupParams smem_params(const std::uint8_t* meta) {
  if constexpr (DC::meta_f16 && !DC::asymmetric) {
    GroupParams p;
    p.scale = __half2float(*reinterpret_cast<const __half*>(meta));
    if constexpr (!DC::is_fp8) p.zero = -kUnitOffset<DC> * p.scale;
    return p;
  } else {
    return effective_params<DC>(meta);
  }
}

/// Online-softmax step of one query head over n scores s[t * GMAX] (a warp): replaces the scores
/// by probabilities relative to the new running maximum and updates (m, l, corr).
template <int B, int GMAX>
__device__ __forceinline__ void softmax_step(float* s_p, float* s_stat, int j, int lane) {
  constexpr int per_lane = B >= 32 ? B / 32 : 1;
  float s[per_lane];
  float mx = kNegInf;
#pragma unroll
  for (int i = 0; i < per_lane; ++i) {
    const int t = lane + 32 * i;
    s[i] = t < B ? s_p[t * GMAX + j] : kNegInf;
    mx = fmaxf(mx, s[i]);
  }
  mx = warp_max(mx);
  const float m_old = s_stat[j];
  const float m_new = fmaxf(m_old, mx);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < per_lane; ++i) {
    const int t = lane + 32 * i;
    const float p = (s[i] == kNegInf) ? 0.f : exp_f32(s[i] - m_new);
    if (t < B) s_p[t * GMAX + j] = p;
    sum += p;
  }
  sum = warp_sum(sum);
  if (lane == 0) {
    const float corr = (m_old == kNegInf) ? 0.f : exp_f32(m_old - m_new);
    s_stat[GMAX + j] = s_stat[GMAX + j] * corr + sum;
    s_stat[j] = m_new;
    s_stat[2 * GMAX + j] = corr;
  }
}

/// GMAX consecutive floats from 4 * GMAX-byte-aligned shared memory (16-byte loads for GMAX >= 4):
/// the probabilities of a token, or the query heads' values of one channel.
template <int GMAX>
__device__ __forceinline__ void load_group(const float* src, float* out) {
  if constexpr (GMAX % 4 == 0) {
#pragma unroll
    for (int j = 0; j < GMAX; j += 4) {
      const float4 v = reinterpret_cast<const float4*>(src)[j / 4];
      out[j] = v.x, out[j + 1] = v.y, out[j + 2] = v.z, out[j + 3] = v.w;
    }
  } else if constexpr (GMAX == 2) {
    const float2 v = *reinterpret_cast<const float2*>(src);
    out[0] = v.x, out[1] = v.y;
  } else {
    out[0] = src[0];
  }
}

}  // namespace device_detail

/// Split pass. KC, VC: the cache codecs; B tokens per block; D = head_dim; GMAX: query heads per CTA.
template <class KC, class VC, int B, int D, int GMAX>
__global__ void __launch_bounds__(kDecodeThreads, decode_min_ctas_per_sm(GMAX)) decode_split_kernel(const DecodeArgs a) {
  using DK = DeviceCodec<KC>;
  using DV = DeviceCodec<VC>;
  using M = DecodeMapping<B, D>;
  constexpr int L = M::lanes_per_token;
  constexpr int UNIT = DK::group < M::seg ? DK::group : M::seg;  // channels sharing (scale, zero) in a lane
  constexpr int K_ROW = D * DK::bits / 8, V_ROW = D * DV::bits / 8;
  constexpr int K_META = B * K_ROW, V_CODES = K_META + B * (D / DK::group) * DK::meta_bytes;
  constexpr int V_META = V_CODES + B * V_ROW;
  constexpr int WORDS = (B + 63) / 64;
  constexpr int TILE = static_cast<int>(round16(static_cast<std::size_t>(V_META + B * (D / DV::group) * DV::meta_bytes)));

  extern __shared__ __align__(16) std::uint8_t smem[];
  float* s_q = reinterpret_cast<float*>(smem + a.smem.q);         // [D][GMAX] + padding, scaled
  float* s_qseg = reinterpret_cast<float*>(smem + a.smem.qseg);   // [D / UNIT][GMAX]
  float* s_p = reinterpret_cast<float*>(smem + a.smem.p);         // [B][GMAX]
  float* s_stat = reinterpret_cast<float*>(smem + a.smem.stat);   // m[GMAX], l[GMAX], corr[GMAX]
  auto* s_valid = reinterpret_cast<std::uint64_t*>(smem + a.smem.valid);  // [stages][WORDS]

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int q_ctas = (a.group + GMAX - 1) / GMAX;
  const int h = static_cast<int>(blockIdx.x) / q_ctas;
  const int j0 = (static_cast<int>(blockIdx.x) % q_ctas) * GMAX;
  const int nq = min(GMAX, a.group - j0);
  const int split = static_cast<int>(blockIdx.y);

  // Query row c at q_index(c): the L scoring lanes of a token read L different channels at once;
  // 16 bytes of padding per segment put them in different banks.
  auto q_index = [](int c) { return c * GMAX + (c / M::seg) * 4; };
  for (int i = tid; i < D * GMAX; i += kDecodeThreads) {
    const int c = i / GMAX, j = i % GMAX;
    s_q[q_index(c) + j] = j < nq ? a.q[(static_cast<std::int64_t>(h) * a.group + j0 + j) * D + c] * a.scale : 0.f;
  }
  if (tid < GMAX) s_stat[tid] = kNegInf, s_stat[GMAX + tid] = 0.f, s_stat[2 * GMAX + tid] = 1.f;
  __syncthreads();
  for (int i = tid; i < D / UNIT * GMAX; i += kDecodeThreads) {
    const int un = i / GMAX, j = i % GMAX;
    float s = 0.f;
    for (int c = 0; c < UNIT; ++c) s += s_q[q_index(un * UNIT + c) + j];
    s_qseg[i] = s;
  }

  const std::int64_t n_tok = min(*a.tokens, static_cast<std::int64_t>(a.blocks.max_blocks) * B);
  const int n_blocks = static_cast<int>((n_tok + B - 1) / B);
  const int units = n_blocks + (a.exact.count + B - 1) / B;
  const int per_split = (units + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int u0 = split * per_split, u1 = min(units, u0 + per_split);
  const int ub = min(u1, n_blocks);

  // PV accumulators of this lane's chunk, every query head (zacc = sum p * zero of the chunk's
  // group). Between blocks they live in shared memory (each thread its own slice, 16-byte
  // accesses, conflict-free), so the scoring phase has the registers to itself: <= 64 registers.
  const typename M::Value pv0 = M::value(warp, lane, 0);
  const int my_chunk = pv0.chunk;
  float acc[GMAX][8], zacc[GMAX];
  auto* s_acc = reinterpret_cast<float4*>(smem + a.smem.acc);  // [2 * GMAX][threads] float4
  float* s_zacc = reinterpret_cast<float*>(smem + a.smem.acc) + 8 * GMAX * kDecodeThreads;  // [GMAX][threads]
  auto store_acc = [&]() {
#pragma unroll
    for (int j = 0; j < GMAX; ++j) {
      s_acc[(2 * j) * kDecodeThreads + tid] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
      s_acc[(2 * j + 1) * kDecodeThreads + tid] = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
      s_zacc[j * kDecodeThreads + tid] = zacc[j];
    }
  };
  // Loads the accumulators and rescales them by the softmax step's correction.
  auto load_acc = [&]() {
#pragma unroll
    for (int j = 0; j < GMAX; ++j) {
      const float corr = s_stat[2 * GMAX + j];
      const float4 x = s_acc[(2 * j) * kDecodeThreads + tid], y = s_acc[(2 * j + 1) * kDecodeThreads + tid];
      acc[j][0] = x.x * corr, acc[j][1] = x.y * corr, acc[j][2] = x.z * corr, acc[j][3] = x.w * corr;
      acc[j][4] = y.x * corr, acc[j][5] = y.y * corr, acc[j][6] = y.z * corr, acc[j][7] = y.w * corr;
      zacc[j] = s_zacc[j * kDecodeThreads + tid] * corr;
    }
  };
#pragma unroll
  for (int j = 0; j < GMAX; ++j) {
    zacc[j] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.f;
  }
  store_acc();

  const std::uint8_t* head_data = a.blocks.data + static_cast<std::int64_t>(h) * a.blocks.max_blocks * a.blocks.block_stride;
  const std::uint64_t* head_valid = a.blocks.valid + static_cast<std::int64_t>(h) * a.blocks.max_blocks * WORDS;
  // Stages block u into buffer `buf` when any of its slots is valid; returns whether it did.
  auto stage = [&](int u, int buf) {
    std::uint64_t any = 0;
#pragma unroll
    for (int i = 0; i < WORDS; ++i) any |= head_valid[static_cast<std::int64_t>(u) * WORDS + i];
    if (tid < WORDS) s_valid[buf * WORDS + tid] = head_valid[static_cast<std::int64_t>(u) * WORDS + tid];
    if (any != 0) {
      const std::uint8_t* src = head_data + static_cast<std::int64_t>(u) * a.blocks.block_stride;
      std::uint8_t* dst = smem + buf * TILE;
#pragma unroll
      for (int i0 = 0; i0 < TILE; i0 += kDecodeThreads * 16)
        if (i0 + tid * 16 < TILE) device_detail::cp_async16(dst + i0 + tid * 16, src + i0 + tid * 16);
    }
    return any != 0;
  };

  bool any_next = u0 < ub && stage(u0, 0);
  device_detail::cp_async_commit();
  bool any_after = u0 + 1 < ub && stage(u0 + 1, 1);
  device_detail::cp_async_commit();
  int buf = 0;
  // block loop (bench/cuda/sass_budget.py counts this loop's body)
  for (int u = u0; u < ub; ++u) {
    const bool any_now = any_next;
    any_next = any_after;
    const int buf2 = buf >= 1 ? buf - 1 : kDecodeStages - 1;  // (buf + 2) % 3
    any_after = u + 2 < ub && stage(u + 2, buf2);
    device_detail::cp_async_commit();
    device_detail::cp_async_wait_group<2>();  // block u (this thread's copies) has landed
    __syncthreads();                           // ... and every thread's
    if (any_now) {
      const std::uint8_t* tile = smem + buf * TILE;
      const std::uint64_t* vw = s_valid + buf * WORDS;
      // Scores: a lane per token (L lanes per token), segment [part * seg, +seg).
#pragma unroll
      for (int r = 0; r < M::score_passes; ++r) {
        const typename M::Score sc = M::score(tid, r);
        const int t = sc.token < B ? sc.token : 0;
        const float* q_lane = s_q + q_index(sc.channel);
        const std::uint8_t* k_lane = tile + t * K_ROW + sc.channel * DK::bits / 8;
        const std::uint8_t* km_lane = tile + K_META + t * (D / DK::group) * DK::meta_bytes;
        float dot[GMAX];
#pragma unroll
        for (int j = 0; j < GMAX; ++j) dot[j] = 0.f;
#pragma unroll
        for (int un = 0; un < M::seg / UNIT; ++un) {
          const int c0 = sc.channel + un * UNIT;
          const GroupParams gp = device_detail::smem_params<DK>(km_lane + (c0 / DK::group) * DK::meta_bytes);
          std::uint32_t w[UNIT * DK::bits / 32];
          device_detail::load_words<UNIT * DK::bits / 32>(k_lane + un * UNIT * DK::bits / 8, w);
          float gd[GMAX];
#pragma unroll
          for (int j = 0; j < GMAX; ++j) gd[j] = 0.f;
#pragma unroll
          for (int ch = 0; ch < UNIT / 8; ++ch) {
            ChunkCodes cc{{w[ch * DK::bits / 4], DK::bits == 8 ? w[ch * 2 + 1] : 0u}};
            float uv[8];
            unpack_units<DK>(cc, uv);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              float qc[GMAX];  // (q_lane + offset: the offset is a compile-time constant)
              device_detail::load_group<GMAX>(q_lane + (un * UNIT + ch * 8 + e) * GMAX, qc);
#pragma unroll
              for (int j = 0; j < GMAX; ++j) gd[j] = fmaf(qc[j], uv[e], gd[j]);
            }
          }
          asm volatile("" ::: "memory");  // keeps the compiler from hoisting every unit's query loads (registers)
          const float* qs = s_qseg + (c0 / UNIT) * GMAX;
#pragma unroll
          for (int j = 0; j < GMAX; ++j) dot[j] = fmaf(gp.scale, gd[j], fmaf(gp.zero, qs[j], dot[j]));
        }
#pragma unroll
        for (int off = 1; off < L; off <<= 1)
#pragma unroll
          for (int j = 0; j < GMAX; ++j) dot[j] += __shfl_xor_sync(0xFFFFFFFFu, dot[j], off);
        if (sc.channel == 0 && sc.token < B) {
          const bool live = ((vw[sc.token >> 6] >> (sc.token & 63)) & 1u) != 0;
#pragma unroll
          for (int j = 0; j < GMAX; ++j) s_p[sc.token * GMAX + j] = live ? dot[j] : kNegInf;
        }
      }
      __syncthreads();
#pragma unroll
      for (int j0w = 0; j0w < GMAX; j0w += kDecodeWarps)
        if (j0w + warp < nq) device_detail::softmax_step<B, GMAX>(s_p, s_stat, j0w + warp, lane);
      __syncthreads();
      load_acc();
      // Values: lane per chunk, tokens over warps.
      if (pv0.active) {
#pragma unroll
        for (int r = 0; r < M::pv_passes; ++r) {
          const int t = M::value(warp, lane, r).token;
          if (t < B) {
            float p[GMAX];
            device_detail::load_group<GMAX>(s_p + t * GMAX, p);
            const GroupParams gp = device_detail::smem_params<DV>(tile + V_META + t * (D / DV::group) * DV::meta_bytes +
                                                                  (my_chunk * 8 / DV::group) * DV::meta_bytes);
            std::uint32_t w[2];
            device_detail::load_words<DV::bits / 4>(tile + V_CODES + t * V_ROW + my_chunk * DV::bits, w);
            float uv[8];
            unpack_units<DV>(ChunkCodes{{w[0], DV::bits == 8 ? w[1] : 0u}}, uv);
#pragma unroll
            for (int j = 0; j < GMAX; ++j) {
              zacc[j] = fmaf(p[j], gp.zero, zacc[j]);
              const float ps = p[j] * gp.scale;
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[j][e] = fmaf(ps, uv[e], acc[j][e]);
            }
          }
        }
      }
      store_acc();
    }
    __syncthreads();  // buffer `buf` and the scores are reused by the next iteration
    buf = buf == kDecodeStages - 1 ? 0 : buf + 1;
  }
  device_detail::cp_async_wait_all();  // nothing may stay in flight (the last groups are empty)

  // The fp32 exact rows (sinks, residual window, the current token): not the hot path.
  for (int u = max(u0, n_blocks); u < u1; ++u) {
    const int r0 = (u - n_blocks) * B, n_rows = min(B, a.exact.count - r0);
    const float* ek = a.exact.k + static_cast<std::int64_t>(r0) * a.exact.stride + static_cast<std::int64_t>(h) * D;
    const float* ev = a.exact.v + static_cast<std::int64_t>(r0) * a.exact.stride + static_cast<std::int64_t>(h) * D;
    for (int r = 0; r < M::score_passes; ++r) {
      const typename M::Score sc = M::score(tid, r);
      const int t = sc.token < n_rows ? sc.token : 0;
      float dot[GMAX];
#pragma unroll
      for (int j = 0; j < GMAX; ++j) dot[j] = 0.f;
      for (int c = sc.channel; c < sc.channel + M::seg; ++c) {
        const float k = ek[static_cast<std::int64_t>(t) * a.exact.stride + c];
#pragma unroll
        for (int j = 0; j < GMAX; ++j) dot[j] = fmaf(s_q[q_index(c) + j], k, dot[j]);
      }
#pragma unroll
      for (int off = 1; off < L; off <<= 1)
#pragma unroll
        for (int j = 0; j < GMAX; ++j) dot[j] += __shfl_xor_sync(0xFFFFFFFFu, dot[j], off);
      if (sc.channel == 0 && sc.token < B) {
#pragma unroll
        for (int j = 0; j < GMAX; ++j) s_p[sc.token * GMAX + j] = sc.token < n_rows ? dot[j] : kNegInf;
      }
    }
    __syncthreads();
    for (int j = warp; j < nq; j += kDecodeWarps) device_detail::softmax_step<B, GMAX>(s_p, s_stat, j, lane);
    __syncthreads();
    load_acc();
    if (pv0.active) {
      for (int r = 0; r < M::pv_passes; ++r) {
        const int t = M::value(warp, lane, r).token;
        if (t >= n_rows) continue;
        float p[GMAX];
        device_detail::load_group<GMAX>(s_p + t * GMAX, p);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float v = ev[static_cast<std::int64_t>(t) * a.exact.stride + my_chunk * 8 + e];
#pragma unroll
          for (int j = 0; j < GMAX; ++j) acc[j][e] = fmaf(p[j], v, acc[j][e]);
        }
      }
    }
    store_acc();
    __syncthreads();
  }

  {
    // Reload without rescaling (corr = 1 after the last step is not guaranteed: read it raw).
#pragma unroll
    for (int j = 0; j < GMAX; ++j) {
      const float4 x = s_acc[(2 * j) * kDecodeThreads + tid], y = s_acc[(2 * j + 1) * kDecodeThreads + tid];
      acc[j][0] = x.x, acc[j][1] = x.y, acc[j][2] = x.z, acc[j][3] = x.w;
      acc[j][4] = y.x, acc[j][5] = y.y, acc[j][6] = y.z, acc[j][7] = y.w;
      zacc[j] = s_zacc[j * kDecodeThreads + tid];
    }
  }
  __syncthreads();  // region 0 (staged blocks) becomes the reduction buffer
  // Reduce: zero-point sums into the chunk, then lanes with the same chunk (xor over the token
  // bits of the lane), then warps in a fixed order (deterministic), into region 0.
#pragma unroll
  for (int j = 0; j < GMAX; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] += zacc[j];
#pragma unroll
  for (int off = M::chunks; off < 32; off <<= 1)
#pragma unroll
    for (int j = 0; j < GMAX; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[j][e] += __shfl_xor_sync(0xFFFFFFFFu, acc[j][e], off);
  float* s_red = reinterpret_cast<float*>(smem);  // [GMAX][D]
  for (int i = tid; i < GMAX * D; i += kDecodeThreads) s_red[i] = 0.f;
  __syncthreads();
  for (int w = 0; w < kDecodeWarps; ++w) {
    if (warp == w && lane < M::chunks && pv0.active) {
#pragma unroll
      for (int j = 0; j < GMAX; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) s_red[j * D + my_chunk * 8 + e] += acc[j][e];
    }
    __syncthreads();
  }
  for (int i = tid; i < nq * D; i += kDecodeThreads) {
    const std::int64_t qh = static_cast<std::int64_t>(h) * a.group + j0 + i / D;
    a.part_acc[(qh * a.n_splits + split) * D + i % D] = s_red[i];
  }
  if (tid < nq) {
    const std::int64_t qh = static_cast<std::int64_t>(h) * a.group + j0 + tid;
    a.part_m[qh * a.n_splits + split] = s_stat[tid];
    a.part_l[qh * a.n_splits + split] = s_stat[GMAX + tid];
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

}  // namespace kvpack::cuda
