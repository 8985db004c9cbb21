// Integer codecs (8, 4, 3 and 2 bits) with per-group scales (and zero-points), the core of
// KIVI/KVQuant-style KV-cache quantization. Int8<> and Int4<> are here; Int3<> and Int2<> in
// codec/int_lowbit.hpp.
//
// Numerics (asserted by tests/test_codec_int.cpp and CASES C1, C2, C4):
//  * symmetric: q = clamp(rne(x / scale), -2^(b-1), 2^(b-1) - 1), x̂ = scale * q,
//    scale = amax / (2^(b-1) - 1) rounded UP to the metadata precision;
//  * asymmetric: q = clamp(rne((x - zero) / scale), 0, 2^b - 1), x̂ = zero + scale * q,
//    zero = min rounded DOWN, scale = (max - zero) / (2^b - 1) rounded UP;
//  * rne = round half to even; division (not multiplication by an inverse) so every backend
//    produces bit-identical codes; clamping happens before packing, never wrapping;
//  * with MetaF16 the group's extremes are clamped to ±65504 first (CASES C1);
//  * constant groups reconstruct exactly whenever the constant is representable in the metadata
//    precision (asymmetric: zero = v, q = 0; symmetric: scale = |v|, q = ±1); the all-zero group
//    gets scale 1. A scale is never 0, Inf or NaN.
// Stored codes: INT8 symmetric as two's-complement int8; INT8 asymmetric as uint8. Sub-byte codes
// (4, 3, 2 bits) are unsigned u = q - qmin (symmetric INT4: q + 8, asymmetric: q) in an LSB-first
// bit stream: element i occupies bits [b*i, b*i + b) of the row, bit k of the stream being bit
// k % 8 of byte k / 8. INT4: element 2i in the LOW nibble of byte i; INT2: element 4i + j at bits
// 2j of byte i; INT3: 8 codes in 3 bytes, element 8i + j at stream bits 24i + 3j (elements 2 and 5
// of each triple straddle a byte boundary).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvpack/codec/meta.hpp"
#include "kvpack/codec/params.hpp"
#include "kvpack/config.hpp"
#include "kvpack/detail/pick.hpp"

namespace kvpack {

/// Integer codec with `Bits` bits per code (2, 3, 4 or 8), groups of GroupT::size values sharing one
/// scale (and, asymmetric, one zero-point) stored in Meta precision.
/// Bits per value including metadata: Bits + 8 * meta_bytes_per_group / group_size
/// (INT4, group 32, fp16 scale + zero-point: 4 + 32/32 = 5.0).
template <int Bits, class GroupT, class Mode, class Meta>
struct IntCodec {
  static_assert(Bits == 2 || Bits == 3 || Bits == 4 || Bits == 8,
                "kvpack::IntCodec: only 2-, 3-, 4- and 8-bit codes are supported");
  static constexpr int bits = Bits;
  /// Codes narrower than a byte, stored unsigned (q - qmin) in the LSB-first bit stream.
  static constexpr bool sub_byte = Bits < 8;
  static constexpr bool grouped = true;
  static constexpr int group_size = GroupT::size;
  static constexpr bool asymmetric = Mode::asymmetric;
  using meta_type = Meta;
  static constexpr int qmin = asymmetric ? 0 : -(1 << (Bits - 1));
  static constexpr int qmax = asymmetric ? (1 << Bits) - 1 : (1 << (Bits - 1)) - 1;
  static constexpr int meta_bytes_per_group = (asymmetric ? 2 : 1) * Meta::bytes;
  static constexpr double bits_per_value = Bits + 8.0 * meta_bytes_per_group / group_size;

  /// Bytes holding n codes: ceil(n * Bits / 8) (whole bytes when n is a multiple of 8).
  [[nodiscard]] KVPACK_HOST_DEVICE static constexpr std::size_t code_bytes(std::size_t n) noexcept {
    return (n * Bits + 7) / 8;
  }

