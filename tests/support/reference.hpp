// Float64 reference attention and helpers shared by the KV-cache tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kvpack/kernels/dispatch.hpp"

namespace kvtest {

/// Softmax attention in float64. K, V: [n_keys][kv_heads][D]; Q: [n_q][q_heads][D] for queries at
/// cache indices q_first .. q_first + n_q - 1, each seeing keys with index <= its own (causal).
/// Returns [n_q][q_heads][D]. Query head h reads KV head h / (q_heads / kv_heads).
inline std::vector<double> attention_ref64(const std::vector<double>& K, const std::vector<double>& V, int64_t n_keys,
                                           const std::vector<float>& Q, int n_q, int q_heads, int kv_heads, int D,
                                           double scale, int64_t q_first) {
  std::vector<double> out(static_cast<size_t>(n_q) * q_heads * D, 0.0);
  const int group = q_heads / kv_heads;
  std::vector<double> s(static_cast<size_t>(n_keys));
  for (int i = 0; i < n_q; ++i) {
    const int64_t visible = std::min<int64_t>(n_keys, q_first + i + 1);
    for (int h = 0; h < q_heads; ++h) {
      const int kh = h / group;
      const float* q = Q.data() + (static_cast<size_t>(i) * q_heads + h) * D;
      double mx = -INFINITY;
      for (int64_t t = 0; t < visible; ++t) {
        const double* k = K.data() + (static_cast<size_t>(t) * kv_heads + kh) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
        s[static_cast<size_t>(t)] = dot * scale;
        mx = std::max(mx, s[static_cast<size_t>(t)]);
      }
      double l = 0;
      double* o = out.data() + (static_cast<size_t>(i) * q_heads + h) * D;
      for (int64_t t = 0; t < visible; ++t) {
        const double p = std::exp(s[static_cast<size_t>(t)] - mx);
        l += p;
        const double* v = V.data() + (static_cast<size_t>(t) * kv_heads + kh) * D;
        for (int d = 0; d < D; ++d) o[d] += p * v[d];
      }
      if (l > 0)
        for (int d = 0; d < D; ++d) o[d] /= l;
    }
  }
  return out;
}

/// Largest |a - b| over each D-vector divided by the largest |b| of that vector (floored at
/// `floor` so an all-zero reference does not divide by zero).
inline double max_rel_error(const std::vector<float>& a, const std::vector<double>& b, int D, double floor = 1e-6) {
  double worst = 0;
  for (size_t v0 = 0; v0 < b.size(); v0 += static_cast<size_t>(D)) {
    double err = 0, mag = floor;
    for (int d = 0; d < D; ++d) {
      err = std::max(err, std::abs(static_cast<double>(a[v0 + d]) - b[v0 + d]));
      mag = std::max(mag, std::abs(b[v0 + d]));
    }
    worst = std::max(worst, err / mag);
  }
  return worst;
}

/// n standard-normal floats from a fixed seed.
inline std::vector<float> normal(size_t n, uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

/// Positions first .. first + n - 1.
inline std::vector<int32_t> iota_positions(int64_t first, int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(first + i);
  return p;
}

}  // namespace kvtest

namespace kvtest {

/// Float64 attention over an explicit key set: K, V [n][D] with cache indices idx[n] (one KV
/// head), queries Q [n_q][group][D] at cache indices q_first + i; a key is visible when its index
/// is <= the query's. Returns [n_q][group][D].
inline std::vector<double> attention_ref64_indexed(const std::vector<float>& K, const std::vector<float>& V,
                                                   const std::vector<int64_t>& idx, const float* Q, int n_q, int group,
                                                   int64_t q_stride, int D, double scale, int64_t q_first) {
  std::vector<double> out(static_cast<size_t>(n_q) * group * D, 0.0);
  for (int i = 0; i < n_q; ++i)
    for (int j = 0; j < group; ++j) {
      const float* q = Q + i * q_stride + j * D;
      std::vector<double> s;
      std::vector<size_t> rows;
      for (size_t r = 0; r < idx.size(); ++r) {
        if (idx[r] > q_first + i) continue;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * K[r * D + d];
        s.push_back(dot * scale);
        rows.push_back(r);
      }
      if (s.empty()) continue;
      const double mx = *std::max_element(s.begin(), s.end());
      double l = 0;
      double* o = out.data() + (static_cast<size_t>(i) * group + j) * D;
      for (size_t r = 0; r < s.size(); ++r) {
        const double p = std::exp(s[r] - mx);
        l += p;
        for (int d = 0; d < D; ++d) o[d] += p * V[rows[r] * D + d];
      }
      for (int d = 0; d < D; ++d) o[d] /= l;
    }
  return out;
}

/// Scale of the INT4 group holding dequantized values x[0, n): asymmetric codes span 0..15 over a
/// group's range (scale = range / 15), symmetric ones reach +-7 at its largest magnitude.
inline double int4_group_scale(const double* x, int n, bool asymmetric) {
  double lo = x[0], hi = x[0], amax = 0;
  for (int i = 0; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]), amax = std::max(amax, std::abs(x[i]));
  return asymmetric ? (hi - lo) / 15.0 : amax / 7.0;
}

/// Error bound of integer P·V (kvpack::kernels::value_int_accumulate): p[t] the normalized
/// probabilities of the tokens read from INT4 blocks (in order), s[t] their largest group scale.
inline double int4_value_error_bound(const std::vector<double>& p, const std::vector<double>& s) {
  double sum = 0;
  const auto n = static_cast<std::ptrdiff_t>(p.size());
  for (std::ptrdiff_t t = 0; t < n; ++t) {
    double w = 0;
    for (std::ptrdiff_t u = std::max<std::ptrdiff_t>(0, t - 15); u < std::min(n, t + 16); ++u)
      w = std::max(w, p[static_cast<size_t>(u)] * s[static_cast<size_t>(u)]);
    sum += w;
  }
  return 1.05 * 8.0 * kvpack::kernels::value_int_error * sum;  // 5 %: the kernel's own probabilities differ from the exact ones
}

}  // namespace kvtest
