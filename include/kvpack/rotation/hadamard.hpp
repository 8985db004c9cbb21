// Orthonormal Hadamard rotations of one head row (issue 20, QuaRot-style incoherence processing):
// spreading outlier channels over a block before quantization, so per-group scales fit the bulk
// of the values. Used by kvpack::Rotated (rotation/rotated_cache.hpp).
//
// Matrix: block-diagonal, one normalized Sylvester-Hadamard block H_m / sqrt(m) per power of two
// in the binary representation of head_dim, largest first: 64 -> [64], 80 -> [64 | 16],
// 96 -> [64 | 32], 112 -> [64 | 32 | 16], 128 -> [128] (an odd head_dim ends in a block of 1,
// the identity). Each block is symmetric and orthonormal, H H = I, so the same routine rotates
// and rotates back. SignedHadamard multiplies channel c by a fixed sign s_c = ±1 first
// (R = H S, inverse S H; the signs come from a fixed hash of c, the same in every build), which
// breaks alignments between the input and Hadamard rows, as QuaRot's randomized Hadamard.
// Arithmetic: fp32 butterflies (log2 m additions per value), then one multiply by 1/sqrt(m):
// the round trip is exact to a few ulp (tests/test_codec_rotation.cpp).
#pragma once

#include <cmath>
#include <cstdint>

namespace kvpack {

/// Plain block-diagonal normalized Hadamard rotation (self-inverse).
struct Hadamard {
  static constexpr bool signed_rows = false;
};
/// Block-diagonal normalized Hadamard after fixed ±1 channel signs (R = H S, R^-1 = S H).
struct SignedHadamard {
  static constexpr bool signed_rows = true;
};

namespace detail {
template <class T>
inline constexpr bool is_rotation_v = false;
template <>
inline constexpr bool is_rotation_v<Hadamard> = true;
template <>
inline constexpr bool is_rotation_v<SignedHadamard> = true;

/// Fixed sign of channel c for SignedHadamard: bit 0 of a splitmix64 hash of c.
[[nodiscard]] constexpr bool hadamard_sign_negative(std::uint64_t c) noexcept {
  std::uint64_t z = c + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return ((z ^ (z >> 31)) & 1u) != 0;
}

/// In-place normalized Walsh-Hadamard transform of x[0, m), m a power of two.
inline void fwht_block(float* x, int m) noexcept {
  for (int len = 1; len < m; len <<= 1)
    for (int i = 0; i < m; i += 2 * len)
      for (int j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  if (m > 1) {
    const float s = 1.f / std::sqrt(static_cast<float>(m));
    for (int j = 0; j < m; ++j) x[j] *= s;
  }
}

/// Block-diagonal transform of one row of D values (blocks: D's powers of two, largest first).
inline void hadamard_blocks(float* x, int D) noexcept {
  int off = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const int m = 1 << bit;
    if ((D & m) == 0) continue;
    fwht_block(x + off, m);
    off += m;
  }
}

inline void apply_signs(float* x, int D) noexcept {
  for (int c = 0; c < D; ++c)
    if (hadamard_sign_negative(static_cast<std::uint64_t>(c))) x[c] = -x[c];
}
}  // namespace detail

/// Rotates one head row x[0, D) in place by rotation R (Hadamard or SignedHadamard).
template <class R>
inline void rotate_row(float* x, int D) noexcept {
  if constexpr (R::signed_rows) detail::apply_signs(x, D);
  detail::hadamard_blocks(x, D);
}

/// Applies the inverse (transpose) of rotation R to one head row x[0, D) in place.
template <class R>
inline void unrotate_row(float* x, int D) noexcept {
  detail::hadamard_blocks(x, D);
  if constexpr (R::signed_rows) detail::apply_signs(x, D);
}

}  // namespace kvpack