  /// Scale and zero-point of `count` values x[0], x[stride], ... (finite input), already rounded
  /// to the metadata precision.
  [[nodiscard]] KVPACK_HOST_DEVICE static GroupParams derive(const float* x, std::ptrdiff_t stride, int count) noexcept {
    return from_range(detail::group_range(x, stride, count));
  }
  /// The same from the group's range (its first minimum and maximum, as detail::group_range finds
  /// them): SIMD encoders find the range themselves and derive through this.
  [[nodiscard]] KVPACK_HOST_DEVICE static GroupParams from_range(detail::GroupRange r) noexcept {
    float lo = r.min, hi = r.max;
    constexpr float lim = detail::meta_max<Meta>;
    lo = detail::clamp_f(lo, -lim, lim);
    hi = detail::clamp_f(hi, -lim, lim);
    GroupParams p;
    if constexpr (asymmetric) {
      p.zero = detail::meta_round_down<Meta>(lo);
      const double range = static_cast<double>(hi) - p.zero;
      p.scale = range > 0 ? detail::meta_round_up<Meta>(range / qmax) : 1.f;
    } else {
      const float amax = -lo < hi ? hi : -lo;  // std::max(-lo, hi)
      if (amax == 0.f) {
        p.scale = 1.f;
      } else if (lo == hi) {
        p.scale = detail::meta_round_up<Meta>(amax);  // constant group: q = ±1
      } else {
        p.scale = detail::meta_round_up<Meta>(static_cast<double>(amax) / qmax);
      }
    }
    return p;
  }

  /// Integer level of x under p: clamp then round half to even.
  [[nodiscard]] KVPACK_HOST_DEVICE static int quantize(float x, GroupParams p) noexcept {
    const float t = detail::div_rn(asymmetric ? detail::sub_rn(x, p.zero) : x, p.scale);
    const float c = detail::clamp_f(t, static_cast<float>(qmin), static_cast<float>(qmax));
    return static_cast<int>(detail::round_half_even(c));
  }
  /// Reconstruction of integer level q.
  [[nodiscard]] KVPACK_HOST_DEVICE static float dequantize(int q, GroupParams p) noexcept {
    return asymmetric ? p.zero + p.scale * static_cast<float>(q) : p.scale * static_cast<float>(q);
  }
  /// Stored (packed) form of level q, and back.
  [[nodiscard]] KVPACK_HOST_DEVICE static constexpr unsigned to_stored(int q) noexcept {
    if constexpr (sub_byte) return static_cast<unsigned>(q - qmin);  // symmetric INT4: q + 8
    else if constexpr (asymmetric) return static_cast<unsigned>(q);
    else return static_cast<unsigned>(static_cast<std::uint8_t>(q));  // two's complement int8
  }
  [[nodiscard]] KVPACK_HOST_DEVICE static constexpr int from_stored(unsigned u) noexcept {
    if constexpr (sub_byte) return static_cast<int>(u) + qmin;
    else if constexpr (asymmetric) return static_cast<int>(u);
    else return static_cast<int>(static_cast<std::int8_t>(static_cast<std::uint8_t>(u)));
  }

