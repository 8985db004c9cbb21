// Rounding of group metadata (scale, zero-point) to its storage precision, and its byte layout.
//
// Scales are rounded UP and zero-points DOWN, so that every value of a group stays inside the
// representable range [zero, zero + scale * qmax] after the metadata is rounded; the round-trip
// error then stays within half a step of the *stored* scale.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kvpack/codec/params.hpp"
#include "kvpack/config.hpp"
#include "kvpack/numeric.hpp"

#if KVPACK_HAS_AVX2 && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#endif

namespace kvpack::detail {

/// Largest finite float (a constant device code can use; numeric_limits is host-only under nvcc).
inline constexpr float kF32Max = 3.40282347e+38f;

/// Neighbour of a finite float toward +Inf / -Inf (std::nextafter for finite input), by its bits
/// so that device code can use it too.
[[nodiscard]] KVPACK_HOST_DEVICE inline float next_up(float f) noexcept {
  const auto u = bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) == 0) return bit_cast<float>(1u);  // +-0 -> smallest subnormal
  return bit_cast<float>((u & 0x80000000u) ? u - 1u : u + 1u);
}
[[nodiscard]] KVPACK_HOST_DEVICE inline float next_down(float f) noexcept { return -next_up(-f); }

/// Smallest float >= d (d finite). Values beyond FLT_MAX saturate to FLT_MAX.
[[nodiscard]] KVPACK_HOST_DEVICE inline float f32_round_up(double d) noexcept {
  float f = static_cast<float>(d);
  if ((bit_cast<std::uint32_t>(f) & 0x7FFFFFFFu) == 0x7F800000u) return f > 0 ? kF32Max : -kF32Max;
  if (static_cast<double>(f) < d) f = next_up(f);
  return f;
}
/// Largest float <= d (d finite). Values beyond -FLT_MAX saturate to -FLT_MAX.
[[nodiscard]] KVPACK_HOST_DEVICE inline float f32_round_down(double d) noexcept {
  float f = static_cast<float>(d);
  if ((bit_cast<std::uint32_t>(f) & 0x7FFFFFFFu) == 0x7F800000u) return f > 0 ? kF32Max : -kF32Max;
  if (static_cast<double>(f) > d) f = next_down(f);
  return f;
}

/// IEEE single division / subtraction, never contracted or approximated (also under nvcc
/// --use_fast_math): every backend computes the same codes.
[[nodiscard]] KVPACK_HOST_DEVICE inline float div_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
[[nodiscard]] KVPACK_HOST_DEVICE inline float sub_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
/// clamp of a float to [lo, hi] (std::clamp's expression; NaN passes through).
[[nodiscard]] KVPACK_HOST_DEVICE constexpr float clamp_f(float v, float lo, float hi) noexcept {
  return v < lo ? lo : (hi < v ? hi : v);
}

/// Largest magnitude a metadata value may take in this precision (±65504 for fp16).
template <class Meta>
inline constexpr float meta_max = std::is_same_v<Meta, MetaF16> ? kFp16Max : kF32Max;

/// Rounds d up to the metadata precision (exact directed rounding; double -> f32 -> f16 in the same
/// direction equals a direct directed rounding because the f16 grid is a subset of the f32 grid).
// fp16 metadata on the host with F16C (every AVX2 build): the hardware conversion in the
// directed modes. It equals fp16_from_float wherever the two are used here, |f| <= 65504 (callers
// clamp to kFp16Max first; fp16_from_float saturates beyond it where F16C gives Inf), and is
// 5-10x faster than the integer emulation: encode derives two of these per group of 32 values.
// tests/test_meta_f16c.cpp checks both against each other.
#if KVPACK_HAS_AVX2 && !defined(__CUDA_ARCH__)
template <int Mode>
[[nodiscard]] inline float f16c_round(float f) noexcept {
  // _mm_cvtps_ph, not _cvtss_sh: clang's _cvtss_sh macro is a compound literal (-Wpedantic).
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(f), Mode)));
}
#endif

template <class Meta>
[[nodiscard]] KVPACK_HOST_DEVICE inline float meta_round_up(double d) noexcept {
  const float f = f32_round_up(d);
  if constexpr (std::is_same_v<Meta, MetaF16>) {
#if KVPACK_HAS_AVX2 && !defined(__CUDA_ARCH__)
    if (f <= kFp16Max && f >= -kFp16Max) return f16c_round<_MM_FROUND_TO_POS_INF>(f);
#endif
    return fp16_to_float(fp16_from_float(f, Rounding::toward_pos_inf));
  } else {
    return f;
  }
}
template <class Meta>
[[nodiscard]] KVPACK_HOST_DEVICE inline float meta_round_down(double d) noexcept {
  const float f = f32_round_down(d);
  if constexpr (std::is_same_v<Meta, MetaF16>) {
#if KVPACK_HAS_AVX2 && !defined(__CUDA_ARCH__)
    if (f <= kFp16Max && f >= -kFp16Max) return f16c_round<_MM_FROUND_TO_NEG_INF>(f);
#endif
    return fp16_to_float(fp16_from_float(f, Rounding::toward_neg_inf));
  } else {
    return f;
  }
}

template <class Meta>
KVPACK_HOST_DEVICE inline void store_meta(float v, std::byte* dst) noexcept {
  if constexpr (std::is_same_v<Meta, MetaF16>) {
#if KVPACK_HAS_AVX2 && !defined(__CUDA_ARCH__)
    const std::uint16_t h =
        (v <= kFp16Max && v >= -kFp16Max)
            ? static_cast<std::uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(v), _MM_FROUND_TO_NEAREST_INT), 0))
            : fp16_from_float(v);
#else
    const std::uint16_t h = fp16_from_float(v);
#endif
    std::memcpy(dst, &h, sizeof h);
  } else {
    std::memcpy(dst, &v, sizeof v);
  }
}
template <class Meta>
[[nodiscard]] KVPACK_HOST_DEVICE inline float load_meta(const std::byte* src) noexcept {
  if constexpr (std::is_same_v<Meta, MetaF16>) {
    std::uint16_t h;
    std::memcpy(&h, src, sizeof h);
#if KVPACK_HAS_AVX2 && !defined(__CUDA_ARCH__)
    if ((h & 0x7C00u) != 0x7C00u) return _cvtsh_ss(h);  // finite codes; Inf/NaN through the emulation
#endif
    return fp16_to_float(h);
  } else {
    float v;
    std::memcpy(&v, src, sizeof v);
    return v;
  }
}

[[nodiscard]] KVPACK_HOST_DEVICE inline float round_half_even(float v) noexcept {
  constexpr float magic = 12582912.f;  // 1.5 * 2^23
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__fadd_rn(v, magic), magic);
#else
  const float t = v + magic;  // IEEE semantics forbid folding (v + m) - m without -ffast-math
  return t - magic;
#endif
}

/// Minimum, maximum and maximum magnitude of `count` values read with a stride.
struct GroupRange {
  float min, max;
};
[[nodiscard]] KVPACK_HOST_DEVICE inline GroupRange group_range(const float* x, std::ptrdiff_t stride, int count) noexcept {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < count; ++i) {
    const float v = x[i * stride];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  return {lo, hi};
}

}  // namespace kvpack::detail
