// Per-group round-trip checks of kvpack's grouped codecs against the float64 references in
// codec_ref.hpp: the stored metadata equals the reference's directed rounding exactly, and every
// reconstructed value lies within the codec's error bound.
//
// Bounds ("step" = the stored scale):
//  * integer codecs: |x̂ - x| <= step/2 + 4 * FLT_EPSILON * amax(group)   (see int_tolerance);
//  * FP8: |x̂ - x| <= 2^-(m+1) |x| (m = mantissa bits: 2^-4 for E4M3, 2^-3 for E5M2) when x/step
//    lies in the format's normal range, else |x̂ - x| <= step * min_subnormal / 2 (+ slack).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kvpack/codec/fp8_codec.hpp"
#include "kvpack/codec/int_codec.hpp"
#include "kvpack/codec/params.hpp"
#include "support/codec_ref.hpp"

namespace kvpack::codec_ref {

template <class C>
inline constexpr bool is_fp8_v = requires { typename C::format; };

/// Metadata grid of codec C.
template <class C>
[[nodiscard]] constexpr Grid meta_grid() {
  return std::is_same_v<typename C::meta_type, MetaF16> ? kF16Grid : kF32Grid;
}
/// FP8 reference of codec C's element format.
template <class C>
[[nodiscard]] constexpr Fp8Ref fp8_ref() {
  return std::is_same_v<typename C::format, E4M3> ? kE4M3Ref : kE5M2Ref;
}

/// Readable codec name for typed-test names: Int4_asym_f16_g32, E4M3_f32_g64, ...
template <class C>
[[nodiscard]] std::string codec_name() {
  std::string s;
  if constexpr (is_fp8_v<C>) {
    s = std::is_same_v<typename C::format, E4M3> ? "E4M3" : "E5M2";
  } else {
    s = std::string("Int") + std::to_string(C::bits) + (C::asymmetric ? "_asym" : "_sym");
  }
  s += std::is_same_v<typename C::meta_type, MetaF16> ? "_f16" : "_f32";
  return s + "_g" + std::to_string(C::group_size);
}

/// Reference metadata of one group: scale (and zero) as kvpack documents them, computed in
/// float64 and rounded on the metadata grid (scale up, zero-point down). Data assumed within the
/// metadata range (no clamping; CASES C1 tests the clamp separately).
template <class C>
[[nodiscard]] GroupParams ref_params(const Range& r) {
  constexpr Grid g = meta_grid<C>();
  GroupParams p;
  if constexpr (!is_fp8_v<C> && C::asymmetric) {
    const double zero = round_down(g, r.lo);
    p.zero = static_cast<float>(zero);
    p.scale = r.hi > zero ? static_cast<float>(round_up(g, (r.hi - zero) / C::qmax)) : 1.f;
  } else {
    double top = 0;
    if constexpr (is_fp8_v<C>) top = fp8_ref<C>().max();
    else top = C::qmax;
    const double a = r.amax();
    if (a == 0) p.scale = 1.f;
    else if (r.lo == r.hi) p.scale = static_cast<float>(round_up(g, a));  // constant group: ±1 level
    else p.scale = static_cast<float>(round_up(g, a / top));
  }
  return p;
}

/// Tolerance of an integer codec on a group of maximum magnitude `amax`: half a step plus the
/// fp32 rounding of the codec's arithmetic. The level is rounded from t = fl(fl(x - zero) / step),
/// two roundings of relative size <= 2^-24 on |x - zero| <= 2 amax, so near a tie the chosen
/// level can be the farther one by at most 2 * 2 amax * 2^-24 in x units; reconstruction
/// fl(zero + fl(step * q)) adds <= 2^-24 (|step q| + |x̂|) <= 3 amax * 2^-24. Total <= 7 * 2^-24
/// amax < 4 FLT_EPSILON amax (FLT_EPSILON = 2^-23). A bug that picks the wrong level costs a
/// whole step (>= 2^-8 amax for INT8), far above this slack.
[[nodiscard]] inline double int_tolerance(double step, double amax) { return step / 2 + 4.0 * FLT_EPSILON * amax; }

/// Upper bound of integer codec C's reconstruction error for any value of a group whose values
/// span [lo, hi], derived from the data alone (no stored metadata): half a step, the step bounded
/// with the metadata rounding (zero-point down by <= 2^-10 |lo|, scale up by <= 2^-10 relative
/// for fp16, 2^-23 for fp32; margins 2x), plus int_tolerance's fp32 slack.
template <class C>
[[nodiscard]] double int_error_bound(double lo, double hi) {
  const double amax = std::max(std::fabs(lo), std::fabs(hi));
  const double rel = std::is_same_v<typename C::meta_type, MetaF16> ? 0x1p-9 : 0x1p-22;
  const double span = C::asymmetric ? (hi - lo) + rel * amax : amax;
  const double step = span / (C::qmax > 0 ? C::qmax : 1) * (1 + rel) + 1e-7 * amax;
  return int_tolerance(step, amax);
}

/// Outcome of checking many groups: failure count and the first few messages.
struct Report {
  long groups = 0, values = 0, failures = 0;
  std::ostringstream first;
  void fail(const std::string& what) {
    if (failures++ < 8) first << what << "\n";
  }
};

/// Checks one group of `count` values x[i * stride] whose reconstructions are xh[i * stride] and
/// whose stored metadata is p. `where()` names the group in failure messages (called only on
/// failure, so passing groups cost no string building).
template <class C, class Where>
void check_group(const float* x, const float* xh, std::ptrdiff_t stride, int count, GroupParams p, const Where& where,
                 Report& rep) {
  ++rep.groups;
  rep.values += count;
  const Range r = range_of(x, stride, count);
  const GroupParams ref = ref_params<C>(r);
  auto msg = [&](const char* what) {
    std::ostringstream o;
    o.precision(9);
    o << where() << ": " << what << " (group range [" << r.lo << ", " << r.hi << "], scale " << p.scale << " ref "
      << ref.scale << ", zero " << p.zero << " ref " << ref.zero << ")";
    return o.str();
  };
  if (!(std::isfinite(p.scale) && p.scale > 0 && std::isfinite(p.zero))) rep.fail(msg("metadata not finite/positive"));
  if (p.scale != ref.scale || p.zero != ref.zero) rep.fail(msg("metadata differs from the float64 reference"));

  for (int i = 0; i < count; ++i) {
    const double xi = x[i * stride], yi = xh[i * stride];
    const double err = std::fabs(yi - xi);
    bool ok = std::isfinite(yi);
    double bound = 0;
    if constexpr (is_fp8_v<C>) {
      constexpr Fp8Ref f = fp8_ref<C>();
      const double t = std::fabs(xi) / p.scale;
      if (t >= f.min_normal()) {
        // RNE to m mantissa bits errs by at most 2^-(m+1) relative to the value's binade start,
        // i.e. <= 2^-(m+1) / (1 + 2^-(m+1)) |x|: the fp32 division and product (2^-23 relative)
        // fit in the gap to 2^-(m+1) |x|, so the bound is asserted without extra slack.
        bound = std::ldexp(std::fabs(xi), -(f.man_bits + 1));
      } else {
        // Subnormal range: half the subnormal spacing in x units, plus fp32 rounding of x/scale
        // and of code * scale.
        const double half = p.scale * f.min_subnormal() / 2;
        bound = half + 2.0 * FLT_EPSILON * (std::fabs(xi) + 2 * half);
      }
    } else {
      bound = int_tolerance(p.scale, r.amax());
    }
    ok = ok && err <= bound;
    if (!ok) {
      std::ostringstream o;
      o.precision(9);
      o << "element " << i << ": x = " << xi << ", x̂ = " << yi << ", |err| = " << err << " > bound " << bound;
      rep.fail(msg(o.str().c_str()));
    }
  }
}

/// Per-element error bounds of exact inputs X [T][H][D] (row-major, as a cache's exact K or V)
/// stored by codec C: every element of a group gets bound(lo, hi) of its group's value range.
/// Groups are per token over G = C::group_size channels, or, when `per_channel`, per channel over
/// G tokens aligned at token 0 (the commit rule of per-channel keys; the last group may be short).
template <class C, class Bound>
[[nodiscard]] std::vector<double> group_bounds(const std::vector<double>& X, std::int64_t T, int H, int D, bool per_channel,
                                               const Bound& bound) {
  constexpr int G = C::group_size;
  std::vector<double> out(X.size());
  auto at = [&](std::int64_t t, int h, int d) { return (static_cast<std::size_t>(t) * H + h) * D + d; };
  auto fill = [&](std::int64_t t0, std::int64_t t1, int d0, int d1, int h) {
    double lo = INFINITY, hi = -INFINITY;
    for (std::int64_t t = t0; t < t1; ++t)
      for (int d = d0; d < d1; ++d) lo = std::min(lo, X[at(t, h, d)]), hi = std::max(hi, X[at(t, h, d)]);
    const double b = bound(lo, hi);
    for (std::int64_t t = t0; t < t1; ++t)
      for (int d = d0; d < d1; ++d) out[at(t, h, d)] = b;
  };
  for (int h = 0; h < H; ++h) {
    if (per_channel) {
      for (std::int64_t t0 = 0; t0 < T; t0 += G)
        for (int d = 0; d < D; ++d) fill(t0, std::min<std::int64_t>(T, t0 + G), d, d + 1, h);
    } else {
      for (std::int64_t t = 0; t < T; ++t)
        for (int g = 0; g < D / G; ++g) fill(t, t + 1, g * G, (g + 1) * G, h);
    }
  }
  return out;
}

}  // namespace kvpack::codec_ref
