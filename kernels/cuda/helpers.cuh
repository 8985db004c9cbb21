// __host__ __device__ building blocks of kvpack's CUDA kernels: code unpacking, per-group
// dequantization, the device-side quantizer, and the online-softmax merge of split-K partials.
// The quantizer and dequantizer are NOT re-implemented here: the host codecs' derive,
// encode_value, decode_value, store_params and load_params (int_codec.hpp, fp8_codec.hpp,
// meta.hpp) are __host__ __device__, and quantize_group calls them, so device codes are the host
// codes by construction.
//
// This header compiles as plain C++20 too (g++, clang++: KVPACK_HOST_DEVICE is empty there), so
// every helper is unit-tested on the host (tests/test_cuda_helpers.cpp) against float64
// references and the host codecs; the kernels (kernels/cuda/*.cuh) only compose them.
//
// Codes and metadata follow include/kvpack/codec/int_codec.hpp and fp8_codec.hpp exactly:
//  * INT4: unsigned nibbles (symmetric q + 8), element 2i in the LOW nibble of byte i;
//  * INT8: symmetric two's-complement int8, asymmetric uint8; FP8: one OCP E4M3FN/E5M2 byte;
//  * metadata per group of G values: scale, then zero-point (asymmetric integers only), each
//    fp16 or fp32, little-endian;
//  * quantization q = clamp(rne((x - zero) / scale)) by IEEE division (__fdiv_rn on device),
//    scales rounded UP and zero-points DOWN to the metadata precision (DESIGN.md "Numerics").
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/int_codec.hpp"
#include "kvpack/codec/params.hpp"
#include "kvpack/config.hpp"
#include "kvpack/numeric.hpp"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace kvpack::cuda {

/// How a codec's codes decode on the device.
enum class CodeKind : std::uint8_t { int_symmetric, int_asymmetric, e4m3, e5m2 };

/// Device view of a grouped kvpack codec (Int8<...>, Int4<...>, Fp8E4M3<...>, Fp8E5M2<...>).
/// `supported` is false for Fp32/Fp16 (no device kernels for ungrouped codecs) and for the
/// INT3/INT2 codecs (codec/int_lowbit.hpp: the device decode reads 4- and 8-bit chunks only;
/// 2- and 3-bit caches stay on the host for now), and for codebook codecs (NF4,
/// codec/nf4_codec.hpp: 4-bit codes that are not integer levels).
template <class C>
struct DeviceCodec {
  static constexpr bool supported = false;
};

template <class C>
  requires requires { typename C::meta_type; } && (C::grouped) && (C::bits == 4 || C::bits == 8) &&
           (!requires { C::codebook; })
struct DeviceCodec<C> {
  using codec = C;  ///< the host codec, whose __host__ __device__ encode/decode the kernels call
  static constexpr bool supported = true;
  static constexpr bool is_fp8 = requires { typename C::format; };
  static constexpr int bits = C::bits;                 ///< bits per stored code (4 or 8)
  static constexpr int group = C::group_size;          ///< values per scale (G)
  static constexpr bool asymmetric = C::asymmetric;    ///< has a zero-point
  static constexpr bool meta_f16 = std::is_same_v<typename C::meta_type, MetaF16>;
  static constexpr int meta_value_bytes = meta_f16 ? 2 : 4;      ///< bytes of one scale or zero
  static constexpr int meta_bytes = C::meta_bytes_per_group;     ///< bytes per group
  static constexpr float meta_max = meta_f16 ? kFp16Max : 3.40282347e+38f;
  static constexpr CodeKind kind = [] {
    if constexpr (requires { typename C::format; }) {
      return std::is_same_v<typename C::format, E4M3> ? CodeKind::e4m3 : CodeKind::e5m2;
    } else {
      return C::asymmetric ? CodeKind::int_asymmetric : CodeKind::int_symmetric;
    }
  }();
  static constexpr int qmin = is_fp8 ? 0 : (asymmetric ? 0 : -(1 << (bits - 1)));
  static constexpr int qmax = is_fp8 ? 0 : (asymmetric ? (1 << bits) - 1 : (1 << (bits - 1)) - 1);
  /// Largest finite value of the FP8 element format (448 or 57344); 0 for integer codecs.
  static constexpr float fp8_max = kind == CodeKind::e4m3 ? kE4M3Max : (kind == CodeKind::e5m2 ? kE5M2Max : 0.f);
};

