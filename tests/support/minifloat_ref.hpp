// Float64 reference for kvpack's narrow float formats (fp16, bf16, OCP FP8 E4M3FN / E5M2).
//
// Independent of the library's bit-shifting engine: every code is decoded from its bit
// fields with std::ldexp in double, the finite non-negative values are kept in a sorted
// table (index = magnitude code), and encoding rounds by binary search in that table,
// comparing against exact double midpoints. Policy encoded here (kvpack's, see
// include/kvpack/numeric.hpp): finite inputs saturate to +-max in every rounding mode;
// +-Inf -> Inf (fp16/bf16) or +-max (FP8); NaN -> a NaN code (checked separately).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvpack/numeric/minifloat.hpp"

namespace kvpack::test {

/// One narrow format described only by its bit fields and its special-value rules.
class MiniRef {
 public:
  /// fn: E4M3FN-style (no Inf, only the all-ones magnitude is NaN); otherwise IEEE-style.
  /// inf_saturates: an Inf input encodes to +-max instead of +-Inf.
  MiniRef(int exp_bits, int man_bits, int bias, bool fn, bool inf_saturates)
      : exp_bits_(exp_bits),
        man_bits_(man_bits),
        bias_(bias),
        fn_(fn),
        inf_saturates_(inf_saturates) {
    mag_bits_ = exp_bits + man_bits;
    sign_bit_ = 1u << mag_bits_;
    for (std::uint32_t c = 0; c < sign_bit_; ++c) {
      const double v = decode(c);
      if (!std::isfinite(v)) break;  // magnitude codes grow with the value
      table_.push_back(v);
    }
    max_code_ = static_cast<std::uint32_t>(table_.size() - 1);
  }

  [[nodiscard]] std::uint32_t num_codes() const { return sign_bit_ << 1; }
  [[nodiscard]] std::uint32_t sign_bit() const { return sign_bit_; }
  [[nodiscard]] std::uint32_t max_code() const { return max_code_; }
  [[nodiscard]] double max_value() const { return table_.back(); }
  /// Value of a non-negative magnitude code 0..max_code().
  [[nodiscard]] double value(std::uint32_t mag) const { return table_.at(mag); }

  /// Exact value of any code, from its bit fields (NaN and +-Inf where the format has them).
  [[nodiscard]] double decode(std::uint32_t code) const {
    const bool neg = (code & sign_bit_) != 0;
    const std::uint32_t e = (code >> man_bits_) & ((1u << exp_bits_) - 1u);
    const std::uint32_t m = code & ((1u << man_bits_) - 1u);
    const std::uint32_t e_max = (1u << exp_bits_) - 1u;
    const std::uint32_t m_max = (1u << man_bits_) - 1u;
    double v = 0.0;
    if (!fn_ && e == e_max) {
      v = m == 0 ? std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::quiet_NaN();
    } else if (fn_ && e == e_max && m == m_max) {
      v = std::numeric_limits<double>::quiet_NaN();
    } else if (e == 0) {
      v = std::ldexp(static_cast<double>(m), 1 - bias_ - man_bits_);
    } else {
      v = std::ldexp(static_cast<double>((1u << man_bits_) + m),
                     static_cast<int>(e) - bias_ - man_bits_);
    }
    return neg ? -v : v;
  }
  [[nodiscard]] bool is_nan_code(std::uint32_t code) const { return std::isnan(decode(code)); }

  /// Reference rounding of a non-NaN x (kvpack policy: saturate finite, see file comment).
  [[nodiscard]] std::uint32_t encode(double x, Rounding r = Rounding::nearest_even) const {
    const std::uint32_t sign = std::signbit(x) ? sign_bit_ : 0u;
    const double ax = std::fabs(x);
    if (std::isinf(ax)) {
      return sign | (inf_saturates_ ? max_code_ : max_code_ + 1u);  // IEEE: Inf follows max
    }
    if (ax >= table_.back()) return sign | max_code_;
    // lo: largest code with value <= ax; ax < value(lo + 1).
    const auto it = std::upper_bound(table_.begin(), table_.end(), ax);
    return round_between(static_cast<std::uint32_t>(it - table_.begin() - 1), x, r);
  }

  /// Rounding of a non-NaN x with value(lo) <= |x| < value(lo + 1), lo < max_code().
  [[nodiscard]] std::uint32_t round_between(std::uint32_t lo, double x, Rounding r) const {
    const std::uint32_t sign = std::signbit(x) ? sign_bit_ : 0u;
    const double ax = std::fabs(x);
    if (table_[lo] == ax) return sign | lo;
    const std::uint32_t hi = lo + 1u;
    std::uint32_t mag = lo;
    if (r == Rounding::nearest_even) {
      const double mid = 0.5 * (table_[lo] + table_[hi]);  // exact: one more bit than the format
      mag = ax < mid ? lo : ax > mid ? hi : ((lo & 1u) == 0u ? lo : hi);
    } else {
      const bool up = (r == Rounding::toward_pos_inf) == (sign == 0u);  // magnitude grows
      mag = up ? hi : lo;
    }
    return sign | mag;
  }

 private:
  int exp_bits_, man_bits_, bias_;
  bool fn_, inf_saturates_;
  int mag_bits_ = 0;
  std::uint32_t sign_bit_ = 0, max_code_ = 0;
  std::vector<double> table_;
};

/// The four kvpack formats, as float64 references.
inline const MiniRef& fp16_ref() {
  static const MiniRef r(5, 10, 15, /*fn*/ false, /*inf_saturates*/ false);
  return r;
}
inline const MiniRef& bf16_ref() {
  static const MiniRef r(8, 7, 127, false, false);
  return r;
}
inline const MiniRef& e4m3_ref() {
  static const MiniRef r(4, 3, 7, /*fn*/ true, /*inf_saturates*/ true);
  return r;
}
inline const MiniRef& e5m2_ref() {
  static const MiniRef r(5, 2, 15, false, true);
  return r;
}

}  // namespace kvpack::test
