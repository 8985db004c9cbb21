// NF4: a 4-bit non-uniform codebook codec with a per-group absmax scale (the NormalFloat data
// type of QLoRA, Dettmers et al. 2023, arXiv:2305.14314, section 3 and appendix E), issue 20's
// "one non-uniform codebook option".
//
// The 16 levels are the quantiles of a standard normal distribution normalized to [-1, 1], with
// an exact zero and an asymmetric split (7 negative, 8 positive levels), as published with
// QLoRA (bitsandbytes' NF4 table). Uniform INT4 spaces its levels evenly over the group's range;
// NF4 spends them where normally distributed values are dense, so on Gaussian-like groups its
// mean squared error is lower at the same bits (tests/test_codec_nf4.cpp measures it), while its
// largest gap (between -1 and the next level, 0.304) makes its worst-case error larger.
//
// Numerics (scalar; every backend decodes bit-identically):
//  * scale = max|x| of the group rounded UP to the metadata precision, so t = x / scale lies in
//    [-1, 1]; the all-zero group gets scale 1; max|x| is clamped to the metadata range first
//    (±65504 for fp16: CASES C1), and t is clamped to [-1, 1], so an out-of-range value saturates;
//  * code u = the level nearest to t: the number of midpoints between adjacent levels that t
//    exceeds (a tie goes to the lower level); t = fl(x / scale), an IEEE division;
//  * x̂ = level[u] * scale (one multiply). A constant group decodes exactly when its value is
//    representable in the metadata precision (t = ±1 is a level), zero decodes exactly.
// Error per value: at most half the gap around t, times the scale: <= 0.1519 * scale
// (kNf4MaxHalfGap), plus fp32 rounding.
// Stored layout: INT4's: element 2i in the low nibble of byte i; metadata per group: the scale
// (MetaF16 by default, or MetaF32). Bits per value: 4 + 16 / G with fp16 (group 32: 4.5, the
// bits of asymmetric INT4 with group 64; group 64: 4.25).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvpack/codec/meta.hpp"
#include "kvpack/codec/params.hpp"
#include "kvpack/config.hpp"
#include "kvpack/detail/pick.hpp"

namespace kvpack {

namespace detail {
/// NF4 level of stored code u (0..15), ascending.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr float nf4_level(unsigned u) noexcept {
  constexpr float levels[16] = {-1.0f,
                                -0.6961928009986877f,
                                -0.5250730514526367f,
                                -0.39491748809814453f,
                                -0.28444138169288635f,
                                -0.18477343022823334f,
                                -0.09105003625154495f,
                                0.0f,
                                0.07958029955625534f,
                                0.16093020141124725f,
                                0.24611230194568634f,
                                0.33791524171829224f,
                                0.44070982933044434f,
                                0.5626170039176941f,
                                0.7229568362236023f,
                                1.0f};
  return levels[u & 15u];
}
/// Midpoint between NF4 levels u and u + 1 (u = 0..14), computed in float as the encoder uses it.
[[nodiscard]] KVPACK_HOST_DEVICE constexpr float nf4_midpoint(unsigned u) noexcept {
  return (nf4_level(u) + nf4_level(u + 1)) * 0.5f;
}
}  // namespace detail

/// Largest distance from a point of [-1, 1] to its nearest NF4 level (half the widest gap,
/// between -1 and -0.6962): the codec's error bound in units of the group scale.
inline constexpr double kNf4MaxHalfGap = (1.0 - 0.6961928009986877) / 2;

/// NF4 codec: 16-level normal-float codebook, groups of GroupT::size values sharing one absmax
/// scale stored in Meta precision. Bits per value: 4 + 8 * Meta::bytes / group_size.
template <class GroupT, class Meta>
struct Nf4Codec {
  static constexpr int bits = 4;
  static constexpr bool grouped = true;
  static constexpr int group_size = GroupT::size;
  static constexpr bool asymmetric = false;
  /// Marks a codebook codec: x̂ = codebook_level(u) * scale (the AVX2 decoder looks it up).
  static constexpr bool codebook = true;
  using meta_type = Meta;
  static constexpr int meta_bytes_per_group = Meta::bytes;
  static constexpr double bits_per_value = 4 + 8.0 * meta_bytes_per_group / group_size;
  /// Stored codec identity (codec/format_id.hpp): family 5 (NF4 codebook), no zero-point,
  /// metadata bytes in bits 5-7, 4 bits per code.
  static constexpr std::uint16_t format_descriptor =
      static_cast<std::uint16_t>(5u | (static_cast<unsigned>(Meta::bytes) << 5) | (4u << 8));

