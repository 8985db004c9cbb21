// Full- and half-precision baseline codecs: no groups, no metadata.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvpack/codec/params.hpp"
#include "kvpack/numeric.hpp"

namespace kvpack {

/// IEEE binary32 storage: 32 bits/value, lossless. The baseline every policy is compared with.
struct Fp32 {
  static constexpr int bits = 32;
  static constexpr bool grouped = false;
  static constexpr int group_size = 1;
  static constexpr int meta_bytes_per_group = 0;
  static constexpr double bits_per_value = 32;
  [[nodiscard]] static constexpr std::size_t code_bytes(std::size_t n) noexcept { return 4 * n; }
  [[nodiscard]] static unsigned encode_value(float x, GroupParams = {}) noexcept { return std::bit_cast<std::uint32_t>(x); }
  [[nodiscard]] static float decode_value(unsigned u, GroupParams = {}) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(u));
  }
  static void store_code(std::byte* row, std::size_t i, unsigned u) noexcept {
    const auto v = static_cast<std::uint32_t>(u);
    std::memcpy(row + 4 * i, &v, 4);
  }
  [[nodiscard]] static unsigned load_code(const std::byte* row, std::size_t i) noexcept {
    std::uint32_t v;
    std::memcpy(&v, row + 4 * i, 4);
    return v;
  }
};

/// IEEE binary16 storage: 16 bits/value, round-half-to-even, finite values beyond ±65504
/// saturate to ±65504 (never Inf).
struct Fp16 {
  static constexpr int bits = 16;
  static constexpr bool grouped = false;
  static constexpr int group_size = 1;
  static constexpr int meta_bytes_per_group = 0;
  static constexpr double bits_per_value = 16;
  [[nodiscard]] static constexpr std::size_t code_bytes(std::size_t n) noexcept { return 2 * n; }
  [[nodiscard]] static unsigned encode_value(float x, GroupParams = {}) noexcept { return fp16_from_float(x); }
  [[nodiscard]] static float decode_value(unsigned u, GroupParams = {}) noexcept {
    return fp16_to_float(static_cast<std::uint16_t>(u));
  }
  static void store_code(std::byte* row, std::size_t i, unsigned u) noexcept {
    const auto v = static_cast<std::uint16_t>(u);
    std::memcpy(row + 2 * i, &v, 2);
  }
  [[nodiscard]] static unsigned load_code(const std::byte* row, std::size_t i) noexcept {
    std::uint16_t v;
    std::memcpy(&v, row + 2 * i, 2);
    return v;
  }
};

}  // namespace kvpack
