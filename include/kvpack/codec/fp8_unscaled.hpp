// FP8 codes without any stored scale: 8.0 bits per value (OCP OFP8 rev. 1.0, E4M3FN or E5M2).
//
// code = fp8(x) with round-half-to-even and saturation (a finite |x| beyond the format's max
// becomes ±max, never NaN); x̂ = fp8_to_float(code). Relative error in the format's normal range
// (|x| >= 2^-6 for E4M3, 2^-14 for E5M2): <= 2^-4 (E4M3), <= 2^-3 (E5M2); below it the absolute
// error is half the subnormal step (2^-10 for E4M3, 2^-17 for E5M2).
//
// Alone it suits values that already lie in the format's range. The scale that puts them there is
// chosen per KV head (or channel) by kvpack::Calibrated<> (calibration/calibrated_cache.hpp), as
// vLLM's fp8 KV cache does with its k_scale / v_scale: the scale costs nothing per token, where the
// grouped Fp8E4M3<Group<32>> pays 0.5 bits per value for its per-group fp16 scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/params.hpp"

namespace kvpack {

/// FP8 codec with format F (kvpack::E4M3 or kvpack::E5M2) and no metadata: one byte per value.
/// The KVCache blocks it fills hold codes only (BlockLayout meta regions are empty).
/// No CUDA kernel (like Fp16/Fp32: the device supports grouped codecs only); AVX2 and NEON
/// decode it with the grouped FP8 codecs' conversions.
template <class F>
struct Fp8Unscaled {
  static_assert(std::is_same_v<F, E4M3> || std::is_same_v<F, E5M2>,
                "kvpack::Fp8Unscaled<F>: F must be kvpack::E4M3 or kvpack::E5M2");
  static constexpr int bits = 8;
  static constexpr bool grouped = false;
  static constexpr int group_size = 1;
  static constexpr int meta_bytes_per_group = 0;
  static constexpr double bits_per_value = 8;
  using format = F;
  /// Stored codec identity (codec/format_id.hpp): FP8 family (3 E4M3, 4 E5M2), no metadata, 8 bits;
  /// distinct from the grouped FP8 codecs, whose metadata field is 2 or 4.
  static constexpr std::uint16_t format_descriptor =
      static_cast<std::uint16_t>((std::is_same_v<F, E4M3> ? 3 : 4) | (8 << 8));

  [[nodiscard]] static constexpr std::size_t code_bytes(std::size_t n) noexcept { return n; }
  [[nodiscard]] static unsigned encode_value(float x, GroupParams = {}) noexcept { return F::encode(x); }
  [[nodiscard]] static float decode_value(unsigned u, GroupParams = {}) noexcept {
    return F::decode(static_cast<std::uint8_t>(u));
  }
  static void store_code(std::byte* row, std::size_t i, unsigned u) noexcept { row[i] = static_cast<std::byte>(u); }
  [[nodiscard]] static unsigned load_code(const std::byte* row, std::size_t i) noexcept {
    return static_cast<unsigned>(row[i]);
  }
};

/// FP8 E4M3FN codes, no scale (8.0 bits/value); pair it with kvpack::Calibrated<>.
using Fp8E4M3Unscaled = Fp8Unscaled<E4M3>;
/// FP8 E5M2 codes, no scale (8.0 bits/value); pair it with kvpack::Calibrated<>.
using Fp8E5M2Unscaled = Fp8Unscaled<E5M2>;

namespace detail {
template <class C>
inline constexpr bool is_fp8_unscaled_v = false;
template <class F>
inline constexpr bool is_fp8_unscaled_v<Fp8Unscaled<F>> = true;
}  // namespace detail

}  // namespace kvpack
