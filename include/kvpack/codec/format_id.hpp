// The stored identity of a codec: a 16-bit descriptor per codec and a 32-bit format id per
// (key codec, value codec) pair. Record headers of offloaded blocks carry it, so a restore can
// tell apart codecs of equal bits. A codec may state its descriptor itself
// (`static constexpr std::uint16_t format_descriptor`); otherwise it is built from the traits the
// codec declares (grouped, format, asymmetric, meta_bytes_per_group, bits).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kvpack/codec/fp8_codec.hpp"

namespace kvpack {

/// 16-bit description of one codec, stable across builds (it is stored in record headers):
///   bits 0-3  family: 1 fp32/fp16 (ungrouped), 2 integer, 3 FP8 E4M3FN, 4 FP8 E5M2, 5 NF4
///             codebook (stated by Nf4Codec itself)
///   bit  4    asymmetric (zero-point stored)
///   bits 5-7  metadata bytes per group scalar: 0 none, 2 fp16, 4 fp32
///   bits 8-13 bits per code (4, 8, 16, 32)
/// The group size is a separate header field.
template <class C>
[[nodiscard]] constexpr std::uint16_t codec_descriptor() noexcept {
  if constexpr (requires { C::format_descriptor; }) {
    return C::format_descriptor;
  } else {
    std::uint16_t family = 0, asym = 0, meta = 0;
    if constexpr (!C::grouped) {
      family = 1;
    } else {
      if constexpr (requires { typename C::format; }) {
        family = std::is_same_v<typename C::format, E4M3> ? 3 : std::is_same_v<typename C::format, E5M2> ? 4 : 15;
      } else {
        family = 2;
      }
      asym = C::asymmetric ? 1 : 0;
      meta = static_cast<std::uint16_t>(C::meta_bytes_per_group / (C::asymmetric ? 2 : 1));
    }
    return static_cast<std::uint16_t>(family | (asym << 4) | (meta << 5) | (static_cast<std::uint16_t>(C::bits) << 8));
  }
}

/// Codec format id of a (key codec, value codec) pair: key descriptor in the low 16 bits,
/// value descriptor in the high 16 bits.
template <class KeyCodec, class ValueCodec>
[[nodiscard]] constexpr std::uint32_t codec_format_id() noexcept {
  return static_cast<std::uint32_t>(codec_descriptor<KeyCodec>()) |
         (static_cast<std::uint32_t>(codec_descriptor<ValueCodec>()) << 16);
}

}  // namespace kvpack
