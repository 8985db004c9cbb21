// FP8 codecs (OCP 8-bit floating point: E4M3FN and E5M2) with a per-group scale.
//
// scale = amax / format_max rounded UP to the metadata precision (never 0: an all-zero group gets
// scale 1; a constant group gets scale |v| so it decodes exactly when |v| is representable);
// code = fp8(x / scale) with round-half-to-even and saturation (finite input never becomes NaN);
// x̂ = fp8_to_float(code) * scale. Relative error in the format's normal range: <= 2^-4 (E4M3),
// <= 2^-3 (E5M2). Spec: OCP 8-bit Floating Point Specification (OFP8) rev. 1.0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvpack/codec/meta.hpp"
#include "kvpack/codec/params.hpp"
#include "kvpack/detail/pick.hpp"
#include "kvpack/numeric.hpp"

namespace kvpack {

/// FP8 element format tags.
struct E4M3 {
  static constexpr float max = kE4M3Max;  // 448
  [[nodiscard]] KVPACK_HOST_DEVICE static std::uint8_t encode(float x) noexcept { return e4m3_from_float(x); }
  [[nodiscard]] KVPACK_HOST_DEVICE static float decode(std::uint8_t c) noexcept { return e4m3_to_float(c); }
};
struct E5M2 {
  static constexpr float max = kE5M2Max;  // 57344
  [[nodiscard]] KVPACK_HOST_DEVICE static std::uint8_t encode(float x) noexcept { return e5m2_from_float(x); }
  [[nodiscard]] KVPACK_HOST_DEVICE static float decode(std::uint8_t c) noexcept { return e5m2_to_float(c); }
};

/// FP8 codec with format F (E4M3 or E5M2), groups of GroupT::size values sharing one scale stored
/// in Meta precision. Bits per value: 8 + 8 * Meta::bytes / group_size (group 32, fp16: 8.5).
template <class F, class GroupT, class Meta>
struct Fp8Codec {
  static constexpr int bits = 8;
  static constexpr bool grouped = true;
  static constexpr int group_size = GroupT::size;
  static constexpr bool asymmetric = false;
  using meta_type = Meta;
  using format = F;
  static constexpr int meta_bytes_per_group = Meta::bytes;
  static constexpr double bits_per_value = 8 + 8.0 * meta_bytes_per_group / group_size;

  [[nodiscard]] KVPACK_HOST_DEVICE static constexpr std::size_t code_bytes(std::size_t n) noexcept { return n; }

  /// Scale of `count` finite values x[0], x[stride], ...
  /// The group's values are NOT clamped to the metadata range (unlike the integer codecs' zero-point,
  /// the only stored quantity is the scale amax / F::max, far inside fp16 for any |x| <= 65504 * 448):
  /// a group with amax 1e5 keeps its relative error bound with fp16 metadata (CASES C3). A scale
  /// beyond the metadata range saturates (65504 for fp16), and the values beyond 65504 * F::max then
  /// saturate to ±F::max * scale: finite, never Inf.
  [[nodiscard]] KVPACK_HOST_DEVICE static GroupParams derive(const float* x, std::ptrdiff_t stride, int count) noexcept {
    const auto [lo, hi] = detail::group_range(x, stride, count);
    const float amax = -lo < hi ? hi : -lo;  // std::max(-lo, hi)
    GroupParams p;
    if (amax == 0.f) p.scale = 1.f;
    else if (lo == hi) p.scale = detail::meta_round_up<Meta>(amax);
    else p.scale = detail::meta_round_up<Meta>(static_cast<double>(amax) / F::max);
    return p;
  }
  [[nodiscard]] KVPACK_HOST_DEVICE static unsigned encode_value(float x, GroupParams p) noexcept {
    return F::encode(detail::div_rn(x, p.scale));
  }
  [[nodiscard]] KVPACK_HOST_DEVICE static float decode_value(unsigned u, GroupParams p) noexcept {
    return F::decode(static_cast<std::uint8_t>(u)) * p.scale;
  }
  KVPACK_HOST_DEVICE static void store_code(std::byte* row, std::size_t i, unsigned u) noexcept { row[i] = static_cast<std::byte>(u); }
  [[nodiscard]] KVPACK_HOST_DEVICE static unsigned load_code(const std::byte* row, std::size_t i) noexcept {
    return static_cast<unsigned>(row[i]);
  }
  KVPACK_HOST_DEVICE static void store_params(GroupParams p, std::byte* dst) noexcept { detail::store_meta<Meta>(p.scale, dst); }
  [[nodiscard]] KVPACK_HOST_DEVICE static GroupParams load_params(const std::byte* src) noexcept {
    return GroupParams{detail::load_meta<Meta>(src), 0.f};
  }
};

namespace detail {
template <class... Ps>
inline constexpr bool valid_fp8_params_v = ((is_group_v<Ps> || is_meta_v<Ps>) && ...) &&
                                           count_if_v<is_group, Ps...> <= 1 && count_if_v<is_meta, Ps...> <= 1;
}

/// FP8 E4M3FN codec; parameters in any order: Group<G> (default 32), MetaF16 (default) | MetaF32.
template <class... Ps>
struct Fp8E4M3 : Fp8Codec<E4M3, detail::pick_or_t<detail::is_group, Group<32>, Ps...>,
                          detail::pick_or_t<detail::is_meta, MetaF16, Ps...>> {
  static_assert(detail::valid_fp8_params_v<Ps...>,
                "kvpack::Fp8E4M3<...>: parameters must be at most one Group<G> and one of MetaF16|MetaF32");
};
/// FP8 E5M2 codec; parameters as Fp8E4M3.
template <class... Ps>
struct Fp8E5M2 : Fp8Codec<E5M2, detail::pick_or_t<detail::is_group, Group<32>, Ps...>,
                          detail::pick_or_t<detail::is_meta, MetaF16, Ps...>> {
  static_assert(detail::valid_fp8_params_v<Ps...>,
                "kvpack::Fp8E5M2<...>: parameters must be at most one Group<G> and one of MetaF16|MetaF32");
};

}  // namespace kvpack
