// Shared GoogleTest checks for kvpack's narrow float conversions against the float64
// reference in minifloat_ref.hpp. Each check walks a family of inputs and reports the
// number of mismatches (with the first few spelled out) through one EXPECT, so a broken
// conversion fails loudly without printing 65536 lines.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvpack/numeric/minifloat.hpp"
#include "support/minifloat_ref.hpp"

namespace kvpack::test {

/// A conversion pair under test plus its reference and the rounding modes it offers.
struct Codec {
  const char* name;
  const MiniRef& ref;
  std::uint32_t (*encode)(float, Rounding);
  float (*decode)(std::uint32_t);
  std::vector<Rounding> modes;
};

[[nodiscard]] inline const char* mode_name(Rounding r) {
  switch (r) {
    case Rounding::nearest_even:
      return "nearest_even";
    case Rounding::toward_pos_inf:
      return "toward_pos_inf";
    case Rounding::toward_neg_inf:
      return "toward_neg_inf";
  }
  return "?";
}

[[nodiscard]] inline std::uint32_t float_bits(float x) {
  return detail::bit_cast<std::uint32_t>(x);
}
[[nodiscard]] inline float bits_float(std::uint32_t u) { return detail::bit_cast<float>(u); }

/// Counts mismatches, keeps the first few messages, and asserts zero at the end.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  void checked() { ++checked_; }
  void fail(const std::string& msg) {
    if (count_ < 8) first_ += "\n  " + msg;
    ++count_;
  }
  [[nodiscard]] std::uint64_t checked_count() const { return checked_; }
  void expect_none() const {
    EXPECT_GT(checked_, 0u) << what_ << ": nothing was checked";
    EXPECT_EQ(count_, 0u) << what_ << ": " << count_ << " of " << checked_ << " wrong" << first_;
  }

 private:
  std::string what_, first_;
  std::uint64_t count_ = 0, checked_ = 0;
};

[[nodiscard]] inline std::string describe(const char* codec, float x, Rounding r, std::uint32_t got,
                                          std::uint32_t want) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s(%a = 0x%08x, %s): got 0x%x, want 0x%x", codec,
                static_cast<double>(x), float_bits(x), mode_name(r), got, want);
  return buf;
}

/// Encodes x in mode r and compares with the reference; NaN x must give a NaN code with x's sign.
inline void check_encode(const Codec& c, float x, Rounding r, Mismatches& m) {
  m.checked();
  const std::uint32_t got = c.encode(x, r);
  if (std::isnan(x)) {
    const bool sign_ok = ((got & c.ref.sign_bit()) != 0) == std::signbit(x);
    if (!c.ref.is_nan_code(got) || !sign_ok || got >= c.ref.num_codes()) {
      m.fail(describe(c.name, x, r, got, 0) + " (want a NaN code with the input's sign)");
    }
    return;
  }
  const std::uint32_t want = c.ref.encode(static_cast<double>(x), r);
  if (got != want) m.fail(describe(c.name, x, r, got, want));
}

/// Every code decodes to the value its bit fields define (NaN codes: a NaN with that sign).
inline void check_decode_all(const Codec& c) {
  Mismatches m(std::string(c.name) + " decode of every code");
  for (std::uint32_t code = 0; code < c.ref.num_codes(); ++code) {
    m.checked();
    const double want = c.ref.decode(code);
    const float got = c.decode(code);
    const bool neg = (code & c.ref.sign_bit()) != 0;
    const bool ok = std::isnan(want) ? std::isnan(got) && std::signbit(got) == neg
                                     : static_cast<double>(got) == want && std::signbit(got) == neg;
    if (!ok) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "code 0x%x: got %a, want %a", code, static_cast<double>(got),
                    want);
      m.fail(buf);
    }
  }
  m.expect_none();
}

/// encode(decode(code)) == code for every non-NaN code in every mode (Inf codes: the
/// reference's Inf policy, i.e. saturation for FP8).
inline void check_roundtrip_all(const Codec& c) {
  Mismatches m(std::string(c.name) + " encode(decode(code))");
  for (std::uint32_t code = 0; code < c.ref.num_codes(); ++code) {
    if (c.ref.is_nan_code(code)) continue;
    const double v = c.ref.decode(code);
    for (Rounding r : c.modes) {
      m.checked();
      const std::uint32_t want = std::isinf(v) ? c.ref.encode(v, r) : code;
      const std::uint32_t got = c.encode(c.decode(code), r);
      if (got != want) m.fail(describe(c.name, c.decode(code), r, got, want));
    }
  }
  m.expect_none();
}

