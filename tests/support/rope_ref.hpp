// RoPE in float64 for the tests' references: the rotation kernels/rope.hpp applies, computed in
// double (PreRope<> caches, the page pool's PreRope sequences, SnapKV's scoring, the CUDA RoPE
// decode).
#pragma once

#include <cmath>

#include "kvpack/cache/shape.hpp"

namespace kvtest {

/// Rotates x[0, head_dim) in double to position pos with the shape's RoPE: rope_dims (0: all)
/// channels in pairs (2i, 2i + 1), or (i, i + dims / 2) when rope_neox, by pos * base^(-2i / dims).
inline void rope_rotate64(double* x, const kvpack::ModelShape& s, double pos) {
  const int dims = s.rope_dims > 0 ? s.rope_dims : s.head_dim, pairs = dims / 2;
  for (int i = 0; i < pairs; ++i) {
    const double ang = pos * std::pow(static_cast<double>(s.rope_base), -2.0 * i / dims);
    const int a = s.rope_neox ? i : 2 * i, b = s.rope_neox ? i + pairs : 2 * i + 1;
    const double xa = x[a], xb = x[b];
    x[a] = xa * std::cos(ang) - xb * std::sin(ang);
    x[b] = xa * std::sin(ang) + xb * std::cos(ang);
  }
}

}  // namespace kvtest
