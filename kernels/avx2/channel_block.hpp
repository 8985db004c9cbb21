// AVX2 decode over whole blocks of per-channel keys (KIVI, KVQuant: Keys<Int*, PerChannel>): the
// block path of attend_avx2 for caches whose key scales and zero-points run along channels, one
// set per group of G = KC::group_size tokens (BlockLayout::k_meta_group).
//
// Inside a token group every key row shares its channels' parameters, x̂_tc = s_c u_tc + z_c
// (u the integer level, z 0 for symmetric codecs), so for a query state q
//     q . x̂_t = Σ_c (q_c s_c) u_tc + Σ_c q_c z_c.
// The query is scaled by the group's channel scales once per group (D multiplies per G tokens)
// and the zero-point term is one sum per group; each key row then costs the conversion of its
// codes to levels (shared by every state) and one FMA per 8 channels and state. No dequantized
// key tile is written and no query is quantized: the scores are fp32, within fp32 rounding of
// the scalar kernel as the tile path's (kernels::query_int8_group stays 0 for per-channel keys).
// Softmax and P·V are the per-token block path's (int_block.hpp: chunks of 64 tokens, one
// online-softmax update per chunk, INT4/INT8 values with their scales folded into the weights).
// Only compiled when KVPACK_HAS_AVX2 (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kvpack/cache/block.hpp"
#include "kvpack/kernels/avx2/codes.hpp"
#include "kvpack/kernels/avx2/int_block.hpp"
#include "kvpack/kernels/avx2/math.hpp"
#include "kvpack/kernels/simd_common.hpp"

namespace kvpack::kernels::avx2 {

/// Per-channel key codecs the channel block path scores from their levels: the integer codecs
/// (2, 3, 4, 8 bits) with token groups of a multiple of 8 tokens.
template <class C>
inline constexpr bool channel_block_key = [] {
  if constexpr (kBlockPath && simd::IntCodecFamily<C>) return C::group_size % 8 == 0;
  else return false;
}();

/// Working memory of the channel block path: the per-token block path's (softmax, values) plus
/// the fp32 queries, their copies scaled by the current token group's channel scales, and the
/// group's zero-point terms.
struct ChannelBlockMemory {
  IntBlockMemory w;       ///< scores, weights, value scratch (int_block.hpp); its q16 / a / b unused
  float* q = nullptr;     ///< [n_states][D] the queries
  float* qs = nullptr;    ///< [n_states][D] q_c * s_c of the current token group
  float* qz = nullptr;    ///< [n_states] Σ_c q_c z_c of the current token group
  float* scale = nullptr; ///< [D] the current group's channel scales
  float* zero = nullptr;  ///< [D] ... and zero-points
  float* tmp = nullptr;   ///< [2 D] metadata decode scratch
};

/// Copies the queries of every state (q_of(st): D floats) and returns the channel block path's
/// working memory (grown in s, never shrunk; may throw std::bad_alloc).
template <class QueryOf>
ChannelBlockMemory channel_block_prepare(QueryOf&& q_of, int n_states, int D, Scratch& s) {
  const auto ns = static_cast<std::size_t>(n_states), Dz = static_cast<std::size_t>(D);
  ChannelBlockMemory c;
  c.w = int_block_memory(n_states, D, 1, s);
  const std::size_t need = 2 * ns * Dz + ns + 4 * Dz;
  if (s.channel_work.size() < need) s.channel_work.resize(need);
  float* p = s.channel_work.data();
  auto take = [&](std::size_t n) { float* r = p; p += n; return r; };
  c.q = take(ns * Dz);
  c.qs = take(ns * Dz);
  c.qz = take(ns);
  c.scale = take(Dz);
  c.zero = take(Dz);
  c.tmp = take(2 * Dz);
  for (int st = 0; st < n_states; ++st) std::copy_n(q_of(st), D, c.q + static_cast<std::size_t>(st) * Dz);
  return c;
}

namespace channel_block_detail {

/// The integer levels of elements [e, e + 8) of a key row as floats (x̂ = s * level + z).
template <class C>
[[nodiscard]] inline __m256 levels8(const std::byte* row, std::size_t e) noexcept {
  return decode8<C>(row, e, _mm256_set1_ps(1.f), _mm256_setzero_ps());
}

/// Scales the queries by token group `group`'s channel parameters: c.qs = q * s, c.qz = Σ q z.
template <class KC, int D>
void scale_queries(const ChannelBlockMemory& c, int n_states, const std::byte* data, const BlockLayout& L, int group) {
  load_channel_params<KC>(data + L.k_meta + static_cast<std::size_t>(group) * L.k_meta_group, D, c.scale, c.zero, c.tmp);
  for (int st = 0; st < n_states; ++st) {
    const float* q = c.q + static_cast<std::size_t>(st) * D;
    float* qs = c.qs + static_cast<std::size_t>(st) * D;
    __m256 z = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      _mm256_storeu_ps(qs + d, _mm256_mul_ps(qv, _mm256_loadu_ps(c.scale + d)));
      if constexpr (KC::asymmetric) z = _mm256_fmadd_ps(qv, _mm256_loadu_ps(c.zero + d), z);
    }
    c.qz[st] = avx2_detail::hsum(z);
  }
}

/// Logits of tokens [t0, t0 + n) of a block (n <= kBlockChunk, t0 a multiple of kBlockChunk) for
/// every state: c.w.scores[st * kBlockChunk + t] = q_st . x̂_{t0 + t} * attn_scale. `group` holds
/// the token group whose parameters c.qs / c.qz hold (-1: none yet); updated.
template <class KC, int D>
void channel_logits(const ChannelBlockMemory& c, int n_states, const std::byte* data, const BlockLayout& L, int t0, int n,
                    float attn_scale, int& group) {
  constexpr int G = KC::group_size;
  const IntBlockMemory& w = c.w;
  for (int o0 = 0; o0 < n; o0 += 8) {
    const int g = (t0 + o0) / G;  // 8 tokens never straddle a group: G % 8 == 0
    if (g != group) {
      scale_queries<KC, D>(c, n_states, data, L, g);
      group = g;
    }
    for (int tt = 0; tt < 8; ++tt) {
      if (o0 + tt >= n) {
        for (int st = 0; st < n_states; ++st) _mm256_storeu_ps(w.partial + (st * 8 + tt) * 8, _mm256_setzero_ps());
        continue;
      }
      const std::byte* row = data + L.k_codes + static_cast<std::size_t>(t0 + o0 + tt) * L.k_row;
      // Four states at a time keep their sums in registers; each converts the row's levels once.
      for (int st = 0; st < n_states; st += 4) {
        const int js = std::min(4, n_states - st);
        __m256 r[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int d = 0; d < D; d += 8) {
          const __m256 u = levels8<KC>(row, static_cast<std::size_t>(d));
          for (int j = 0; j < js; ++j)
            r[j] = _mm256_fmadd_ps(_mm256_loadu_ps(c.qs + static_cast<std::size_t>(st + j) * D + d), u, r[j]);
        }
        for (int j = 0; j < js; ++j) _mm256_storeu_ps(w.partial + ((st + j) * 8 + tt) * 8, r[j]);
      }
    }
    for (int st = 0; st < n_states; ++st) {
      __m256 v8[8];
      for (int i = 0; i < 8; ++i) v8[i] = _mm256_loadu_ps(w.partial + (st * 8 + i) * 8);
      const __m256 sums = _mm256_add_ps(avx2_detail::reduce8(v8), _mm256_set1_ps(c.qz[st]));
      _mm256_storeu_ps(w.scores + st * kBlockChunk + o0, _mm256_mul_ps(sums, _mm256_set1_ps(attn_scale)));
    }
  }
}

}  // namespace channel_block_detail

