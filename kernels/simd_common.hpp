// The tile driver shared by kvpack's SIMD fused dequant-attention kernels (kernels/avx2/,
// kernels/neon/). It follows the scalar kernel (kernels/scalar/attention.hpp, the spec) step by
// step; each instruction set supplies only the vector primitives (an `Isa` type, see below).
//
// Per KV head and GQA group it streams the head's tokens in cache-index order (sinks, quantized
// blocks, pending rows, the current chunk) in tiles of Isa::tile (16) keys:
//   1. a quantized tile is dequantized once, in registers, into a small fp32 tile
//      ([16][head_dim] floats for K and for V, L1-resident; full-precision rows are read in place);
//   2. every query state (query i, group head j) is scored against every key of the tile, several
//      states x several keys per register block, so K is read once per KV head;
//   3. the online softmax (Milakov & Gimelshein 2018; FlashAttention) is updated per state in fp32:
//      masked (BlockRef::valid), causally invisible and past-the-end keys get a -inf logit; an
//      additive mask (AttendArgs::bias) is added to the scaled scores first, as in the scalar kernel;
//   4. V of the tile is accumulated into every state, several states x several dims per block.
// key_mass (AttendArgs) is supported exactly as in the scalar kernel: logits are kept in scratch
// and turned into probabilities once the final max and sum are known.
//
// Numerics: fp32 everywhere; sums run in a different order than the scalar kernel, and exp is a
// polynomial (<= 2 ulp), so outputs agree with the scalar kernel to ~1e-6 relative (the contract
// is 1e-5, tests/test_backend_kernels.cpp). Exception: an Isa may score per-token integer keys
// from their codes (Isa::int_dot_key: query quantized in two int8 terms) and accumulate INT4
// values from their codes (Isa::int_dot_value: weights in two byte terms); their error bounds are
// in kernels/dispatch.hpp (query_int_error, value_int_error). Dequantized values are bit-identical to the scalar
// decode (zero + scale * q with one multiply and one add, no FMA contraction).
// PreRope<> caches (AttendArgs::rope): queries are rotated once, exact rows copied rotated into the
// K tile, and dequantized tiles rotated in place (kernels/rope.hpp); the integer Q·K paths step aside.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "kvpack/cache/block.hpp"
#include "kvpack/codec/float_codec.hpp"
#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/int_codec.hpp"
#include "kvpack/kernels/rope.hpp"
#include "kvpack/kernels/scalar/attention.hpp"
#include "kvpack/kernels/simd_tile.hpp"

