// AVX2 decode over whole blocks of per-token integer keys: the block path of attend_avx2.
//
// A block every query sees in full (decode, or a chunk past its end), with no slot mask or
// key_mass (an additive mask is added to the logits), is attended in chunks of 64 tokens with one
// online-softmax update per chunk and per state (the tile path updates every 16 keys):
//   1. Q·K from the codes: the query is quantized once per attend call, per key group, to int16,
//      q ≈ σ q16 with σ = max|q_g| / 32767 (error <= σ / 2 = max|q_g| / 65534 per element,
//      within kernels::query_int_error); each 32-code chunk of a key row is widened to int16 and
//      multiplied by vpdpwssd (AVX-VNNI / AVX-512 VNNI) or vpmaddwd, so no product saturates and
//      signed INT8 needs no sign trick. Per token t and key group g, with x̂ = z'_tg + s_tg w
//      (w the widened code, z' = zero - offset * scale):
//          q . x̂ = s_tg σ_g Σ q16 w + z'_tg σ_g Σ q16.
//      The group sums of a token are combined with vphaddd, scaled in fp32, and eight tokens are
//      reduced together (lanes = tokens).
//   2. Softmax over the chunk's logits per state (exp on 8 lanes), the accumulator rescaled once.
//   3. P·V: INT4/INT8 values with groups of 32k channels are never dequantized: the weight of a
//      token and value group is p_t s_tg, the zero-points add Σ_t p_t z'_tg per group, and the
//      codes are converted to fp32 in code order (INT4: even elements, then odd ones) and
//      accumulated as such, reordered once per chunk. Other value codecs are decoded 16 rows at a
//      time and accumulated as in the tile path.
// Every step is exact in fp32 except the query's int16 rounding, so the error bound is the one
// kernels::query_int8_group documents; values add only fp32 rounding (no weight quantization).
// Only compiled when KVPACK_HAS_AVX2 (config.hpp).
#pragma once

#include "kvpack/config.hpp"

#if KVPACK_HAS_AVX2

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kvpack/cache/block.hpp"
#include "kvpack/kernels/avx2/codes.hpp"
#include "kvpack/kernels/avx2/int_block_codes.hpp"
#include "kvpack/kernels/avx2/math.hpp"
#include "kvpack/kernels/scalar/attention.hpp"
#include "kvpack/kernels/simd_common.hpp"

