// Host-side plan of the CUDA decode kernel (kernels/cuda/decode_kernel.cuh): the thread-to-data
// mapping, the shared-memory layout and the check that it fits, the split-K partition, and the
// once-per-device opt-in to large dynamic shared memory. Pure functions of the cache type and
// shape, so they compile as plain C++20 (g++, clang++) and are unit-tested on the host
// (tests/test_cuda_helpers.cpp); the kernel uses the same functions, so host and device agree by
// construction.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "kvpack/cache/block.hpp"
#include "kvpack/config.hpp"
#include "kvpack/result.hpp"

namespace kvpack::cuda {

inline constexpr int kDecodeWarps = 4;                     ///< warps per decode CTA
inline constexpr int kDecodeThreads = 32 * kDecodeWarps;  ///< threads per decode CTA
inline constexpr int kDecodeStages = 3;                    ///< staged blocks: one computed, two in flight
/// CTAs per SM the decode kernel is compiled for: 8 x 128 threads = 50 % occupancy (<= 64
/// registers) up to 4 query heads per CTA; 8 heads keep 64 accumulators live while adding
/// p * v, so they get 128 registers (25 %) rather than spilling in the hot loop.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr int decode_min_ctas_per_sm(int heads_per_cta) noexcept {
  return heads_per_cta >= 8 ? 4 : 8;
}
inline constexpr int kMaxGroupPerCta = 8;                  ///< query heads one CTA scores (larger groups: several CTAs)
inline constexpr int kMaxGroup = 16;                       ///< largest GQA group of the device kernels
inline constexpr int kMaxSplits = 65535;                   ///< grid.y limit

/// Head dimensions with a compiled decode kernel (head_dim is a template parameter so that every
/// loop over channels unrolls; see bench/cuda/sass_budget.py).
[[nodiscard]] constexpr bool decode_head_dim_supported(int d) noexcept { return d == 64 || d == 128 || d == 256; }

/// Thread-to-data mapping of the decode kernel for B tokens per block and head_dim D.
///  * Scores (Q.K): thread i scores token i / lanes_per_token (plus tokens_per_pass * r for pass
///    r) over channels [part * seg, (part + 1) * seg), part = i % lanes_per_token. The
///    lanes_per_token partial dots of a token are adjacent lanes, summed by log2(lanes_per_token)
///    xor-shuffles (one level at B = 64).
///  * Values (P.V): lane l of warp w owns channels 8 * (l % (D / 8)) .. + 7 (one chunk, inside one
///    group as every group size is a power of two >= 8) of token w * pv_tokens_per_warp + l / (D / 8)
///    (+ kDecodeWarps * pv_tokens_per_warp * r for pass r).
template <int B, int D>
struct DecodeMapping {
  static_assert(B >= 8 && (B & (B - 1)) == 0 && D % 8 == 0 && D <= 256, "DecodeMapping: B a power of two >= 8, head_dim <= 256");
  static constexpr int lanes_per_token = [] {
    int l = B >= kDecodeThreads ? 1 : kDecodeThreads / B;
    return l > D / 8 ? D / 8 : l;
  }();
  static constexpr int seg = D / lanes_per_token;                    ///< channels per scoring lane
  static constexpr int tokens_per_pass = kDecodeThreads / lanes_per_token;
  static constexpr int score_passes = (B + tokens_per_pass - 1) / tokens_per_pass;
  static constexpr int chunks = D / 8;                               ///< 8-channel chunks of a row
  static constexpr int pv_tokens_per_warp = 32 / chunks > 0 ? 32 / chunks : 1;
  static constexpr int pv_lanes = chunks < 32 ? chunks * pv_tokens_per_warp : 32;
  static constexpr int pv_passes = (B + kDecodeWarps * pv_tokens_per_warp - 1) / (kDecodeWarps * pv_tokens_per_warp);

  /// Token and first channel scored by thread `tid` in pass `r` (token >= B: idle).
  struct Score {
    int token, channel;
  };
  [[nodiscard]] KVPACK_HOST_DEVICE static constexpr Score score(int tid, int r) noexcept {
    return {tid / lanes_per_token + r * tokens_per_pass, (tid % lanes_per_token) * seg};
  }
  /// Token and channel chunk of lane `lane` of warp `warp` in P.V pass r (inactive lanes: none
  /// when D / 8 divides 32, as for D = 64, 128, 256).
  struct Value {
    int token, chunk;
    bool active;
  };
  [[nodiscard]] KVPACK_HOST_DEVICE static constexpr Value value(int warp, int lane, int r) noexcept {
    const int sub = chunks >= 32 ? 0 : lane / chunks;
    const int chunk = chunks >= 32 ? lane : lane % chunks;
    return {r * kDecodeWarps * pv_tokens_per_warp + warp * pv_tokens_per_warp + sub, chunk, lane < pv_lanes};
  }
};

/// Byte offsets of the decode kernel's dynamic shared memory (all 16-aligned). Region 0 holds the
/// kDecodeStages staged blocks, later reused for the cross-warp reduction.
struct DecodeSmem {
  std::size_t tile_bytes = 0;  ///< one staged block: BlockLayout bytes up to the positions, rounded to 16
  std::size_t tiles = 0, q = 0, qseg = 0, p = 0, stat = 0, valid = 0, acc = 0, total = 0;
};