/// Values handled together by one lane of the attention kernel: a chunk of 8 consecutive
/// channels (always inside one group, as every group size is a power of two >= 8).
inline constexpr int kChunk = 8;

// ------------------------------------------------------------------------------------------------
// Bits and bytes
// ------------------------------------------------------------------------------------------------

/// -Inf as a constant usable in device code.
inline constexpr float kNegInf = detail::bit_cast<float>(0xFF800000u);
/// Largest finite float.
inline constexpr float kFloatMax = 3.40282347e+38f;

/// Little-endian 16- and 32-bit loads from unaligned bytes.
[[nodiscard]] KVPACK_HOST_DEVICE inline std::uint32_t load_le16(const std::uint8_t* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8);
}
[[nodiscard]] KVPACK_HOST_DEVICE inline std::uint32_t load_le32(const std::uint8_t* p) noexcept {
  return load_le16(p) | (load_le16(p + 2) << 16);
}

/// The two stored 4-bit codes of one INT4 byte: element 2i (low nibble) and 2i + 1 (high nibble).
struct Nibbles {
  unsigned lo, hi;
};
[[nodiscard]] KVPACK_HOST_DEVICE constexpr Nibbles unpack_int4(std::uint8_t byte) noexcept {
  return {static_cast<unsigned>(byte & 0x0Fu), static_cast<unsigned>(byte >> 4)};
}
/// Packs two stored 4-bit codes (each < 16) into one byte, element 2i in the low nibble.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr std::uint8_t pack_int4(unsigned lo, unsigned hi) noexcept {
  return static_cast<std::uint8_t>((lo & 0x0Fu) | ((hi & 0x0Fu) << 4));
}

/// Stored codes of one chunk of kChunk = 8 values: INT4 uses w[0] (nibble e at bits 4e), 8-bit
/// codes use w[0] (bytes 0..3) and w[1] (bytes 4..7), byte e at bits 8(e % 4).
struct ChunkCodes {
  std::uint32_t w[2];
};

/// Reads the codes of a chunk of 8 values at `p` (INT4: 4 bytes, 8-bit codes: 8 bytes), with
/// word loads where `p` is suitably aligned and byte loads otherwise.
template <int Bits>
[[nodiscard]] KVPACK_HOST_DEVICE inline ChunkCodes load_chunk(const std::uint8_t* p) noexcept {
  ChunkCodes c{{0u, 0u}};
#if defined(__CUDA_ARCH__)
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  if constexpr (Bits == 4) {
    c.w[0] = (addr & 3u) == 0 ? *reinterpret_cast<const std::uint32_t*>(p) : load_le32(p);
  } else {
    if ((addr & 7u) == 0) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      c.w[0] = v.x;
      c.w[1] = v.y;
    } else {
      c.w[0] = load_le32(p);
      c.w[1] = load_le32(p + 4);
    }
  }
#else
  c.w[0] = load_le32(p);
  if constexpr (Bits == 8) c.w[1] = load_le32(p + 4);
#endif
  return c;
}

/// Reads one metadata value (fp16 or fp32, little-endian) as float.
template <bool MetaF16>
[[nodiscard]] KVPACK_HOST_DEVICE inline float load_meta_value(const std::uint8_t* p) noexcept {
  if constexpr (MetaF16) {
    return fp16_to_float(static_cast<std::uint16_t>(load_le16(p)));
  } else {
    return detail::bit_cast<float>(load_le32(p));
  }
}
/// Writes one metadata value (already representable in the precision) little-endian.
template <bool MetaF16>
KVPACK_HOST_DEVICE inline void store_meta_value(float v, std::uint8_t* p) noexcept {
  const std::uint32_t u = MetaF16 ? fp16_from_float(v) : detail::bit_cast<std::uint32_t>(v);
  p[0] = static_cast<std::uint8_t>(u);
  p[1] = static_cast<std::uint8_t>(u >> 8);
  if constexpr (!MetaF16) {
    p[2] = static_cast<std::uint8_t>(u >> 16);
    p[3] = static_cast<std::uint8_t>(u >> 24);
  }
}