namespace kvpack::kernels::avx2 {

/// The block path is on unless the translation unit defines KVPACK_AVX2_BLOCK_PATH=0 (then
/// every block takes the tile path: fp32 scores, within 1e-5 of the scalar kernel).
#if defined(KVPACK_AVX2_BLOCK_PATH) && !KVPACK_AVX2_BLOCK_PATH
inline constexpr bool kBlockPath = false;
#else
inline constexpr bool kBlockPath = true;
#endif

/// Key codecs the block path scores from their codes: per-token INT4/INT8, groups of 32, 64 or
/// 128 channels (head_dim 64, 128 or 256; other head dims take the tile path).
template <class C>
inline constexpr bool int_block_key = [] {
  if constexpr (kBlockPath && simd::IntCodecFamily<C>)
    return (C::bits == 4 || C::bits == 8) && C::group_size % 32 == 0 && C::group_size <= 128 &&
           (C::group_size & (C::group_size - 1)) == 0;
  else
    return false;
}();
/// Value codecs whose scales are folded into the softmax weights (codes converted, never
/// dequantized): INT4/INT8 with groups of 32k channels.
template <class C>
inline constexpr bool int_block_value = [] {
  if constexpr (simd::IntCodecFamily<C>)
    return (C::bits == 4 || C::bits == 8) && C::group_size % 32 == 0;
  else
    return false;
}();

/// Tokens per softmax update of the block path.
inline constexpr int kBlockChunk = 64;
/// Most query states (queries x GQA group) the block path takes; more take the tile path, whose
/// scratch does not grow with states x tokens.
inline constexpr int kBlockMaxStates = 32;

/// Working memory of the block path, carved from kernels::Scratch by int_block_prepare.
struct IntBlockMemory {
  std::int16_t* q16 = nullptr;  ///< [n_states][D] quantized queries, key_chunk order
  float* a = nullptr;           ///< [n_states][batches][8] lanes of σ_g
  float* b = nullptr;           ///< [n_states][batches][8] lanes of σ_g Σ q16 / lanes per group
  float* partial = nullptr;     ///< [n_states][8][8] per-token lane sums of 8 tokens
  float* scores = nullptr;      ///< [n_states][kBlockChunk] logits, then weights p / l
  float* ratio = nullptr;       ///< [n_states] accumulator rescale of the chunk
  float* vparams = nullptr;     ///< [kBlockChunk][2][8] value scales and z' per value group
  float* weights = nullptr;     ///< [n_states][kBlockChunk][8] p_t s_tg
  float* zsum = nullptr;        ///< [n_states][8] Σ_t p_t z'_tg
  float* tmp = nullptr;         ///< [n_states][D] chunk output in code order / decoded V tile
  float* order = nullptr;       ///< [D] one state's output reordered
};

/// The block path's working memory for n_states states, head_dim D and `batches` key batches
/// (groups of 4 key groups; the query arrays a, b), carved from s (grown, never shrunk; may
/// throw std::bad_alloc). The quantized queries are not filled in (int_block_prepare does).
inline IntBlockMemory int_block_memory(int n_states, int D, int batches, Scratch& s) {
  const auto ns = static_cast<std::size_t>(n_states), Dz = static_cast<std::size_t>(D);
  const auto nb = static_cast<std::size_t>(batches);
  if (s.q_int16.size() < ns * Dz) s.q_int16.resize(ns * Dz);
  const std::size_t need = 2 * ns * nb * 8 + ns * 64 + ns * kBlockChunk + ns + kBlockChunk * 16 +
                           ns * kBlockChunk * 8 + ns * 8 + std::max<std::size_t>(ns, 16) * Dz + Dz;
  if (s.block_work.size() < need) s.block_work.resize(need);
  IntBlockMemory w;
  w.q16 = s.q_int16.data();
  float* p = s.block_work.data();
  auto take = [&](std::size_t n) { float* r = p; p += n; return r; };
  w.a = take(ns * nb * 8);
  w.b = take(ns * nb * 8);
  w.partial = take(ns * 64);
  w.scores = take(ns * kBlockChunk);
  w.ratio = take(ns);
  w.vparams = take(kBlockChunk * 16);
  w.weights = take(ns * kBlockChunk * 8);
  w.zsum = take(ns * 8);
  w.tmp = take(std::max<std::size_t>(ns, 16) * Dz);
  w.order = take(Dz);
  return w;
}

/// Quantizes the queries of every state (q_of(st): D floats) for key codec C and returns the
/// block path's working memory (grown in s, never shrunk; may throw std::bad_alloc).
template <class C, class QueryOf>
IntBlockMemory int_block_prepare(QueryOf&& q_of, int n_states, int D, Scratch& s) {
  using namespace int_block_detail;
  constexpr int G = C::group_size;
  const int ng = D / G, per_batch = std::min(ng, 4), batches = (ng + 3) / 4;
  const auto Dz = static_cast<std::size_t>(D), nb = static_cast<std::size_t>(batches);
  IntBlockMemory w = int_block_memory(n_states, D, batches, s);
  for (int st = 0; st < n_states; ++st) {
    const float* q = q_of(st);
    std::int16_t* q16 = w.q16 + static_cast<std::size_t>(st) * Dz;
    for (int g = 0; g < ng; ++g) {
      float amax = 0.f;
      for (int d = 0; d < G; ++d) amax = std::max(amax, std::fabs(q[g * G + d]));
      const float sigma = amax / 32767.f, inv = amax > 0.f ? 32767.f / amax : 0.f;
      int sum = 0;
      for (int c = g * G; c < (g + 1) * G; c += 32)
        for (int p32 = 0; p32 < 32; ++p32) {
          const int v = std::clamp(static_cast<int>(std::nearbyint(q[c + key_element<C>(p32)] * inv)), -32767, 32767);
          q16[c + p32] = static_cast<std::int16_t>(v);
          sum += v;
        }
      const int b = g / 4, in_batch = g % 4;
      for (int lane = 0; lane < 8; ++lane) {
        if (lane_group(per_batch, lane) != in_batch) continue;
        const std::size_t at = (static_cast<std::size_t>(st) * nb + static_cast<std::size_t>(b)) * 8 + lane;
        w.a[at] = sigma;
        w.b[at] = sigma * static_cast<float>(sum) / static_cast<float>(8 / per_batch);
      }
    }
  }
  return w;
}

namespace int_block_detail {

/// Logits (unscaled by the softmax scale) of n <= kBlockChunk tokens from `row0` for every state:
/// w.scores[st * kBlockChunk + t] = q_st . x̂_t * attn_scale.
template <class KC, int D>
void block_logits(const IntBlockMemory& w, int n_states, const std::byte* codes, std::size_t k_row,
                  const std::byte* meta, std::size_t meta_row, int n, float attn_scale, const std::byte* next,
                  std::size_t next_bytes) {
  const std::size_t next_lines = (next_bytes + 63) / 64, per_token = (next_lines + n - 1) / static_cast<std::size_t>(n);
  constexpr int G = KC::group_size, NG = D / G, PB = NG < 4 ? NG : 4, NB = (NG + 3) / 4;
  constexpr int PER = KC::asymmetric ? 2 : 1, OFF = code_offset<KC>;
  alignas(32) std::int32_t idx_s[8], idx_z[8];
  for (int lane = 0; lane < 8; ++lane) {
    idx_s[lane] = lane_group(PB, lane) * PER;
    idx_z[lane] = lane_group(PB, lane) * PER + (PER - 1);
  }
  const __m256i is = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx_s));
  const __m256i iz = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx_z));
  const __m256 off = _mm256_set1_ps(static_cast<float>(OFF));
  for (int o0 = 0; o0 < n; o0 += 8) {
    for (int tt = 0; tt < 8; ++tt) {
      if (o0 + tt >= n) {
        for (int st = 0; st < n_states; ++st) _mm256_storeu_ps(w.partial + (st * 8 + tt) * 8, _mm256_setzero_ps());
        continue;
      }
      const auto t = static_cast<std::size_t>(o0 + tt);
      if (next != nullptr)  // the next block, a few lines per token: misses overlap with this work
        for (std::size_t i = t * per_token; i < std::min(next_lines, (t + 1) * per_token); ++i)
          _mm_prefetch(reinterpret_cast<const char*>(next + 64 * i), _MM_HINT_T1);
      __m256 S[NB], Z[NB];
      simd::static_for<NB>([&](auto b) {
        constexpr std::size_t at = decltype(b)::value * 4 * PER * KC::meta_type::bytes;
        const __m256 m = meta_floats<typename KC::meta_type, PB * PER>(meta + t * meta_row + at);
        S[b] = _mm256_permutevar8x32_ps(m, is);
        const __m256 zero = PER == 2 ? _mm256_permutevar8x32_ps(m, iz) : _mm256_setzero_ps();
        Z[b] = _mm256_fnmadd_ps(off, S[b], zero);
      });
      __m256i lo[D / 32], hi[D / 32];
      const std::byte* row = codes + t * k_row;
      simd::static_for<D / 32>([&](auto c) { key_chunk<KC>(row, c(), lo[c], hi[c]); });
      for (int st = 0; st < n_states; ++st) {
        const std::int16_t* q = w.q16 + static_cast<std::size_t>(st) * D;
        const float* a = w.a + static_cast<std::size_t>(st) * NB * 8;
        const float* bz = w.b + static_cast<std::size_t>(st) * NB * 8;
        __m256 r = _mm256_setzero_ps();
        simd::static_for<NB>([&](auto b) {
          __m256i g4[PB];
          simd::static_for<PB>([&](auto gg) {
            constexpr int g = decltype(b)::value * 4 + decltype(gg)::value;
            __m256i x = _mm256_setzero_si256();
            simd::static_for<G / 32>([&](auto k) {
              constexpr int c = g * (G / 32) + decltype(k)::value;
              x = dot_s16(x, lo[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * c)));
              x = dot_s16(x, hi[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * c + 16)));
            });
            g4[gg] = x;
          });
          __m256i v;
          if constexpr (PB == 1) v = g4[0];
          else if constexpr (PB == 2) v = _mm256_hadd_epi32(g4[0], g4[1]);
          else v = _mm256_hadd_epi32(_mm256_hadd_epi32(g4[0], g4[1]), _mm256_hadd_epi32(g4[2], g4[3]));
          const __m256 mul = _mm256_mul_ps(S[b], _mm256_loadu_ps(a + b() * 8));
          const __m256 add = _mm256_mul_ps(Z[b], _mm256_loadu_ps(bz + b() * 8));
          r = _mm256_add_ps(r, _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), mul, add));
        });
        _mm256_storeu_ps(w.partial + (st * 8 + tt) * 8, r);
      }
    }
    const __m256 sc = _mm256_set1_ps(attn_scale);
    for (int st = 0; st < n_states; ++st) {
      __m256 v8[8];
      for (int i = 0; i < 8; ++i) v8[i] = _mm256_loadu_ps(w.partial + (st * 8 + i) * 8);
      _mm256_storeu_ps(w.scores + st * kBlockChunk + o0, _mm256_mul_ps(avx2_detail::reduce8(v8), sc));
    }
  }
}