[[nodiscard]] KVPACK_HOST_DEVICE constexpr std::size_t round16(std::size_t n) noexcept { return (n + 15) / 16 * 16; }

/// Shared-memory layout for a cache block layout and GMAX query heads per CTA.
[[nodiscard]] constexpr DecodeSmem decode_smem(const BlockLayout& L, int gmax) noexcept {
  DecodeSmem s;
  const auto D = static_cast<std::size_t>(L.head_dim), B = static_cast<std::size_t>(L.tokens);
  const auto G = static_cast<std::size_t>(gmax);
  s.tile_bytes = round16(L.positions);
  const std::size_t tiles = kDecodeStages * s.tile_bytes, red = G * D * sizeof(float);
  s.tiles = 0;
  s.q = round16(tiles > red ? tiles : red);
  s.qseg = s.q + round16((D * G + D / 8 * 4) * sizeof(float));  // 16 bytes of padding per scoring segment
  s.p = s.qseg + round16(D / 8 * G * sizeof(float));  // one query sum per scoring unit (>= 8 channels)
  s.stat = s.p + round16(B * G * sizeof(float));
  s.valid = s.stat + round16(3 * G * sizeof(float));
  s.acc = s.valid + round16(kDecodeStages * (B + 63) / 64 * sizeof(std::uint64_t));
  s.total = s.acc + kDecodeThreads * G * 9 * sizeof(float);  // per thread: acc[G][8], zacc[G]
  return s;
}

/// Query heads one decode CTA scores for GQA group `group` (the kernel's GMAX): the power of two
/// >= group, at most kMaxGroupPerCta (group 16: two CTAs per KV head).
[[nodiscard]] constexpr int decode_heads_per_cta(int group) noexcept {
  int g = 1;
  while (g < group && g < kMaxGroupPerCta) g <<= 1;
  return g;
}

/// The decode kernel's shared memory for a cache type (KVCache<...>: its codecs and Blocks<B>)
/// and a model shape: a pure function of both, so create() can refuse a shape that can never
/// launch, and tests can check it without a GPU.
template <class HostCache>
[[nodiscard]] DecodeSmem decode_smem_for(int head_dim, int group) {
  const BlockLayout L = make_block_layout<typename HostCache::key_codec, typename HostCache::value_codec, false>(
      HostCache::block_tokens, head_dim, HostCache::slot_positions || HostCache::pre_rope);  // DeviceCache's layout
  return decode_smem(L, decode_heads_per_cta(group));
}

/// OK when `bytes` of dynamic shared memory fit the device's per-block opt-in limit
/// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 232448 on H100/H200, 166912 on A100); otherwise
/// Errc::unsupported naming both sizes and what to change.
[[nodiscard]] inline Status check_decode_fits(std::size_t bytes, std::size_t optin_limit, int block_tokens) {
  if (bytes <= optin_limit) return {};
  return fail(Errc::unsupported, "DeviceCache::create: the decode kernel needs " + std::to_string(bytes) +
                                     " bytes of shared memory (" + std::to_string(kDecodeStages) +
                                     " staged blocks of Blocks<" + std::to_string(block_tokens) +
                                     "> plus working space), more than the device's " + std::to_string(optin_limit) +
                                     " per block; use a smaller Blocks<B>");
}

/// Split-K partition of `units` tiles into at most `max_splits` splits (requested: 0 = about
/// 4 CTAs per SM over all KV-head CTAs). Every split gets tiles_per_split tiles (the last fewer).
struct SplitPlan {
  int splits = 1, tiles_per_split = 0;
};
[[nodiscard]] constexpr SplitPlan plan_splits(int units, int requested, int sms, int head_ctas, int max_splits) noexcept {
  SplitPlan p;
  if (units <= 0) return p;
  int s = requested > 0 ? requested : (4 * sms + head_ctas - 1) / head_ctas;
  s = s < 1 ? 1 : s;
  s = s > units ? units : s;
  s = s > max_splits ? max_splits : s;
  p.tiles_per_split = (units + s - 1) / s;
  p.splits = (units + p.tiles_per_split - 1) / p.tiles_per_split;
  return p;
}

/// Remembers, per device and per kernel instantiation, the largest dynamic shared memory size
/// already granted with cudaFuncSetAttribute (the attribute is per device). Thread-safe: a
/// launch that needs more calls `raise` under a lock, so no thread launches before the attribute
/// it needs is set. Devices >= kDevices always call `raise`.
class SmemOptIn {
 public:
  static constexpr int kDevices = 64;
  /// Calls raise(bytes) (returning Status) unless `device` already has >= bytes; records success.
  template <class Raise>
  Status ensure(int device, std::size_t bytes, Raise&& raise) {
    if (device < 0 || device >= kDevices) return raise(bytes);
    auto& slot = granted_[static_cast<std::size_t>(device)];
    if (slot.load(std::memory_order_acquire) >= bytes) return {};
    const std::lock_guard<std::mutex> lock(mutex_);
    if (slot.load(std::memory_order_relaxed) >= bytes) return {};
    Status s = raise(bytes);
    if (s) slot.store(bytes, std::memory_order_release);
    return s;
  }

 private:
  std::array<std::atomic<std::size_t>, kDevices> granted_{};
  std::mutex mutex_;
};

}  // namespace kvpack::cuda