/// Scale (and zero-point) of one group, read from its metadata bytes.
template <class DC>
[[nodiscard]] KVPACK_HOST_DEVICE inline GroupParams load_group_params(const std::uint8_t* meta) noexcept {
  GroupParams p;
  p.scale = load_meta_value<DC::meta_f16>(meta);
  p.zero = DC::asymmetric ? load_meta_value<DC::meta_f16>(meta + DC::meta_value_bytes) : 0.f;
  return p;
}

// ------------------------------------------------------------------------------------------------
// Dequantization
// ------------------------------------------------------------------------------------------------

/// Integer level of a stored code (INT4 nibble or byte), as int_codec.hpp's from_stored.
template <class DC>
[[nodiscard]] KVPACK_HOST_DEVICE constexpr int level_of(unsigned stored) noexcept {
  if constexpr (DC::bits == 4) return static_cast<int>(stored & 0x0Fu) + DC::qmin;
  else if constexpr (DC::asymmetric) return static_cast<int>(stored & 0xFFu);
  else return static_cast<int>(static_cast<std::int8_t>(static_cast<std::uint8_t>(stored & 0xFFu)));
}

/// Reconstruction of one stored code under p: the host codec's decode_value itself.
template <class DC>
[[nodiscard]] KVPACK_HOST_DEVICE inline float dequantize(unsigned stored, GroupParams p) noexcept {
  return DC::codec::decode_value(stored, p);
}

/// Stored code e (0..7) of a chunk.
template <int Bits>
[[nodiscard]] KVPACK_HOST_DEVICE constexpr unsigned chunk_code(const ChunkCodes& c, int e) noexcept {
  if constexpr (Bits == 4) return (c.w[0] >> (4 * e)) & 0x0Fu;
  else return (c.w[e / 4] >> (8 * (e % 4))) & 0xFFu;
}

/// Dequantizes the 8 values of a chunk: out[e] = dequantize(code e).
template <class DC>
KVPACK_HOST_DEVICE inline void dequantize_chunk(const ChunkCodes& c, GroupParams p, float* out) noexcept {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int e = 0; e < kChunk; ++e) out[e] = dequantize<DC>(chunk_code<DC::bits>(c, e), p);
}

// ------------------------------------------------------------------------------------------------
// Quantization (the device append path; bit-identical to the host codecs)
// ------------------------------------------------------------------------------------------------

// One implementation: the host codecs (include/kvpack/codec/int_codec.hpp, fp8_codec.hpp,
// meta.hpp) are __host__ __device__; these names forward to them.
[[nodiscard]] KVPACK_HOST_DEVICE inline float next_up(float f) noexcept { return detail::next_up(f); }
[[nodiscard]] KVPACK_HOST_DEVICE inline float next_down(float f) noexcept { return detail::next_down(f); }
[[nodiscard]] KVPACK_HOST_DEVICE inline float f32_round_up(double d) noexcept { return detail::f32_round_up(d); }
[[nodiscard]] KVPACK_HOST_DEVICE inline float f32_round_down(double d) noexcept { return detail::f32_round_down(d); }
template <bool MetaF16>
[[nodiscard]] KVPACK_HOST_DEVICE inline float meta_round_up(double d) noexcept {
  return detail::meta_round_up<std::conditional_t<MetaF16, kvpack::MetaF16, MetaF32>>(d);
}
template <bool MetaF16>
[[nodiscard]] KVPACK_HOST_DEVICE inline float meta_round_down(double d) noexcept {
  return detail::meta_round_down<std::conditional_t<MetaF16, kvpack::MetaF16, MetaF32>>(d);
}

/// Scale (and zero-point) of `count` finite values x[0], x[stride], ...: the codec's derive.
template <class DC>
[[nodiscard]] KVPACK_HOST_DEVICE inline GroupParams derive_group(const float* x, std::ptrdiff_t stride,
                                                                int count) noexcept {
  return DC::codec::derive(x, stride, count);
}

/// Stored code of x under p (p as stored): the codec's encode_value.
template <class DC>
[[nodiscard]] KVPACK_HOST_DEVICE inline unsigned quantize(float x, GroupParams p) noexcept {
  return DC::codec::encode_value(x, p);
}