/// Online-softmax update of every state with the n logits in w.scores: w.scores becomes the
/// weights p / l (0 past n), w.ratio the factor of the old accumulator. Returns true when a
/// logit is +inf or NaN (the caller's output becomes NaN, as in the tile path).
inline bool block_softmax(const IntBlockMemory& w, int n_states, int n, float* m, float* l) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  bool overflow = false;
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int st = 0; st < n_states; ++st) {
    float* row = w.scores + st * kBlockChunk;
    __m256 mx = _mm256_set1_ps(kNegInf);
    for (int o = 0; o < n; o += 8) {
      const __m256 ok = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - o), lanes));
      const __m256 x = _mm256_blendv_ps(_mm256_set1_ps(kNegInf), _mm256_loadu_ps(row + o), ok);
      _mm256_storeu_ps(row + o, x);
      mx = _mm256_max_ps(mx, x);
    }
    const float top = avx2_detail::hmax(mx);
    overflow |= !(top <= std::numeric_limits<float>::max());
    const float m_new = std::max(m[st], top);
    const float corr = std::exp(m[st] - m_new);  // 0 on the first chunk (m = -inf)
    const __m256 mn = _mm256_set1_ps(m_new);
    __m256 sum = _mm256_setzero_ps();
    for (int o = 0; o < n; o += 8) {
      const __m256 p = avx2_detail::exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row + o), mn));
      _mm256_storeu_ps(row + o, p);
      sum = _mm256_add_ps(sum, p);
    }
    const float l_old = l[st] * corr, l_new = l_old + avx2_detail::hsum(sum), inv = 1.f / l_new;
    const __m256 iv = _mm256_set1_ps(inv);
    for (int o = 0; o < n; o += 8) _mm256_storeu_ps(row + o, _mm256_mul_ps(_mm256_loadu_ps(row + o), iv));
    l[st] = l_new;
    m[st] = m_new;
    w.ratio[st] = l_old * inv;
  }
  return overflow;
}

