// Parameter tags shared by the quantization codecs: group size, symmetric/asymmetric mode,
// metadata precision, and the decoded per-group parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvpack {

/// Group size: how many consecutive values share one scale (and zero-point).
/// Per-token codecs group along head_dim; per-channel keys (KIVI) group along tokens.
/// G must be a power of two between 8 and 256.
template <int G>
struct Group {
  static_assert(G >= 8 && G <= 256 && (G & (G - 1)) == 0,
                "kvpack::Group<G>: the group size must be a power of two in [8, 256]");
  static constexpr int size = G;
};

/// Symmetric quantization: x̂ = scale * q with q in [-2^(b-1), 2^(b-1) - 1], scale = amax / (2^(b-1) - 1).
struct Symmetric {
  static constexpr bool asymmetric = false;
};
/// Asymmetric quantization: x̂ = zero + scale * q with q in [0, 2^b - 1], zero = group minimum
/// (rounded down to the metadata precision), scale = (max - zero) / (2^b - 1) rounded up.
struct Asymmetric {
  static constexpr bool asymmetric = true;
};

/// Scale and zero-point stored as IEEE binary16. Integer codecs clamp group extremes beyond ±65504 to
/// ±65504 before the scale is derived, so metadata never becomes Inf (CASES C1). FP8 codecs store
/// only the scale amax / format_max, which needs no clamp and saturates at 65504 (CASES C3).
struct MetaF16 {
  static constexpr int bytes = 2;
};
/// Scale and zero-point stored as IEEE binary32.
struct MetaF32 {
  static constexpr int bytes = 4;
};

/// Decoded parameters of one group, already rounded to the metadata precision:
/// x̂ = zero + scale * q (zero is 0 for symmetric and FP8 codecs). scale is finite and > 0.
struct GroupParams {
  float scale = 1.f;
  float zero = 0.f;
};

namespace detail {
template <class T>
inline constexpr bool is_mode_v = false;
template <>
inline constexpr bool is_mode_v<Symmetric> = true;
template <>
inline constexpr bool is_mode_v<Asymmetric> = true;
template <class T>
inline constexpr bool is_meta_v = false;
template <>
inline constexpr bool is_meta_v<MetaF16> = true;
template <>
inline constexpr bool is_meta_v<MetaF32> = true;
template <class T>
inline constexpr bool is_group_v = false;
template <int G>
inline constexpr bool is_group_v<Group<G>> = true;
template <class T>
struct is_group : std::bool_constant<is_group_v<T>> {};
template <class T>
struct is_mode : std::bool_constant<is_mode_v<T>> {};
template <class T>
struct is_meta : std::bool_constant<is_meta_v<T>> {};
}  // namespace detail

}  // namespace kvpack
