// Dequantization of ggml tensor data to float32.
//
// Block layouts follow ggml's ggml-common.h (facts of the GGUF/ggml formats):
//   Q4_0  32 values, 18 B (4.5 bits/value):  fp16 d | 16 B nibbles;   x = (q - 8) * d
//   Q4_1  32 values, 20 B (5.0 bits/value):  fp16 d, fp16 m | 16 B;   x = q * d + m
//   Q5_0  32 values, 22 B (5.5 bits/value):  fp16 d | u32 qh | 16 B;  x = (q - 16) * d
//   Q5_1  32 values, 24 B (6.0 bits/value):  fp16 d, fp16 m | u32 qh | 16 B;  x = q * d + m
//   Q8_0  32 values, 34 B (8.5 bits/value):  fp16 d | 32 int8;        x = q * d
//   Q2_K 256 values, 84 B (2.625 bits/value): 16 B scales (low nibble scale, high nibble min of
//         each 16-value sub-block) | 64 B 2-bit quants | fp16 d, fp16 dmin;
//         x = d*(sc & 15) * q - dmin*(sc >> 4)
//   Q3_K 256 values, 110 B (3.4375 bits/value): 32 B high-bit mask | 64 B 2-bit quants |
//         12 B of 16 packed 6-bit scales | fp16 d;  x = d * (sc - 32) * (q2 - (hbit ? 0 : 4))
//   Q4_K 256 values, 144 B (4.5 bits/value): fp16 d, fp16 dmin | 12 B packed 6-bit scales and
//         mins for 8 sub-blocks of 32 | 128 B nibbles;  x = d*sc[j] * q - dmin*m[j]
//   Q5_K 256 values, 176 B (5.5 bits/value): like Q4_K plus 32 B of fifth bits (qh)
//   Q6_K 256 values, 210 B (6.5625 bits/value): 128 B low nibbles | 64 B high 2-bit pairs |
//         16 int8 scales (sub-blocks of 16) | fp16 d;  x = d * sc[j] * (q - 32)
// 2-bit packing of Q2_K/Q3_K: value 128*h + 32*g + l sits in bits 2g..2g+1 of quant byte 32*h + l;
// the Q3_K high bit of that value is bit 4*h + g of hmask[l].
// For 4-bit packing of 32-value blocks, byte i holds value i in its low nibble and value i+16 in
// its high nibble. K-quant nibbles: within each 64-value chunk, byte l holds value l (low nibble)
// and value l+32 (high nibble).
#pragma once

#include "gguf.hpp"

#include <kvpack/result.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <kvpack/numeric/fp16.hpp>  // kvpack's one home for fp16 conversions

namespace kvpack::llama::detail {
[[nodiscard]] inline float half_to_float(uint16_t h) noexcept { return kvpack::fp16_to_float(h); }
}  // namespace kvpack::llama::detail