/// w.tmp[st + j][32 c + 8 (parts0 + h)] = Σ_t weight(st + j, t, group g) * part h of the codes
/// of chunk c, for JS states and H parts (H = 4: the whole chunk; H = 2: half `half`).
template <class VC, int JS, int H>
void value_pass(const IntBlockMemory& w, int st, const std::byte* codes, std::size_t v_row, int n, int c, int half,
                int D, int g) {
  const float* wj[JS];
  for (int j = 0; j < JS; ++j) wj[j] = w.weights + static_cast<std::size_t>(st + j) * kBlockChunk * 8 + g;
  __m256 a[JS][H];
#pragma GCC unroll 4
  for (int j = 0; j < JS; ++j)
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) a[j][h] = _mm256_setzero_ps();
  for (int t = 0; t < n; ++t) {
    const std::byte* row = codes + static_cast<std::size_t>(t) * v_row;
    __m256 u[H];
    if constexpr (H == 4) {
      value_half<VC>(row, c, 0, u);
      value_half<VC>(row, c, 1, u + 2);
    } else {
      value_half<VC>(row, c, half, u);
    }
#pragma GCC unroll 4
    for (int j = 0; j < JS; ++j) {
      const __m256 b = _mm256_broadcast_ss(wj[j] + t * 8);
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) a[j][h] = _mm256_fmadd_ps(b, u[h], a[j][h]);
    }
  }
  const int part0 = H == 4 ? 0 : 2 * half;