/// Every midpoint between adjacent codes (both signs), and its float neighbours, in every
/// mode: nearest-even picks the even code at the midpoint and the nearer code one float ulp
/// either side; directed modes pick the bracketing code. Each midpoint must be an exact
/// float for the test to mean anything, which is asserted. Also the values just above and
/// below each code. Returns the number of midpoints checked.
inline std::uint64_t check_midpoints_all(const Codec& c) {
  Mismatches m(std::string(c.name) + " midpoints and code neighbours");
  Mismatches exact(std::string(c.name) + " midpoints representable as float");
  std::uint64_t midpoints = 0;
  const float inf = std::numeric_limits<float>::infinity();
  for (int neg = 0; neg < 2; ++neg) {
    const double sgn = neg ? -1.0 : 1.0;
    for (std::uint32_t k = 0; k < c.ref.max_code(); ++k) {
      const double lo = c.ref.value(k), hi = c.ref.value(k + 1u);
      const double mid = 0.5 * (lo + hi);
      const auto fmid = static_cast<float>(sgn * mid);
      exact.checked();
      if (static_cast<double>(fmid) != sgn * mid) {
        exact.fail("midpoint of magnitude codes " + std::to_string(k) + ", " +
                   std::to_string(k + 1u) + " is not a float");
        continue;
      }
      ++midpoints;
      const float toward0 = std::nextafter(fmid, 0.0f);
      const float away = std::nextafter(fmid, neg ? -inf : inf);
      const float above_lo = std::nextafter(static_cast<float>(sgn * lo), neg ? -inf : inf);
      const float below_hi = std::nextafter(static_cast<float>(sgn * hi), 0.0f);
      for (Rounding r : c.modes) {
        for (float x : {fmid, toward0, away, above_lo, below_hi}) check_encode(c, x, r, m);
      }
      // The tie itself, spelled out independently of the reference: the even code wins.
      m.checked();
      const std::uint32_t even = ((k & 1u) == 0u ? k : k + 1u) | (neg ? c.ref.sign_bit() : 0u);
      const std::uint32_t got = c.encode(fmid, Rounding::nearest_even);
      if (got != even) m.fail(describe(c.name, fmid, Rounding::nearest_even, got, even));
    }
  }
  exact.expect_none();
  m.expect_none();
  return midpoints;
}

/// Finite inputs beyond max saturate in every mode; Inf follows the format's rule; NaN
/// (quiet, signalling, any payload, either sign) stays NaN with its sign.
inline void check_specials(const Codec& c) {
  Mismatches m(std::string(c.name) + " saturation, Inf and NaN");
  const double max = c.ref.max_value();
  const double ulp_top = max - c.ref.value(c.ref.max_code() - 1u);
  std::vector<float> big = {static_cast<float>(max), std::nextafter(static_cast<float>(max), 1e38f),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity()};
  // The would-be tie with the next (non-existent) code, just below and just above it.
  if (max + ulp_top / 2 < 3e38) {
    const auto tie = static_cast<float>(max + ulp_top / 2);
    big.insert(big.end(), {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e38f),
                           static_cast<float>(max + ulp_top), static_cast<float>(2 * max)});
  }
  for (float x : big) {
    for (float sx : {x, -x}) {
      for (Rounding r : c.modes) {
        check_encode(c, sx, r, m);
        // The policy itself, independent of the reference: finite -> never Inf or NaN.
        if (std::isfinite(sx)) {
          m.checked();
          const float back = c.decode(c.encode(sx, r));
          if (!std::isfinite(back))
            m.fail(describe(c.name, sx, r, c.encode(sx, r), 0) + " not finite");
        }
      }
    }
  }
  for (std::uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0x7fa00000u, 0x7f802000u,
                                 0x7fbfffffu, 0xffc00000u, 0xff800001u, 0xffffffffu}) {
    for (Rounding r : c.modes) check_encode(c, bits_float(nan_bits), r, m);
  }
  m.expect_none();
}