/// Quantizes one group of DC::group values x[0], x[stride], ... (finite): writes the group's
/// metadata (DC::meta_bytes bytes at `meta`) and its codes (DC::group * bits / 8 bytes at
/// `codes`, the group's first byte). The codes are computed against the parameters as stored.
template <class DC>
KVPACK_HOST_DEVICE inline void quantize_group(const float* x, std::ptrdiff_t stride, std::uint8_t* codes,
                                              std::uint8_t* meta) noexcept {
  using C = typename DC::codec;
  C::store_params(C::derive(x, stride, DC::group), reinterpret_cast<std::byte*>(meta));
  const GroupParams ps = C::load_params(reinterpret_cast<const std::byte*>(meta));
  if constexpr (DC::bits == 4) {
    for (int i = 0; i < DC::group; i += 2)
      codes[i / 2] = pack_int4(quantize<DC>(x[i * stride], ps), quantize<DC>(x[(i + 1) * stride], ps));
  } else {
    for (int i = 0; i < DC::group; ++i) codes[i] = static_cast<std::uint8_t>(quantize<DC>(x[i * stride], ps));
  }
}

/// Quantizes one per-token row of n values (n a multiple of the group size) into `codes`
/// (code_bytes(n)) and `meta` ((n / G) * meta_bytes): encode_row<C> of codec/rows.hpp.
template <class DC>
KVPACK_HOST_DEVICE inline void quantize_row(const float* x, int n, std::uint8_t* codes, std::uint8_t* meta) noexcept {
  for (int g = 0; g < n / DC::group; ++g)
    quantize_group<DC>(x + g * DC::group, 1, codes + g * DC::group * DC::bits / 8, meta + g * DC::meta_bytes);
}

// ------------------------------------------------------------------------------------------------
// Online softmax and the split-K combine (Milakov & Gimelshein 2018; FlashDecoding, Dao et al. 2023)
// ------------------------------------------------------------------------------------------------

/// exp in fp32 (expf on the device: full precision, not __expf).
[[nodiscard]] KVPACK_HOST_DEVICE inline float exp_f32(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

/// Weights that bring two softmax partials to a common maximum: m = max(m_a, m_b),
/// w_a = exp(m_a - m), w_b = exp(m_b - m). A partial with m = -Inf (it saw no key) gets weight 0;
/// when both are -Inf, m = -Inf and both weights are 0.
struct MergeWeights {
  float m, wa, wb;
};
[[nodiscard]] KVPACK_HOST_DEVICE inline MergeWeights merge_weights(float m_a, float m_b) noexcept {
  const float m = m_a < m_b ? m_b : m_a;
  if (m == kNegInf) return {m, 0.f, 0.f};
  return {m, m_a == kNegInf ? 0.f : exp_f32(m_a - m), m_b == kNegInf ? 0.f : exp_f32(m_b - m)};
}

/// A softmax partial over some keys: running maximum m of the scaled logits, l = sum exp(s - m).
/// The matching accumulator is acc = sum exp(s - m) v (kept by the caller, per channel).
struct SoftmaxState {
  float m = kNegInf;
  float l = 0.f;
};
/// Merges partial b into a; returns the factors that rescale a's and b's accumulators:
/// acc = acc_a * w.wa + acc_b * w.wb.
KVPACK_HOST_DEVICE inline MergeWeights merge_into(SoftmaxState& a, SoftmaxState b) noexcept {
  const MergeWeights w = merge_weights(a.m, b.m);
  a.m = w.m;
  a.l = a.l * w.wa + b.l * w.wb;
  return w;
}

/// Combine step of split-K decoding for one output channel: given n partials (m[s], l[s],
/// acc[s * acc_stride]), returns sum_s acc_s exp(m_s - M) / sum_s l_s exp(m_s - M) with
/// M = max_s m_s, or 0 when no partial saw a key (a query that sees nothing gets zeros, as the
/// scalar kernel). Two passes (maximum first) so no term overflows.
[[nodiscard]] KVPACK_HOST_DEVICE inline float combine_channel(const float* m, const float* l, const float* acc,
                                                              int n, std::ptrdiff_t acc_stride) noexcept {
  float mx = kNegInf;
  for (int s = 0; s < n; ++s) mx = m[s] > mx ? m[s] : mx;
  if (mx == kNegInf) return 0.f;
  float num = 0.f, den = 0.f;
  for (int s = 0; s < n; ++s) {
    if (m[s] == kNegInf) continue;
    const float w = exp_f32(m[s] - mx);
    num += acc[s * acc_stride] * w;
    den += l[s] * w;
  }
  return den > 0.f ? num / den : 0.f;
}

}  // namespace kvpack::cuda