#pragma GCC unroll 4
  for (int j = 0; j < JS; ++j)
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h)
      _mm256_storeu_ps(w.tmp + static_cast<std::size_t>(st + j) * D + 32 * c + 8 * (part0 + h), a[j][h]);
}

/// acc_st = acc_st * ratio_st + Σ_t p_st,t x̂_t for INT4/INT8 values (int_block_value), scales
/// folded into the weights and zero-points summed per group.
template <class VC, int D>
void block_values_folded(const IntBlockMemory& w, int n_states, const std::byte* codes, std::size_t v_row,
                         const std::byte* meta, std::size_t meta_row, int n, float* acc) {
  constexpr int G = VC::group_size, NG = D / G;
  for (int t = 0; t < n; ++t) {
    __m256 S, Z;
    value_params<VC, NG>(meta + static_cast<std::size_t>(t) * meta_row, S, Z);
    _mm256_storeu_ps(w.vparams + t * 16, S);
    _mm256_storeu_ps(w.vparams + t * 16 + 8, Z);
  }
  for (int st = 0; st < n_states; ++st) {
    const float* p = w.scores + st * kBlockChunk;
    float* wt = w.weights + static_cast<std::size_t>(st) * kBlockChunk * 8;
    __m256 z = _mm256_setzero_ps();
    for (int t = 0; t < n; ++t) {
      const __m256 pb = _mm256_set1_ps(p[t]);
      z = _mm256_fmadd_ps(pb, _mm256_loadu_ps(w.vparams + t * 16 + 8), z);
      _mm256_storeu_ps(wt + t * 8, _mm256_mul_ps(pb, _mm256_loadu_ps(w.vparams + t * 16)));
    }
    _mm256_storeu_ps(w.zsum + st * 8, z);
  }
  // Σ_t w_t,g(c) * codes of chunk c, up to 4 states per pass (their accumulators and the
  // converted codes stay in registers).
  for (int c = 0; c < D / 32; ++c) {
    const int g = 32 * c / G;
    for (int st = 0; st < n_states;) {
      const int js = std::min(4, n_states - st);
      auto run = [&](auto jsc) {
        constexpr int JS = decltype(jsc)::value;
        if constexpr (kWideRegisters || JS <= 2) {
          value_pass<VC, JS, 4>(w, st, codes, v_row, n, c, 0, D, g);
        } else {
          value_pass<VC, JS, 2>(w, st, codes, v_row, n, c, 0, D, g);
          value_pass<VC, JS, 2>(w, st, codes, v_row, n, c, 1, D, g);
        }
      };
      if (js == 4) run(std::integral_constant<int, 4>{});
      else if (js == 3) run(std::integral_constant<int, 3>{});
      else if (js == 2) run(std::integral_constant<int, 2>{});
      else run(std::integral_constant<int, 1>{});
      st += js;
    }
  }
  for (int st = 0; st < n_states; ++st) {
    const float* in = w.tmp + static_cast<std::size_t>(st) * D;
    for (int c = 0; c < D / 32; ++c) value_chunk_to_elements<VC>(in + 32 * c, w.order + 32 * c);
    float* out = acc + static_cast<std::size_t>(st) * D;
    const __m256 r = _mm256_set1_ps(w.ratio[st]);
    for (int d = 0; d < D; d += 8) {
      const __m256 z = _mm256_broadcast_ss(w.zsum + st * 8 + d / G);
      const __m256 v = _mm256_add_ps(_mm256_loadu_ps(w.order + d), z);
      _mm256_storeu_ps(out + d, _mm256_fmadd_ps(_mm256_loadu_ps(out + d), r, v));
    }
  }
}

}  // namespace int_block_detail