/// fp32 inputs from every exponent field (0..255) with mantissas at every rounding-bit
/// position (2^t - 1, 2^t, 2^t + 1 for t = 0..22, and all ones), plus `random` uniform bit
/// patterns and `random` values log-uniform over the format's own range; both signs, every
/// mode, compared with the reference. Returns the number of inputs.
inline std::uint64_t check_sweep(const Codec& c, std::uint32_t random, std::uint32_t seed) {
  Mismatches m(std::string(c.name) + " sweep vs float64 reference");
  std::vector<std::uint32_t> mantissas = {0u, 0x7fffffu, 0x400000u, 0x3fffffu, 0x400001u};
  for (std::uint32_t t = 0; t < 23; ++t) {
    for (std::uint32_t v : {(1u << t) - 1u, 1u << t, (1u << t) + 1u, 0x7fffffu ^ (1u << t)}) {
      mantissas.push_back(v & 0x7fffffu);
    }
  }
  std::vector<float> xs;
  for (std::uint32_t e = 0; e < 256; ++e) {
    for (std::uint32_t man : mantissas) xs.push_back(bits_float((e << 23) | man));
  }
  std::mt19937 rng(seed);
  const double lo = std::log2(c.ref.value(1)) - 2, hi = std::log2(c.ref.max_value()) + 1;
  std::uniform_real_distribution<double> expo(lo, hi);
  for (std::uint32_t i = 0; i < random; ++i) {
    xs.push_back(bits_float(static_cast<std::uint32_t>(rng())));
    xs.push_back(static_cast<float>(std::exp2(expo(rng))));
  }
  for (float x : xs) {
    for (float sx : {x, -x}) {
      for (Rounding r : c.modes) check_encode(c, sx, r, m);
    }
  }
  m.expect_none();
  return xs.size() * 2;
}

/// Every finite positive fp32 bit pattern in [first, last] (inclusive, last <= 0x7f7fffff),
/// and its negation, in every mode: exhaustive comparison with the reference over a window
/// of consecutive floats, walking the reference table once (no search). Returns the number
/// of inputs.
inline std::uint64_t check_window_exhaustive(const Codec& c, std::uint32_t first,
                                             std::uint32_t last) {
  Mismatches m(std::string(c.name) + " exhaustive window");
  std::uint32_t lo = 0;  // value(lo) <= x < value(lo + 1) while x < max
  for (std::uint64_t u = first; u <= last; ++u) {
    const float x = bits_float(static_cast<std::uint32_t>(u));
    const double ax = static_cast<double>(x);
    while (lo < c.ref.max_code() && c.ref.value(lo + 1u) <= ax) ++lo;
    for (Rounding r : c.modes) {
      for (int neg = 0; neg < 2; ++neg) {
        const float sx = neg ? -x : x;
        const std::uint32_t want = lo == c.ref.max_code()
                                       ? c.ref.max_code() | (neg ? c.ref.sign_bit() : 0u)
                                       : c.ref.round_between(lo, static_cast<double>(sx), r);
        const std::uint32_t got = c.encode(sx, r);
        m.checked();
        if (got != want) m.fail(describe(c.name, sx, r, got, want));
      }
    }
  }
  m.expect_none();
  return static_cast<std::uint64_t>(last - first + 1u) * 2u;
}

/// Exhaustive windows of 2^20 consecutive positive floats centred on each value in
/// `centres` (each with its negation, in every mode). With KVPACK_NUMERIC_EXHAUSTIVE=1 in
/// the environment, every finite float from +0 to FLT_MAX instead (minutes; for a release check).
inline std::uint64_t check_windows(const Codec& c, std::initializer_list<float> centres) {
  const char* env = std::getenv("KVPACK_NUMERIC_EXHAUSTIVE");
  if (env != nullptr && std::string(env) == "1") {
    return check_window_exhaustive(c, 0u, 0x7f7fffffu);
  }
  constexpr std::uint32_t kHalf = 1u << 19;
  std::uint64_t n = 0;
  for (float centre : centres) {
    const std::uint32_t u = float_bits(centre);
    const std::uint32_t first = u > kHalf ? u - kHalf : 0u;
    const std::uint32_t last = u + kHalf - 1u < 0x7f7fffffu ? u + kHalf - 1u : 0x7f7fffffu;
    n += check_window_exhaustive(c, first, last);
  }
  return n;
}

}  // namespace kvpack::test