  /// Bytes holding n codes: ceil(n / 2).
  [[nodiscard]] KVPACK_HOST_DEVICE static constexpr std::size_t code_bytes(std::size_t n) noexcept { return (n + 1) / 2; }
  /// Codebook level of stored code u.
  [[nodiscard]] KVPACK_HOST_DEVICE static constexpr float codebook_level(unsigned u) noexcept { return detail::nf4_level(u); }

  /// Scale of `count` finite values x[0], x[stride], ...: max|x| rounded up (1 for all zeros).
  [[nodiscard]] KVPACK_HOST_DEVICE static GroupParams derive(const float* x, std::ptrdiff_t stride, int count) noexcept {
    const auto [lo, hi] = detail::group_range(x, stride, count);
    const float amax = detail::clamp_f(-lo < hi ? hi : -lo, 0.f, detail::meta_max<Meta>);
    GroupParams p;
    p.scale = amax == 0.f ? 1.f : detail::meta_round_up<Meta>(amax);
    return p;
  }
  /// Stored code of x under p: the nearest level to x / scale (ties to the lower level).
  [[nodiscard]] KVPACK_HOST_DEVICE static unsigned encode_value(float x, GroupParams p) noexcept {
    const float t = detail::div_rn(x, p.scale);
    unsigned u = 0;
    for (unsigned i = 0; i < 15; ++i) u += t > detail::nf4_midpoint(i) ? 1u : 0u;
    return u;
  }
  [[nodiscard]] KVPACK_HOST_DEVICE static float decode_value(unsigned u, GroupParams p) noexcept {
    return detail::nf4_level(u) * p.scale;
  }
  /// Packs code u as element i (element 2i in the low nibble of byte i); other elements unchanged.
  KVPACK_HOST_DEVICE static void store_code(std::byte* row, std::size_t i, unsigned u) noexcept {
    auto* b = reinterpret_cast<std::uint8_t*>(row) + i / 2;
    const unsigned sh = (i % 2) * 4u;
    *b = static_cast<std::uint8_t>((*b & ~(0x0Fu << sh)) | ((u & 0x0Fu) << sh));
  }
  [[nodiscard]] KVPACK_HOST_DEVICE static unsigned load_code(const std::byte* row, std::size_t i) noexcept {
    return (static_cast<unsigned>(row[i / 2]) >> ((i % 2) * 4u)) & 0x0Fu;
  }
  KVPACK_HOST_DEVICE static void store_params(GroupParams p, std::byte* dst) noexcept { detail::store_meta<Meta>(p.scale, dst); }
  [[nodiscard]] KVPACK_HOST_DEVICE static GroupParams load_params(const std::byte* src) noexcept {
    return GroupParams{detail::load_meta<Meta>(src), 0.f};
  }
};

namespace detail {
template <class... Ps>
inline constexpr bool valid_nf4_params_v = ((is_group_v<Ps> || is_meta_v<Ps>) && ...) &&
                                           count_if_v<is_group, Ps...> <= 1 && count_if_v<is_meta, Ps...> <= 1;
}  // namespace detail

/// NF4 codec; parameters in any order: Group<G> (default 32), MetaF16 (default) | MetaF32.
/// Nf4<> = group 32, fp16 absmax scale: 4.5 bits/value; Nf4<Group<64>>: 4.25.
template <class... Ps>
struct Nf4 : Nf4Codec<detail::pick_or_t<detail::is_group, Group<32>, Ps...>,
                      detail::pick_or_t<detail::is_meta, MetaF16, Ps...>> {
  static_assert(detail::valid_nf4_params_v<Ps...>,
                "kvpack::Nf4<...>: parameters must be at most one Group<G> and one of MetaF16|MetaF32");
};

}  // namespace kvpack