namespace kvpack::llama {

namespace detail {

[[nodiscard]] inline uint8_t u8(std::span<const std::byte> s, size_t i) noexcept {
  return static_cast<uint8_t>(s[i]);
}
[[nodiscard]] inline uint16_t le16(std::span<const std::byte> s, size_t i) noexcept {
  return static_cast<uint16_t>(u8(s, i) | (u8(s, i + 1) << 8));
}
[[nodiscard]] inline uint32_t le32(std::span<const std::byte> s, size_t i) noexcept {
  return static_cast<uint32_t>(u8(s, i)) | (static_cast<uint32_t>(u8(s, i + 1)) << 8) |
         (static_cast<uint32_t>(u8(s, i + 2)) << 16) | (static_cast<uint32_t>(u8(s, i + 3)) << 24);
}
[[nodiscard]] inline float f16_at(std::span<const std::byte> s, size_t i) noexcept {
  return half_to_float(le16(s, i));
}

// One block each: `b` is exactly type_size bytes, `y` exactly block_size floats.

inline void dequant_q4_0(std::span<const std::byte> b, float* y) noexcept {
  const float d = f16_at(b, 0);
  for (size_t i = 0; i < 16; ++i) {
    const uint8_t q = u8(b, 2 + i);
    y[i] = static_cast<float>(static_cast<int>(q & 0x0F) - 8) * d;
    y[i + 16] = static_cast<float>(static_cast<int>(q >> 4) - 8) * d;
  }
}

inline void dequant_q4_1(std::span<const std::byte> b, float* y) noexcept {
  const float d = f16_at(b, 0);
  const float m = f16_at(b, 2);
  for (size_t i = 0; i < 16; ++i) {
    const uint8_t q = u8(b, 4 + i);
    y[i] = static_cast<float>(q & 0x0F) * d + m;
    y[i + 16] = static_cast<float>(q >> 4) * d + m;
  }
}

inline void dequant_q5_0(std::span<const std::byte> b, float* y) noexcept {
  const float d = f16_at(b, 0);
  const uint32_t qh = le32(b, 2);  // bit i: fifth bit of value i
  for (size_t i = 0; i < 16; ++i) {
    const uint8_t q = u8(b, 6 + i);
    const int lo = (q & 0x0F) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int hi = (q >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    y[i] = static_cast<float>(lo - 16) * d;
    y[i + 16] = static_cast<float>(hi - 16) * d;
  }
}

inline void dequant_q5_1(std::span<const std::byte> b, float* y) noexcept {
  const float d = f16_at(b, 0);
  const float m = f16_at(b, 2);
  const uint32_t qh = le32(b, 4);
  for (size_t i = 0; i < 16; ++i) {
    const uint8_t q = u8(b, 8 + i);
    const unsigned lo = (q & 0x0Fu) | (((qh >> i) & 1u) << 4);
    const unsigned hi = (q >> 4u) | (((qh >> (i + 16)) & 1u) << 4);
    y[i] = static_cast<float>(lo) * d + m;
    y[i + 16] = static_cast<float>(hi) * d + m;
  }
}

inline void dequant_q8_0(std::span<const std::byte> b, float* y) noexcept {
  const float d = f16_at(b, 0);
  for (size_t i = 0; i < 32; ++i) y[i] = static_cast<float>(static_cast<int8_t>(u8(b, 2 + i))) * d;
}

/// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K/Q5_K:
/// j < 4: low 6 bits of bytes j (scale) and j+4 (min); j >= 4: a nibble of byte j+4 plus the
/// top two bits of bytes j-4 (scale) and j (min).
inline void k_scale_min(std::span<const std::byte> sc, size_t j, int& scale, int& min) noexcept {
  if (j < 4) {
    scale = u8(sc, j) & 63;
    min = u8(sc, j + 4) & 63;
  } else {
    scale = (u8(sc, j + 4) & 0x0F) | ((u8(sc, j - 4) >> 6) << 4);
    min = (u8(sc, j + 4) >> 4) | ((u8(sc, j) >> 6) << 4);
  }
}

inline void dequant_q2_k(std::span<const std::byte> b, float* y) noexcept {
  const auto scales = b.subspan(0, 16);  // per 16-value sub-block: low nibble scale, high nibble min
  const auto qs = b.subspan(16, 64);
  const float d = f16_at(b, 80);
  const float dmin = f16_at(b, 82);
  for (size_t v = 0; v < 256; ++v) {  // v = 128*half + 32*group + l
    const size_t half = v / 128, group = (v % 128) / 32, l = v % 32;
    const unsigned q = (u8(qs, 32 * half + l) >> (2 * group)) & 3u;
    const uint8_t sc = u8(scales, v / 16);
    y[v] = d * static_cast<float>(sc & 0x0F) * static_cast<float>(q) - dmin * static_cast<float>(sc >> 4);
  }
}

inline void dequant_q3_k(std::span<const std::byte> b, float* y) noexcept {
  const auto hmask = b.subspan(0, 32);
  const auto qs = b.subspan(32, 64);
  const auto sc = b.subspan(96, 12);  // 16 6-bit scales, stored with an offset of 32
  const float d = f16_at(b, 108);
  for (size_t v = 0; v < 256; ++v) {  // v = 128*half + 32*group + l
    const size_t half = v / 128, group = (v % 128) / 32, l = v % 32;
    const size_t j = v / 16;
    const int low = j < 8 ? (u8(sc, j) & 0x0F) : (u8(sc, j - 8) >> 4);
    const int high = (u8(sc, 8 + j % 4) >> (2 * (j / 4))) & 3;
    const int scale = (low | (high << 4)) - 32;
    const int q2 = (u8(qs, 32 * half + l) >> (2 * group)) & 3;
    const bool hbit = ((u8(hmask, l) >> (4 * half + group)) & 1) != 0;
    y[v] = d * static_cast<float>(scale) * static_cast<float>(q2 - (hbit ? 0 : 4));
  }
}

inline void dequant_q4_k(std::span<const std::byte> b, float* y) noexcept {
  const float d = f16_at(b, 0);
  const float dmin = f16_at(b, 2);
  const auto scales = b.subspan(4, 12);
  const auto qs = b.subspan(16, 128);
  for (size_t chunk = 0; chunk < 4; ++chunk) {  // 64 values: sub-blocks 2*chunk and 2*chunk+1
    int sc0 = 0, m0 = 0, sc1 = 0, m1 = 0;
    k_scale_min(scales, 2 * chunk, sc0, m0);
    k_scale_min(scales, 2 * chunk + 1, sc1, m1);
    const float d0 = d * static_cast<float>(sc0), mn0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), mn1 = dmin * static_cast<float>(m1);
    for (size_t l = 0; l < 32; ++l) {
      const uint8_t q = u8(qs, 32 * chunk + l);
      y[64 * chunk + l] = d0 * static_cast<float>(q & 0x0F) - mn0;
      y[64 * chunk + 32 + l] = d1 * static_cast<float>(q >> 4) - mn1;
    }
  }
}

inline void dequant_q5_k(std::span<const std::byte> b, float* y) noexcept {
  const float d = f16_at(b, 0);
  const float dmin = f16_at(b, 2);
  const auto scales = b.subspan(4, 12);
  const auto qh = b.subspan(16, 32);   // bit (2*chunk) / (2*chunk+1) of byte l: fifth bit
  const auto qs = b.subspan(48, 128);
  for (size_t chunk = 0; chunk < 4; ++chunk) {
    int sc0 = 0, m0 = 0, sc1 = 0, m1 = 0;
    k_scale_min(scales, 2 * chunk, sc0, m0);
    k_scale_min(scales, 2 * chunk + 1, sc1, m1);
    const float d0 = d * static_cast<float>(sc0), mn0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), mn1 = dmin * static_cast<float>(m1);
    for (size_t l = 0; l < 32; ++l) {
      const uint8_t q = u8(qs, 32 * chunk + l);
      const uint8_t h = u8(qh, l);
      const unsigned lo = (q & 0x0Fu) | (((h >> (2 * chunk)) & 1u) << 4);
      const unsigned hi = (q >> 4u) | (((h >> (2 * chunk + 1)) & 1u) << 4);
      y[64 * chunk + l] = d0 * static_cast<float>(lo) - mn0;
      y[64 * chunk + 32 + l] = d1 * static_cast<float>(hi) - mn1;
    }
  }
}

inline void dequant_q6_k(std::span<const std::byte> b, float* y) noexcept {
  const auto ql = b.subspan(0, 128);
  const auto qh = b.subspan(128, 64);
  const auto sc = b.subspan(192, 16);
  const float d = f16_at(b, 208);
  for (size_t half = 0; half < 2; ++half) {  // 128 values each
    for (size_t l = 0; l < 32; ++l) {
      const uint8_t h = u8(qh, 32 * half + l);
      const uint8_t a = u8(ql, 64 * half + l);
      const uint8_t c = u8(ql, 64 * half + 32 + l);
      const int q0 = ((a & 0x0F) | (((h >> 0) & 3) << 4)) - 32;
      const int q1 = ((c & 0x0F) | (((h >> 2) & 3) << 4)) - 32;
      const int q2 = ((a >> 4) | (((h >> 4) & 3) << 4)) - 32;
      const int q3 = ((c >> 4) | (((h >> 6) & 3) << 4)) - 32;
      const size_t s = 8 * half + l / 16;  // scale index of the 16-value sub-block
      const auto scale = [&](size_t k) { return d * static_cast<float>(static_cast<int8_t>(u8(sc, s + k))); };
      y[128 * half + l] = scale(0) * static_cast<float>(q0);
      y[128 * half + 32 + l] = scale(2) * static_cast<float>(q1);
      y[128 * half + 64 + l] = scale(4) * static_cast<float>(q2);
      y[128 * half + 96 + l] = scale(6) * static_cast<float>(q3);
    }
  }
}

}  // namespace detail