  /// Packs stored code u (< 2^Bits) as element i of a row of codes; other elements unchanged.
  KVPACK_HOST_DEVICE static void store_code(std::byte* row, std::size_t i, unsigned u) noexcept {
    if constexpr (sub_byte) {
      constexpr unsigned mask = (1u << Bits) - 1u;
      const std::size_t bit = i * Bits;
      auto* p = reinterpret_cast<std::uint8_t*>(row) + bit / 8;
      const unsigned sh = static_cast<unsigned>(bit % 8);
      p[0] = static_cast<std::uint8_t>((p[0] & ~(mask << sh)) | ((u & mask) << sh));
      if (sh + Bits > 8)  // INT3 only: the code straddles into the next byte
        p[1] = static_cast<std::uint8_t>((p[1] & ~(mask >> (8 - sh))) | ((u & mask) >> (8 - sh)));
    } else {
      row[i] = static_cast<std::byte>(u);
    }
  }
  /// Stored code of element i of a row of codes (reads only the bytes holding element i).
  [[nodiscard]] KVPACK_HOST_DEVICE static unsigned load_code(const std::byte* row, std::size_t i) noexcept {
    if constexpr (sub_byte) {
      constexpr unsigned mask = (1u << Bits) - 1u;
      const std::size_t bit = i * Bits;
      const auto* p = reinterpret_cast<const std::uint8_t*>(row) + bit / 8;
      const unsigned sh = static_cast<unsigned>(bit % 8);
      unsigned w = p[0];
      if (sh + Bits > 8) w |= static_cast<unsigned>(p[1]) << 8;
      return (w >> sh) & mask;
    } else {
      return static_cast<unsigned>(row[i]);
    }
  }
  /// Encodes x under p into its stored code; decodes a stored code.
  [[nodiscard]] KVPACK_HOST_DEVICE static unsigned encode_value(float x, GroupParams p) noexcept { return to_stored(quantize(x, p)); }
  [[nodiscard]] KVPACK_HOST_DEVICE static float decode_value(unsigned u, GroupParams p) noexcept { return dequantize(from_stored(u), p); }

  /// Metadata layout: scale, then zero-point (asymmetric only), each Meta::bytes little-endian.
  KVPACK_HOST_DEVICE static void store_params(GroupParams p, std::byte* dst) noexcept {
    detail::store_meta<Meta>(p.scale, dst);
    if constexpr (asymmetric) detail::store_meta<Meta>(p.zero, dst + Meta::bytes);
  }
  [[nodiscard]] KVPACK_HOST_DEVICE static GroupParams load_params(const std::byte* src) noexcept {
    GroupParams p;
    p.scale = detail::load_meta<Meta>(src);
    if constexpr (asymmetric) p.zero = detail::load_meta<Meta>(src + Meta::bytes);
    return p;
  }
};

namespace detail {
template <class T>
struct is_codec_param : std::bool_constant<is_group_v<T> || is_mode_v<T> || is_meta_v<T>> {};

template <class... Ps>
inline constexpr bool valid_int_params_v =
    (is_codec_param<Ps>::value && ...) && count_if_v<is_group, Ps...> <= 1 &&
    count_if_v<is_mode, Ps...> <= 1 && count_if_v<is_meta, Ps...> <= 1;
}  // namespace detail

/// INT8 codec; parameters in any order: Group<G> (default 32), Symmetric (default) | Asymmetric,
/// MetaF16 (default) | MetaF32. Int8<> = symmetric, group 32, fp16 scale: 8.5 bits/value.
template <class... Ps>
struct Int8 : IntCodec<8, detail::pick_or_t<detail::is_group, Group<32>, Ps...>,
                       detail::pick_or_t<detail::is_mode, Symmetric, Ps...>,
                       detail::pick_or_t<detail::is_meta, MetaF16, Ps...>> {
  static_assert(detail::valid_int_params_v<Ps...>,
                "kvpack::Int8<...>: parameters must be at most one each of Group<G>, "
                "Symmetric|Asymmetric and MetaF16|MetaF32");
};

/// INT4 codec; parameters in any order: Group<G> (default 32), Asymmetric (default) | Symmetric,
/// MetaF16 (default) | MetaF32. Int4<> = asymmetric, group 32, fp16 scale + zero: 5.0 bits/value.
template <class... Ps>
struct Int4 : IntCodec<4, detail::pick_or_t<detail::is_group, Group<32>, Ps...>,
                       detail::pick_or_t<detail::is_mode, Asymmetric, Ps...>,
                       detail::pick_or_t<detail::is_meta, MetaF16, Ps...>> {
  static_assert(detail::valid_int_params_v<Ps...>,
                "kvpack::Int4<...>: parameters must be at most one each of Group<G>, "
                "Symmetric|Asymmetric and MetaF16|MetaF32");
};

}  // namespace kvpack