namespace kvpack::kernels::simd {

/// The fused kernel for one KV head over an instruction set `Isa`, head_dim DT (0 = run time).
///
/// `Isa` provides (all static):
///   score<DT, JS, KS>(q[JS], k, k_stride, n, D, scale, out, out_stride)
///       out[j * out_stride + t] = scale * dot(q[j], k + t * k_stride) for t < n;
///   accumulate<DT, JS>(acc[JS], p[JS], v, v_stride, n, live, D)
///       acc[j][d] += p[j][t] * v[t * v_stride + d] for t < n whose bit in `live` is set;
///   mask_max(row, visible, bits): row[t] = -inf unless t < visible and bit t of bits is set;
///       returns the max of row[0, kTile);
///   exp_sum(row, m): row[t] = exp(row[t] - m) for t < kTile (exp(-inf) = 0); returns the sum;
///   scale(x, D, c): x *= c;  store_scaled(out, acc, D, c): out = acc * c;
///   add_key_mass(km, lg, n, m, inv): km[o] += exp(lg[o] - m) * inv (lg = -inf adds nothing);
///   decode_row<C>(codes, meta, D, out, row_meta)            per-token row of codec C;
///   load_channel_params<C>(meta, D, scale, zero, row_meta)  per-channel key group metadata;
///   decode_row_channels<C>(codes, scale, zero, D, out)      per-channel key row;
///   int_dot_key<C>, int_dot_value<C> (constexpr bool): integer Q·K / P·V for codec C, and then
///   quantize_query<C>(q, D, st, qq), int_scores<C, JS>(...), int_accumulate<C, JS>(...)
///       (contracts in kernels/avx2/int_dot.hpp; an Isa without them sets both flags false).
template <class Isa, KvCodec KC, KvCodec VC, bool KPerChannel, int DT>
void attend_tiled(const AttendArgs& a_in, const HeadSegments& seg, const BlockLayout& L, Scratch& s) {
  const AttendArgs a = rope_queries(a_in, s);  // PreRope: rotated queries (else a_in itself)
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr int T = kTile;
  const int D = DT > 0 ? DT : a.head_dim;
  const auto Dz = static_cast<std::size_t>(D);
  const int G = a.group;
  const int n_states = a.n_q * G;
  const TileMemory mem = prepare_scratch(s, n_states, D);
  std::fill_n(s.m.begin(), n_states, kNegInf);
  std::fill_n(s.l.begin(), n_states, 0.f);
  std::fill_n(s.acc.begin(), static_cast<std::size_t>(n_states) * Dz, 0.f);

  const std::int64_t blocks_ord = seg.sinks.count;
  const std::int64_t pending_ord = blocks_ord + static_cast<std::int64_t>(seg.blocks.size()) * L.tokens;
  const std::int64_t chunk_ord = pending_ord + seg.pending.count;
  if (a.key_mass) {
    s.n_ordinals = chunk_ord + seg.chunk.count;
    const auto need = static_cast<std::size_t>(n_states) * static_cast<std::size_t>(s.n_ordinals);
    if (s.logits.size() < need) s.logits.resize(need);
    std::fill_n(s.logits.begin(), need, kNegInf);
  }
  const std::int64_t last_query = a.q_first + a.n_q - 1;
  bool logit_overflow = false;  // a logit beyond fp32: the polynomial exp would hide it
  auto q_of = [&](int st) { return a.q + (st / G) * a.q_stride + (st % G) * D; };
  auto acc_of = [&](int st) { return s.acc.data() + static_cast<std::size_t>(st) * Dz; };
  auto row_of = [&](int st) { return mem.scores + static_cast<std::size_t>(st) * T; };

  // One tile of n <= T keys: K rows at kt + t * ks, V rows at vt + t * vs, cache indices
  // first + t (causal) or, when `masked`, slots whose bit in `bits` is set (visible to all; their
  // cache indices in `index` when the block has them, BlockRef::slot_index, for the bias).
  // Integer Q·K (Isa::int_dot_key<KC>): the queries are quantized once here, and quantized
  // tiles are scored from their codes (K is never dequantized); exact rows keep fp32 scores.
  constexpr bool kIntKeys = !KPerChannel && Isa::template int_dot_key<KC>;
  const bool int_keys = kIntKeys && !a.rope;  // pre-RoPE keys are rotated in fp32: no code scores
  // Integer P·V (Isa::int_dot_value<VC>): quantized tiles accumulate V from its codes.
  constexpr bool kIntValues = Isa::template int_dot_value<VC>;
  float* value_meta = mem.v_tile;  // [2][groups][kTile] V scales and zeros (the fp32 V tile is unused)
  QueryInt8 qq;
  float* key_meta = nullptr;  // [2][groups][kTile]: tile key scales and zero-points
  if constexpr (kIntKeys) {
    qq.groups = D / KC::group_size;
    const auto ns = static_cast<std::size_t>(n_states), ng = static_cast<std::size_t>(qq.groups);
    if (s.q_int8.size() < 2 * ns * Dz) s.q_int8.resize(2 * ns * Dz);
    if (s.q_offsets.size() < ns * ng) s.q_offsets.resize(ns * ng);
    if (s.q_params.size() < 2 * ns * ng + 2 * T * ng) s.q_params.resize(2 * ns * ng + 2 * T * ng);
    qq.qi = s.q_int8.data();
    qq.qr = qq.qi + ns * Dz;
    qq.sigma = s.q_params.data();
    qq.offset_sum = s.q_offsets.data();
    qq.q_sum = qq.sigma + ns * ng;
    key_meta = qq.q_sum + ns * ng;
    if (!seg.blocks.empty() && int_keys)
      for (int st = 0; st < n_states; ++st) Isa::template quantize_query<KC>(q_of(st), D, st, qq);
  }

  // Blocks every state sees in full, with no slot mask or key_mass: an Isa may attend them
  // whole (Isa::int_block<KC>, e.g. kernels/avx2/int_block.hpp; per-channel keys:
  // Isa::channel_block<KC>, kernels/avx2/channel_block.hpp).
  constexpr bool kIntBlock = DT > 0 && DT % KC::group_size == 0 && !KPerChannel && Isa::template int_block<KC>;
  constexpr bool kChannelBlock = DT > 0 && KPerChannel && Isa::template channel_block<KC>;
  bool int_block_ready = false;
  [[maybe_unused]] auto int_block_mem = [] {
    if constexpr (kIntBlock) return typename Isa::IntBlockMemory{};
    else if constexpr (kChannelBlock) return typename Isa::ChannelBlockMemory{};
    else return 0;
  }();
  [[maybe_unused]] const bool int_block_usable = [&] {
    if constexpr (kIntBlock || kChannelBlock) return !a.key_mass && !a.rope && n_states <= Isa::int_block_max_states;
    else return false;
  }();

  // Scores of states [st0, n_states) against n fp32 key rows at kt + t * ks.
  auto fp32_scores = [&](const float* kt, std::int64_t ks, int n) {
    return [&, kt, ks, n](int st) {
      const int rem = n_states - st;
      const float* q[4] = {q_of(st), rem > 1 ? q_of(st + 1) : nullptr, rem > 2 ? q_of(st + 2) : nullptr,
                           rem > 3 ? q_of(st + 3) : nullptr};
      float* out = row_of(st);
      if (rem >= 4) {
        Isa::template score<DT, 4, 2>(q, kt, ks, n, D, a.scale, out, T);
        return 4;
      } else if (rem == 3) {
        Isa::template score<DT, 3, 2>(q, kt, ks, n, D, a.scale, out, T);
        return 3;
      } else if (rem == 2) {
        Isa::template score<DT, 2, 4>(q, kt, ks, n, D, a.scale, out, T);
        return 2;
      }
      Isa::template score<DT, 1, 8>(q, kt, ks, n, D, a.scale, out, T);
      return 1;
    };
  };

  // One tile of n <= T keys scored by `score` (score(st) fills the rows of states st, st + 1, ...
  // and returns how many), V rows at vt + t * vs, cache indices
  // first + t (causal) or, when `masked`, slots whose bit in `bits` is set (visible to all).
  // With vcodes (Isa::int_dot_value<VC> blocks), V is accumulated from its codes (vt unused).
  auto tile = [&](auto&& score, const float* vt, std::int64_t vs, std::int64_t first, int n, std::uint32_t bits,
                  bool masked, std::int64_t ordinal, const std::byte* vcodes, const std::byte* vmeta,
                  const std::int32_t* index = nullptr) {
    // States are ordered by query, so visibility only grows with st: skip the blind prefix.
    int st0 = 0;
    if (!masked) {
      const std::int64_t blind_queries = std::clamp<std::int64_t>(first - a.q_first, 0, a.n_q);
      st0 = static_cast<int>(blind_queries) * G;
    }
    if (st0 >= n_states) return;
    // 1. Scores, plus the additive mask (AttendArgs::bias) of each key's cache index.
    for (int st = st0; st < n_states;) st += score(st);
    if (a.bias && !masked)
      for (int st = st0; st < n_states; ++st) {
        float* row = row_of(st);
        for (int t = 0; t < n; ++t) row[t] += a.bias[first + t];
      }
    else if (a.bias && index)
      for (int st = st0; st < n_states; ++st) {
        float* row = row_of(st);
        for (int t = 0; t < n; ++t)
          if ((bits >> t) & 1u) row[t] += a.bias[index[t]];
      }
    // 2. Online softmax per state.
    for (int st = st0; st < n_states; ++st) {
      float* row = row_of(st);
      const int visible =
          masked ? n : static_cast<int>(std::clamp<std::int64_t>(a.q_first + st / G - first + 1, 0, n));
      const float mx = Isa::mask_max(row, visible, masked ? bits : 0xFFFFFFFFu);
      if (a.key_mass && visible > 0) std::copy_n(row, n, s.logits.data() + st * s.n_ordinals + ordinal);
      if (mx == kNegInf) {  // nothing visible: contributes nothing
        std::fill_n(row, T, 0.f);
        continue;
      }
      logit_overflow |= !(mx <= std::numeric_limits<float>::max());  // +inf logit: output NaN below
      const float m_new = std::max(s.m[static_cast<std::size_t>(st)], mx);
      const float corr = std::exp(s.m[static_cast<std::size_t>(st)] - m_new);  // 0 on the first tile
      const float sum = Isa::exp_sum(row, m_new);
      // acc stays the normalized output (weights p / l): bounded by max |v|, never overflows
      // when the exact output is finite (see scalar_detail::accumulate_tile).
      const float l_old = s.l[static_cast<std::size_t>(st)] * corr;
      const float l = l_old + sum, inv = 1.f / l;
      s.l[static_cast<std::size_t>(st)] = l;
      Isa::scale(acc_of(st), D, l_old * inv);
      Isa::scale(row, T, inv);
      s.m[static_cast<std::size_t>(st)] = m_new;
    }
    // 3. Accumulate V. Masked-out slots are skipped (their bytes need not decode to finite values);
    // every other key is a real token, so p = 0 for a state that cannot see it adds exactly 0.
    const std::uint32_t live = masked ? bits : (n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1u);
    for (int st = st0; st < n_states;) {
      const int rem = n_states - st;
      float* acc[4] = {acc_of(st), rem > 1 ? acc_of(st + 1) : nullptr, rem > 2 ? acc_of(st + 2) : nullptr,
                       rem > 3 ? acc_of(st + 3) : nullptr};
      const float* p[4] = {row_of(st), rem > 1 ? row_of(st + 1) : nullptr, rem > 2 ? row_of(st + 2) : nullptr,
                           rem > 3 ? row_of(st + 3) : nullptr};
      if constexpr (kIntValues) {
        if (vcodes != nullptr) {
          const int js = rem >= 4 ? 4 : rem;
          auto run = [&](auto jsc) {
            Isa::template int_accumulate<VC, decltype(jsc)::value>(acc, p, vcodes, L.v_row, vmeta, L.v_meta_token, n,
                                                                   live, D, value_meta, value_meta + (T / 2) * Dz);
          };
          if (js == 4) run(std::integral_constant<int, 4>{});
          else if (js == 3) run(std::integral_constant<int, 3>{});
          else if (js == 2) run(std::integral_constant<int, 2>{});
          else run(std::integral_constant<int, 1>{});
          st += js;
          continue;
        }
      }
      if (rem >= 4) {
        Isa::template accumulate<DT, 4>(acc, p, vt, vs, n, live, D);
        st += 4;
      } else if (rem == 3) {
        Isa::template accumulate<DT, 3>(acc, p, vt, vs, n, live, D);
        st += 3;
      } else if (rem == 2) {
        Isa::template accumulate<DT, 2>(acc, p, vt, vs, n, live, D);
        st += 2;
      } else {
        Isa::template accumulate<DT, 1>(acc, p, vt, vs, n, live, D);
        st += 1;
      }
    }
  };

  auto exact = [&](const ExactRows& r, std::int64_t ordinal) {
    for (std::int64_t t0 = 0; t0 < r.count; t0 += T) {
      if (r.first + t0 > last_query) break;  // causal: no query sees these rows
      const int n = static_cast<int>(std::min<std::int64_t>(T, r.count - t0));
      const float* k = r.k + t0 * r.stride;
      std::int64_t k_stride = r.stride;
      if (a.rope) {  // pre-RoPE keys: a rotated copy in the K tile
        rope_exact_rows(*a.rope, r, t0, n, D, mem.k_tile);
        k = mem.k_tile, k_stride = D;
      }
      tile(fp32_scores(k, k_stride, n), r.v + t0 * r.stride, r.stride, r.first + t0, n, 0xFFFFFFFFu,
           false, ordinal + t0, nullptr, nullptr);
    }
  };

  exact(seg.sinks, 0);
  for (std::size_t i = 0; i < seg.blocks.size(); ++i) {
    const BlockRef& b = seg.blocks[i];
    if (b.count == 0 || (!b.valid && b.first > last_query)) continue;
    if constexpr (kIntBlock) {
      if (int_block_usable && !b.valid && b.first + b.count - 1 <= a.q_first) {
        if (!int_block_ready) int_block_mem = Isa::template int_block_prepare<KC>(q_of, n_states, D, s);
        int_block_ready = true;
        logit_overflow |= Isa::template int_block_attend<KC, VC, DT>(int_block_mem, n_states, b.data, L, b.count, a.scale,
                                                                    a.bias ? a.bias + b.first : nullptr, s.m.data(),
                                                                    s.l.data(), s.acc.data(),
                                                                    i + 1 < seg.blocks.size() ? seg.blocks[i + 1].data : nullptr);
        continue;
      }
    }
    if constexpr (kChannelBlock) {
      if (int_block_usable && !b.valid && b.first + b.count - 1 <= a.q_first) {
        if (!int_block_ready) int_block_mem = Isa::channel_block_prepare(q_of, n_states, D, s);
        int_block_ready = true;
        logit_overflow |= Isa::template channel_block_attend<KC, VC, DT>(
            int_block_mem, n_states, b.data, L, b.count, a.scale, a.bias ? a.bias + b.first : nullptr, s.m.data(),
            s.l.data(), s.acc.data(), i + 1 < seg.blocks.size() ? seg.blocks[i + 1].data : nullptr);
        continue;
      }
    }
    const std::int64_t ordinal = blocks_ord + static_cast<std::int64_t>(i) * L.tokens;
    int channel_group = -1;  // per-channel key metadata currently decoded
    for (int t0 = 0; t0 < b.count; t0 += T) {
      const int n = std::min(T, b.count - t0);
      std::uint32_t bits = 0xFFFFFFFFu;
      if (b.valid) {
        bits = static_cast<std::uint32_t>((b.valid[t0 / 64] >> (t0 % 64)) & 0xFFFFu);
        if (n < 32) bits &= (1u << n) - 1u;
        if (bits == 0) continue;  // every slot masked out (key_mass logits stay -inf)
      } else if (b.first + t0 > last_query) {
        break;
      }
      // Dequantize the tile (masked-out rows are left as they are: never read unmasked).
      const float* kt = mem.k_tile;
      const float* vt = mem.v_tile;
      if (int_keys) {
        (void)kt;  // scored from the codes below
      } else if (std::is_same_v<KC, Fp32> && !KPerChannel && !a.rope) {
        kt = reinterpret_cast<const float*>(b.data + L.k_codes + static_cast<std::size_t>(t0) * L.k_row);
      } else {
        for (int t = 0; t < n; ++t) {
          if (!((bits >> t) & 1u)) continue;
          const auto tt = static_cast<std::size_t>(t0 + t);
          float* kr = mem.k_tile + static_cast<std::size_t>(t) * Dz;
          if constexpr (KPerChannel) {
            const int g = (t0 + t) / L.k_group;
            if (g != channel_group) {
              Isa::template load_channel_params<KC>(b.data + L.k_meta + static_cast<std::size_t>(g) * L.k_meta_group,
                                                    D, mem.ch_scale, mem.ch_zero, mem.row_meta);
              channel_group = g;
            }
            Isa::template decode_row_channels<KC>(b.data + L.k_codes + tt * L.k_row, mem.ch_scale, mem.ch_zero, D, kr);
          } else {
            Isa::template decode_row<KC>(b.data + L.k_codes + tt * L.k_row, b.data + L.k_meta + tt * L.k_meta_token,
                                         D, kr, mem.row_meta);
          }
        }
        if (a.rope) rope_block_rows(*a.rope, b, L, t0, n, mem.k_tile, D);
      }
      const std::byte* vcodes = nullptr;
      const std::byte* vmeta = nullptr;
      if constexpr (kIntValues) {
        vcodes = b.data + L.v_codes + static_cast<std::size_t>(t0) * L.v_row;
        vmeta = b.data + L.v_meta + static_cast<std::size_t>(t0) * L.v_meta_token;
      } else if constexpr (std::is_same_v<VC, Fp32>) {
        vt = reinterpret_cast<const float*>(b.data + L.v_codes + static_cast<std::size_t>(t0) * L.v_row);
      } else {
        for (int t = 0; t < n; ++t) {
          if (!((bits >> t) & 1u)) continue;
          const auto tt = static_cast<std::size_t>(t0 + t);
          Isa::template decode_row<VC>(b.data + L.v_codes + tt * L.v_row, b.data + L.v_meta + tt * L.v_meta_token, D,
                                       mem.v_tile + static_cast<std::size_t>(t) * Dz, mem.row_meta);
        }
      }
      bool scored = false;
      if constexpr (kIntKeys) {
        if (int_keys) {
          const std::byte* codes = b.data + L.k_codes + static_cast<std::size_t>(t0) * L.k_row;
          const std::byte* meta = b.data + L.k_meta + static_cast<std::size_t>(t0) * L.k_meta_token;
          auto int_scores = [&](int st) {
            const int rem = n_states - st;
            const int js = rem >= 4 ? 4 : rem;
            auto run = [&](auto jsc) {
              Isa::template int_scores<KC, decltype(jsc)::value>(qq, st, codes, L.k_row, meta, L.k_meta_token, n, D,
                                                                 a.scale, row_of(st), T, key_meta,
                                                                 key_meta + T * qq.groups);
            };
            if (js == 4) run(std::integral_constant<int, 4>{});
            else if (js == 3) run(std::integral_constant<int, 3>{});
            else if (js == 2) run(std::integral_constant<int, 2>{});
            else run(std::integral_constant<int, 1>{});
            return js;
          };
          tile(int_scores, vt, D, b.first + t0, n, bits, b.valid != nullptr, ordinal + t0, vcodes, vmeta,
               b.slot_index ? b.slot_index + t0 : nullptr);
          scored = true;
        }
      }
      if (!scored)
        tile(fp32_scores(kt, D, n), vt, D, b.first + t0, n, bits, b.valid != nullptr, ordinal + t0, vcodes, vmeta,
             b.slot_index ? b.slot_index + t0 : nullptr);
    }
  }
  exact(seg.pending, pending_ord);
  exact(seg.chunk, chunk_ord);

  if (a.key_mass) {
    for (int st = 0; st < n_states; ++st) {
      const float l = s.l[static_cast<std::size_t>(st)];
      if (!(l > 0.f)) continue;
      Isa::add_key_mass(a.key_mass, s.logits.data() + st * s.n_ordinals, s.n_ordinals,
                        s.m[static_cast<std::size_t>(st)], 1.f / l);
    }
  }
  for (int st = 0; st < n_states; ++st) {
    const float l = s.l[static_cast<std::size_t>(st)];
    const float c = logit_overflow ? std::numeric_limits<float>::quiet_NaN() : (l > 0.f ? 1.f : 0.f);
    Isa::store_scaled(a.out + (st / G) * a.out_stride + (st % G) * D, acc_of(st), D, c);
  }
}

/// Runs attend_tiled with head_dim 64, 128 or 256 fixed at compile time, any other at run time.
template <class Isa, KvCodec KC, KvCodec VC, bool KPerChannel>
void attend_dispatch_dim(const AttendArgs& a, const HeadSegments& seg, const BlockLayout& L, Scratch& s) {
  switch (a.head_dim) {
    case 64: return attend_tiled<Isa, KC, VC, KPerChannel, 64>(a, seg, L, s);
    case 128: return attend_tiled<Isa, KC, VC, KPerChannel, 128>(a, seg, L, s);
    case 256: return attend_tiled<Isa, KC, VC, KPerChannel, 256>(a, seg, L, s);
    default: return attend_tiled<Isa, KC, VC, KPerChannel, 0>(a, seg, L, s);
  }
}

}  // namespace kvpack::kernels::simd
