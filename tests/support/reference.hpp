// Float64 reference attention and helpers shared by the KV-cache tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

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