/// int_block_attend for per-channel keys (channel_block_key<KC>): attends every state to the
/// `count` tokens of one block (a multiple of the token group, as per-channel blocks commit)
/// that all of them see in full; same contract (bias, m, l, acc, `next` prefetch, overflow).
template <class Isa, class KC, class VC, int D>
bool channel_block_attend(const ChannelBlockMemory& c, int n_states, const std::byte* data, const BlockLayout& L,
                          int count, float attn_scale, const float* bias, float* m, float* l, float* acc,
                          const std::byte* next) {
  using namespace int_block_detail;
  bool overflow = false;
  int group = -1;
  if (next != nullptr)  // the next block's first lines: blocks are not adjacent in memory
    for (std::size_t i = 0; i < std::min<std::size_t>(L.bytes, 4096); i += 64)
      _mm_prefetch(reinterpret_cast<const char*>(next + i), _MM_HINT_T1);
  for (int t0 = 0; t0 < count; t0 += kBlockChunk) {
    const int n = std::min(kBlockChunk, count - t0);
    channel_block_detail::channel_logits<KC, D>(c, n_states, data, L, t0, n, attn_scale, group);
    if (bias != nullptr)
      for (int st = 0; st < n_states; ++st)
        for (int t = 0; t < n; ++t) c.w.scores[st * kBlockChunk + t] += bias[t0 + t];
    overflow |= block_softmax(c.w, n_states, n, m, l);
    block_values<Isa, VC, D>(c.w, n_states, data, L, t0, n, acc);
  }
  return overflow;
}

}  // namespace kvpack::kernels::avx2

#endif  // KVPACK_HAS_AVX2