/// P·V of tokens [t0, t0 + n) of a block with the weights block_softmax left in w.scores:
/// acc_st = acc_st * ratio_st + Σ_t p_st,t x̂_t, INT4/INT8 values (int_block_value) folded,
/// others decoded with Isa::decode_row and accumulated with Isa::accumulate.
template <class Isa, class VC, int D>
void block_values(const IntBlockMemory& w, int n_states, const std::byte* data, const BlockLayout& L, int t0, int n,
                  float* acc) {
  using namespace int_block_detail;
  const auto tz = static_cast<std::size_t>(t0);
  const std::byte* vcodes = data + L.v_codes + tz * L.v_row;
  const std::byte* vmeta = data + L.v_meta + tz * L.v_meta_token;
  if constexpr (int_block_value<VC> && D % VC::group_size == 0) {
    block_values_folded<VC, D>(w, n_states, vcodes, L.v_row, vmeta, L.v_meta_token, n, acc);
  } else {
    for (int st = 0; st < n_states; ++st) Isa::scale(acc + static_cast<std::size_t>(st) * D, D, w.ratio[st]);
    for (int s0 = 0; s0 < n; s0 += simd::kTile) {
      const int nt = std::min(simd::kTile, n - s0);
      for (int t = 0; t < nt; ++t) {
        const auto tt = static_cast<std::size_t>(s0 + t);
        Isa::template decode_row<VC>(vcodes + tt * L.v_row, vmeta + tt * L.v_meta_token, D,
                                     w.tmp + static_cast<std::size_t>(t) * D, w.order);
      }
      const std::uint32_t live = (1u << nt) - 1u;
      for (int st = 0; st < n_states; st += 4) {
        const int js = std::min(4, n_states - st);
        float* ap[4];
        const float* pp[4];
        for (int j = 0; j < 4; ++j) {
          const int sj = st + std::min(j, js - 1);
          ap[j] = acc + static_cast<std::size_t>(sj) * D;
          pp[j] = w.scores + sj * kBlockChunk + s0;
        }
        if (js == 4) Isa::template accumulate<D, 4>(ap, pp, w.tmp, D, nt, live, D);
        else if (js == 3) Isa::template accumulate<D, 3>(ap, pp, w.tmp, D, nt, live, D);
        else if (js == 2) Isa::template accumulate<D, 2>(ap, pp, w.tmp, D, nt, live, D);
        else Isa::template accumulate<D, 1>(ap, pp, w.tmp, D, nt, live, D);
      }
    }
  }
}

/// Attends every state to the `count` tokens of one block (layout L, payload `data`) that all of
/// them see in full, `bias` (null or `count` floats) added to the scaled logits, updating the online-softmax state m, l (per state) and the normalized
/// accumulator acc ([n_states][D], element order) in place. Keys: int_block_key<KC>; values: any
/// codec (int_block_value<VC> folded, others decoded with Isa::decode_row / Isa::accumulate).
/// `next` (or null): the payload of the block attended after this one, prefetched a few cache
/// lines per token (blocks are not adjacent in memory, so the hardware prefetchers lose the
/// stream at every block: at 32k tokens this hid a third of the decode time).
/// Returns true when a logit overflowed fp32 (the output must become NaN).
template <class Isa, class KC, class VC, int D>
bool int_block_attend(const IntBlockMemory& w, int n_states, const std::byte* data, const BlockLayout& L, int count,
                      float attn_scale, const float* bias, float* m, float* l, float* acc, const std::byte* next) {
  using namespace int_block_detail;
  bool overflow = false;
  for (int t0 = 0; t0 < count; t0 += kBlockChunk) {
    const int n = std::min(kBlockChunk, count - t0);
    const auto tz = static_cast<std::size_t>(t0);
    block_logits<KC, D>(w, n_states, data + L.k_codes + tz * L.k_row, L.k_row, data + L.k_meta + tz * L.k_meta_token,
                        L.k_meta_token, n, attn_scale, t0 == 0 ? next : nullptr, L.bytes);
    if (bias != nullptr)  // the additive mask, added to the scaled logits as in the tile path
      for (int st = 0; st < n_states; ++st)
        for (int t = 0; t < n; ++t) w.scores[st * kBlockChunk + t] += bias[t0 + t];
    overflow |= block_softmax(w, n_states, n, m, l);
    block_values<Isa, VC, D>(w, n_states, data, L, t0, n, acc);
  }
  return overflow;
}

}  // namespace kvpack::kernels::avx2

#endif  // KVPACK_HAS_AVX2
