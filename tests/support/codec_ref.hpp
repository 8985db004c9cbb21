// Float64 references for the quantization codecs' tests (INT8/INT4, FP8 per-group scales).
//
// Independent of the library: nothing here calls kvpack's conversion engine or its codecs.
// Metadata rounding is done on the binary16 / binary32 grids computed with frexp/ldexp in
// double; FP8 values come from their bit fields; rounding to an integer level is floor plus
// an explicit tie rule. Shared by tests/test_codec_roundtrip.cpp and tests/test_case_c*.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvpack::codec_ref {

/// Round half to even of t to an integer (float64, exact for |t| < 2^52).
[[nodiscard]] inline double rne(double t) {
  const double f = std::floor(t);
  const double d = t - f;  // exact: f and t share the exponent range
  if (d > 0.5) return f + 1.0;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

/// Grid of a binary floating-point format with `man_bits` stored mantissa bits, smallest normal
/// exponent `emin` (value 2^emin) and largest finite value `max`.
struct Grid {
  int man_bits;
  int emin;
  double max;
};
inline constexpr Grid kF16Grid{10, -14, 65504.0};
inline constexpr Grid kF32Grid{23, -126, static_cast<double>(std::numeric_limits<float>::max())};

/// Spacing of the grid at magnitude a > 0 (the ulp of the binade holding a).
[[nodiscard]] inline double grid_ulp(const Grid& g, double a) {
  int e = 0;
  (void)std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): binade [2^(e-1), 2^e)
  const int exp = std::max(e - 1, g.emin);
  return std::ldexp(1.0, exp - g.man_bits);
}

/// Smallest grid value >= d, saturating to +-max (kvpack never produces Inf metadata).
[[nodiscard]] inline double round_up(const Grid& g, double d) {
  if (d == 0.0) return 0.0;
  const double a = std::fabs(d);
  const double u = grid_ulp(g, a);
  const double r = d > 0 ? std::ceil(d / u) * u : -std::floor(a / u) * u;
  return std::clamp(r, -g.max, g.max);
}
/// Largest grid value <= d, saturating to +-max.
[[nodiscard]] inline double round_down(const Grid& g, double d) { return -round_up(g, -d); }

/// Relative spacing bound of a grid's normal range: 2^-man_bits (2^-10 for fp16, 2^-23 for fp32).
[[nodiscard]] inline double rel_ulp(const Grid& g) { return std::ldexp(1.0, -g.man_bits); }

/// An OCP FP8 format described by its bit fields (E4M3FN: 4, 3, bias 7, fn; E5M2: 5, 2, 15).
struct Fp8Ref {
  int exp_bits, man_bits, bias;
  bool fn;  ///< E4M3FN style: no Inf, the all-ones magnitude is the only NaN

  /// Largest finite magnitude code (0x7E for E4M3FN, 0x7B for E5M2).
  [[nodiscard]] unsigned max_code() const {
    const unsigned mag_all = (1u << (exp_bits + man_bits)) - 1u;
    return fn ? mag_all - 1u : mag_all - (1u << man_bits);  // E5M2: below the Inf code
  }
  /// Exact value of a finite code (sign bit = 1 << (exp_bits + man_bits)).
  [[nodiscard]] double value(unsigned code) const {
    const unsigned sign_bit = 1u << (exp_bits + man_bits);
    const unsigned e = (code >> man_bits) & ((1u << exp_bits) - 1u);
    const unsigned m = code & ((1u << man_bits) - 1u);
    const double v = e == 0 ? std::ldexp(static_cast<double>(m), 1 - bias - man_bits)
                            : std::ldexp(static_cast<double>((1u << man_bits) + m), static_cast<int>(e) - bias - man_bits);
    return (code & sign_bit) ? -v : v;
  }
  [[nodiscard]] double max() const { return value(max_code()); }
  /// Smallest positive normal value, 2^(1 - bias).
  [[nodiscard]] double min_normal() const { return std::ldexp(1.0, 1 - bias); }
  /// Smallest positive subnormal value (the spacing of the subnormal range).
  [[nodiscard]] double min_subnormal() const { return std::ldexp(1.0, 1 - bias - man_bits); }

  /// Round-half-to-even code of finite t, saturating beyond max (kvpack's policy).
  [[nodiscard]] unsigned encode(double t) const {
    const unsigned sign = std::signbit(t) ? 1u << (exp_bits + man_bits) : 0u;
    const double a = std::fabs(t);
    if (a >= max()) return sign | max_code();
    unsigned lo = 0;  // largest magnitude code with value <= a (magnitudes grow with the code)
    while (lo + 1 <= max_code() && value(lo + 1) <= a) ++lo;
    const double dlo = a - value(lo), dhi = value(lo + 1) - a;
    unsigned mag = lo;
    if (dhi < dlo || (dhi == dlo && (lo & 1u) != 0)) mag = lo + 1;  // ties: even code = even mantissa
    return sign | mag;
  }
};
inline constexpr Fp8Ref kE4M3Ref{4, 3, 7, true};
inline constexpr Fp8Ref kE5M2Ref{5, 2, 15, false};

/// Minimum and maximum of `count` values read with a stride, in double.
struct Range {
  double lo, hi;
  [[nodiscard]] double amax() const { return std::max(-lo, hi); }
};
[[nodiscard]] inline Range range_of(const float* x, std::ptrdiff_t stride, int count) {
  Range r{x[0], x[0]};
  for (int i = 1; i < count; ++i) {
    r.lo = std::min<double>(r.lo, x[i * stride]);
    r.hi = std::max<double>(r.hi, x[i * stride]);
  }
  return r;
}

}  // namespace kvpack::codec_ref
