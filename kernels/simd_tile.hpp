// Building blocks of the SIMD tile driver (kernels/simd_common.hpp): the codec families the SIMD
// decoders know, a compile-time unrolled loop, the quantized queries of integer Q·K, and the
// tile working memory carved out of kernels::Scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kvpack/codec/float_codec.hpp"
#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/fp8_unscaled.hpp"
#include "kvpack/codec/int_codec.hpp"
#include "kvpack/kernels/attend_args.hpp"

namespace kvpack::kernels::simd {

// ---- codec families the SIMD decoders know (anything else falls back to the scalar decode) ----

namespace detail {
template <int B, class G, class M, class Me>
std::true_type int_codec_base(const IntCodec<B, G, M, Me>*);
std::false_type int_codec_base(const void*);
template <class F, class G, class Me>
std::true_type fp8_codec_base(const Fp8Codec<F, G, Me>*);
std::false_type fp8_codec_base(const void*);
}  // namespace detail

/// INT8/INT4 codecs (kvpack::IntCodec and its Int8<>/Int4<> aliases).
template <class C>
concept IntCodecFamily = KvCodec<C> && decltype(detail::int_codec_base(static_cast<const C*>(nullptr)))::value;
/// FP8 codecs (kvpack::Fp8Codec: Fp8E4M3<>, Fp8E5M2<>).
template <class C>
concept Fp8CodecFamily = KvCodec<C> && decltype(detail::fp8_codec_base(static_cast<const C*>(nullptr)))::value;
/// FP8 codes without a scale (kvpack::Fp8Unscaled: Fp8E4M3Unscaled, Fp8E5M2Unscaled).
template <class C>
concept Fp8UnscaledFamily = KvCodec<C> && kvpack::detail::is_fp8_unscaled_v<C>;
/// 4-bit codebook codecs (kvpack::Nf4<>): x̂ = C::codebook_level(u) * scale, INT4's nibble layout.
template <class C>
concept CodebookCodec = KvCodec<C> && requires { C::codebook; } && C::codebook && C::bits == 4;
/// Codecs with a SIMD decoder (AVX2 and NEON); others are decoded by the scalar decode_row into
/// the tile.
template <class C>
concept SimdDecodable = IntCodecFamily<C> || Fp8CodecFamily<C> || Fp8UnscaledFamily<C> || CodebookCodec<C> ||
                        std::is_same_v<C, Fp16> || std::is_same_v<C, Fp32>;

/// Calls f(std::integral_constant<int, 0>{}) ... f(std::integral_constant<int, N - 1>{}): a loop
/// the compiler must unroll, so arrays of vector registers indexed by it stay in registers.
template <int N, class F>
inline void static_for(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

/// The quantized queries of one attend call (Isa::int_dot_key codecs, e.g.
/// kernels/avx2/int_dot.hpp), in code order: per state and key group, two int8 terms
/// q ≈ σ (254 qi + qr) (qi the int8 query, qr its rounding residual on a 254x finer step), so the
/// integer Q·K is as exact as a 16-bit query while the dot products stay u8 x s8; per group σ,
/// the code offset times (254 Σ qi + Σ qr) (int32, exact) and Σ q.
struct QueryInt8 {
  std::int8_t* qi = nullptr;          // [n_states][D]
  std::int8_t* qr = nullptr;          // [n_states][D]
  float* sigma = nullptr;             // [n_states][groups]: the step of 254 qi + qr
  std::int32_t* offset_sum = nullptr; // [n_states][groups]: o * (254 Σ qi + Σ qr)
  float* q_sum = nullptr;             // [n_states][groups]
  int groups = 0;
};

/// Keys per tile: 16 (a quarter of a 64-bit validity word, so one tile's mask is one shift away).
inline constexpr int kTile = 16;

/// Working memory the SIMD kernels carve out of kernels::Scratch (grown on demand, never shrunk):
///   k_tile: [kTile][D] dequantized keys, then per-channel key scales [D] and zero-points [D],
///           then decoded metadata of one row or one channel group (<= 2 * D floats, here 2 * D + 8);
///   v_tile: [kTile][D] dequantized values;
///   scores: [n_states][kTile] logits, then probabilities, of the current tile.
struct TileMemory {
  float* k_tile;
  float* v_tile;
  float* ch_scale;
  float* ch_zero;
  float* row_meta;
  float* scores;
};

inline TileMemory prepare_scratch(Scratch& s, int n_states, int D) {
  s.ensure(n_states, D, 1);
  const auto Dz = static_cast<std::size_t>(D);
  const std::size_t k_need = (kTile + 4) * Dz + 8;
  if (s.k_tile.size() < k_need) s.k_tile.resize(k_need);
  if (s.v_tile.size() < kTile * Dz) s.v_tile.resize(kTile * Dz);
  const std::size_t sc_need = static_cast<std::size_t>(n_states) * kTile;
  if (s.scores.size() < sc_need) s.scores.resize(sc_need);
  float* k = s.k_tile.data();
  return {k, s.v_tile.data(), k + kTile * Dz, k + (kTile + 1) * Dz, k + (kTile + 2) * Dz, s.scores.data()};
}

}  // namespace kvpack::kernels::simd