/// True when dequantize_row()/dequantize() handle `type`.
[[nodiscard]] constexpr bool can_dequantize(GgmlType type) noexcept {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

/// Dequantizes `dst.size()` consecutive values of `type` from `src` into `dst` (float32).
/// `dst.size()` must be a multiple of the type's block size and `src.size()` must equal
/// ggml_row_bytes(type, dst.size()) exactly. Any number of whole blocks is accepted (one row,
/// several rows, or a whole tensor).
/// Errors: Errc::unsupported (type not handled, message names it), Errc::invalid_argument
/// (sizes do not match).
[[nodiscard]] inline Status dequantize_row(GgmlType type, std::span<const std::byte> src, std::span<float> dst) {
  const auto traits = ggml_type_traits(type);
  if (!traits) {
    return fail(Errc::unsupported, "dequantize: unknown ggml type " + std::to_string(static_cast<uint32_t>(type)));
  }
  if (!can_dequantize(type)) return fail(Errc::unsupported, std::string("dequantize: ggml type ") + traits->name + " is not supported");
  const auto n = static_cast<int64_t>(dst.size());
  const auto want = ggml_row_bytes(type, n);
  if (!want) {
    return fail(Errc::invalid_argument, "dequantize: " + std::to_string(n) + " values is not a multiple of the " +
                                            traits->name + " block size " + std::to_string(traits->block_size));
  }
  if (static_cast<uint64_t>(*want) != src.size()) {
    return fail(Errc::invalid_argument, "dequantize: " + std::to_string(n) + " " + traits->name + " values need " +
                                            std::to_string(*want) + " bytes, got " + std::to_string(src.size()));
  }
  const auto bs = static_cast<size_t>(traits->block_size);
  const auto ts = static_cast<size_t>(traits->type_size);
  const size_t blocks = dst.size() / bs;
  float* y = dst.data();
  switch (type) {
    case GgmlType::F32:
      if constexpr (std::endian::native == std::endian::little) {
        if (!dst.empty()) std::memcpy(y, src.data(), src.size());
      } else {
        for (size_t i = 0; i < dst.size(); ++i) y[i] = std::bit_cast<float>(detail::le32(src, 4 * i));
      }
      return {};
    case GgmlType::F16:
      for (size_t i = 0; i < dst.size(); ++i) y[i] = detail::f16_at(src, 2 * i);
      return {};
    case GgmlType::BF16:
      for (size_t i = 0; i < dst.size(); ++i) {
        y[i] = std::bit_cast<float>(static_cast<uint32_t>(detail::le16(src, 2 * i)) << 16);
      }
      return {};
    default:
      break;
  }
  void (*block_fn)(std::span<const std::byte>, float*) noexcept = nullptr;
  switch (type) {
    case GgmlType::Q4_0: block_fn = detail::dequant_q4_0; break;
    case GgmlType::Q4_1: block_fn = detail::dequant_q4_1; break;
    case GgmlType::Q5_0: block_fn = detail::dequant_q5_0; break;
    case GgmlType::Q5_1: block_fn = detail::dequant_q5_1; break;
    case GgmlType::Q8_0: block_fn = detail::dequant_q8_0; break;
    case GgmlType::Q2_K: block_fn = detail::dequant_q2_k; break;
    case GgmlType::Q3_K: block_fn = detail::dequant_q3_k; break;
    case GgmlType::Q4_K: block_fn = detail::dequant_q4_k; break;
    case GgmlType::Q5_K: block_fn = detail::dequant_q5_k; break;
    case GgmlType::Q6_K: block_fn = detail::dequant_q6_k; break;
    default: return fail(Errc::unsupported, std::string("dequantize: ggml type ") + traits->name + " is not supported");
  }
  for (size_t blk = 0; blk < blocks; ++blk) block_fn(src.subspan(blk * ts, ts), y + blk * bs);
  return {};
}

/// Dequantizes a whole tensor to float32, dims[0] fastest (row-major [dims[n-1]...][dims[0]]).
/// Errors as dequantize_row(), prefixed with the tensor name.
[[nodiscard]] inline Result<std::vector<float>> dequantize(const TensorInfo& t) {
  if (!can_dequantize(t.type)) {
    return fail(Errc::unsupported, "tensor '" + t.name + "': dequantize: ggml type " + to_string(t.type) +
                                       " (" + std::to_string(static_cast<uint32_t>(t.type)) + ") is not supported");
  }
  std::vector<float> out(static_cast<size_t>(t.elements()));
  if (auto st = dequantize_row(t.type, t.data, out); !st) {
    return fail(st.error().code, "tensor '" + t.name + "': " + st.error().message);
  }
  return out;
}

}  // namespace kvpack::llama
