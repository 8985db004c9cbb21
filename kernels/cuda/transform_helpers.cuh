// __host__ __device__ building blocks of the CUDA RoPE and Hadamard paths (device_rope.cuh,
// rope_decode_kernel.cuh, device_rotated.cuh). Like helpers.cuh this header compiles as plain
// C++20 too (KVPACK_HOST_DEVICE is empty there), so every helper is unit-tested on the host
// (tests/test_cuda_transform_helpers.cpp) against the host implementations it reproduces:
// kvpack::rotate_row / unrotate_row (rotation/hadamard.hpp) bit for bit (additions, subtractions
// and one multiply per value: nothing a compiler can fuse), so device-rotated rows quantize to the
// host Rotated cache's very bytes; and kernels::rope_row (kernels/rope.hpp) to within an ulp of
// each product (RoPE never reaches the stored bytes: keys are stored before it).
//
// Rounding on the device: every product and sum is rounded on its own (__fmul_rn, __fadd_rn,
// __fsub_rn, which nvcc never contracts into FMAs). On the host the plain operators are used; a
// compiler may contract the RoPE products (GCC does by default in C++), as it may in rope_row.
#pragma once

#include <cstdint>

#include "kvpack/config.hpp"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace kvpack::cuda {

/// x * y, x + y, x - y rounded to nearest even, never fused with a neighbouring operation.
[[nodiscard]] KVPACK_HOST_DEVICE inline float mul_rn(float x, float y) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}
[[nodiscard]] KVPACK_HOST_DEVICE inline float add_rn(float x, float y) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(x, y);
#else
  return x + y;
#endif
}
[[nodiscard]] KVPACK_HOST_DEVICE inline float sub_rn(float x, float y) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(x, y);
#else
  return x - y;
#endif
}

// ------------------------------------------------------------------------------------------------
// RoPE (convention of kernels/rope.hpp)
// ------------------------------------------------------------------------------------------------

/// The two channels of RoPE pair i (i < pairs = rope_dims / 2): (2i, 2i + 1) adjacent, or
/// (i, i + pairs) NeoX.
struct RopePair {
  int a, b;
};
[[nodiscard]] KVPACK_HOST_DEVICE constexpr RopePair rope_pair(int i, int pairs, bool neox) noexcept {
  return neox ? RopePair{i, i + pairs} : RopePair{2 * i, 2 * i + 1};
}

/// Rotates one pair (xa, xb) by the angle whose cosine and sine are (c, s):
/// (xa c - xb s, xa s + xb c), each product rounded, as kernels::rope_row.
KVPACK_HOST_DEVICE inline void rope_rotate_pair(float& xa, float& xb, float c, float s) noexcept {
  const float a = xa, b = xb;
  xa = sub_rn(mul_rn(a, c), mul_rn(b, s));
  xb = add_rn(mul_rn(a, s), mul_rn(b, c));
}

/// Row of the cos/sin table for `pos` (kernels::RopeTable layout [positions][pairs][2]), the
/// position clamped into [0, positions - 1] as kernels::rope_row does (the device cache reports
/// positions outside the table as errors before this is reached; the clamp keeps reads in bounds).
[[nodiscard]] KVPACK_HOST_DEVICE inline const float* rope_table_row(const float* table, std::int64_t positions,
                                                                    int pairs, std::int64_t pos) noexcept {
  pos = pos < 0 ? 0 : (pos >= positions ? positions - 1 : pos);
  return table + pos * 2 * static_cast<std::int64_t>(pairs);
}

/// Rotates one head row x (>= 2 * pairs floats) with the table row `cs` ([pairs][2]): the
/// rotation of kernels::rope_row (equal up to FMA contraction). (The kernels rotate a pair per thread with
/// rope_rotate_pair; this loop is their serial form.)
KVPACK_HOST_DEVICE inline void rope_row_serial(float* x, const float* cs, int pairs, bool neox) noexcept {
  for (int i = 0; i < pairs; ++i) {
    const RopePair p = rope_pair(i, pairs, neox);
    rope_rotate_pair(x[p.a], x[p.b], cs[2 * i], cs[2 * i + 1]);
  }
}

// ------------------------------------------------------------------------------------------------
// Hadamard (convention of rotation/hadamard.hpp)
// ------------------------------------------------------------------------------------------------

/// The fixed sign of channel c for SignedHadamard: true = negative (splitmix64 bit 0, equal to
/// kvpack::detail::hadamard_sign_negative, which is not a device function).
[[nodiscard]] KVPACK_HOST_DEVICE constexpr bool hadamard_negative(std::uint64_t c) noexcept {
  std::uint64_t z = c + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return ((z ^ (z >> 31)) & 1u) != 0;
}

/// The Hadamard block holding channel c of a head row of D channels: blocks are D's powers of
/// two, largest first (64 | 16 for D = 80). `first` is the block's first channel, `size` its width.
struct HadamardBlock {
  int first, size;
};
[[nodiscard]] KVPACK_HOST_DEVICE constexpr HadamardBlock hadamard_block_of(int c, int D) noexcept {
  int off = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const int m = 1 << bit;
    if ((D & m) == 0) continue;
    if (c < off + m) return {off, m};
    off += m;
  }
  return {off, 1};
}

/// Butterfly k (0 <= k < D / 2 within blocks of width >= 2) of the stage with stride `len` in a
/// block of width m starting at `first`: x[j], x[j + len] <- x[j] + x[j + len], x[j] - x[j + len]
/// with j = first + (k / len) * 2 len + k % len. Stages run len = 1, 2, 4, ... < m, as
/// detail::fwht_block; the butterflies of one stage are independent (a thread each).
KVPACK_HOST_DEVICE inline void hadamard_butterfly(float* x, int first, int len, int k) noexcept {
  const int j = first + (k / len) * 2 * len + k % len;
  const float a = x[j], b = x[j + len];
  x[j] = add_rn(a, b);
  x[j + len] = sub_rn(a, b);
}

/// The normalization 1 / sqrt(m) of a block of width m > 1, rounded as detail::fwht_block
/// computes it (IEEE sqrt and division).
[[nodiscard]] KVPACK_HOST_DEVICE inline float hadamard_scale(int m) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.f, __fsqrt_rn(static_cast<float>(m)));
#else
  return 1.f / std::sqrt(static_cast<float>(m));
#endif
}

/// Serial form of the device rotation of one row x[0, D) (what hadamard_rows_kernel computes
/// with a thread per butterfly): signs first when `signed_rows` and !inverse, the block-diagonal
/// transform, signs last when `signed_rows` and inverse. Equal bit for bit to
/// kvpack::rotate_row<R> (inverse = false) and unrotate_row<R> (inverse = true).
KVPACK_HOST_DEVICE inline void hadamard_row_serial(float* x, int D, bool signed_rows, bool inverse) noexcept {
  if (signed_rows && !inverse)
    for (int c = 0; c < D; ++c)
      if (hadamard_negative(static_cast<std::uint64_t>(c))) x[c] = -x[c];
  for (int first = 0; first < D;) {
    const int m = hadamard_block_of(first, D).size;
    for (int len = 1; len < m; len <<= 1)
      for (int k = 0; k < m / 2; ++k) hadamard_butterfly(x, first, len, k);
    if (m > 1) {
      const float s = hadamard_scale(m);
      for (int j = first; j < first + m; ++j) x[j] = mul_rn(x[j], s);
    }
    first += m;
  }
  if (signed_rows && inverse)
    for (int c = 0; c < D; ++c)
      if (hadamard_negative(static_cast<std::uint64_t>(c))) x[c] = -x[c];
}

}  // namespace kvpack::cuda
