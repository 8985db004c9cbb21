// Drives a KVCache and the float64 reference side by side: appends chunks, attends, and builds
// the K/V that attention must have read (the cache's own dequantized past + the exact current chunk).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvpack/kv_cache.hpp"
#include "support/reference.hpp"

namespace kvtest {

template <class Cache>
class Harness {
 public:
  explicit Harness(kvpack::ModelShape shape) : shape_(shape), cache_(make(shape)) {}

  static Cache make(const kvpack::ModelShape& s) {
    auto r = Cache::create(s);
    if (!r) ADD_FAILURE() << r.error().message;
    return std::move(r).value();
  }

  Cache& cache() { return cache_; }
  [[nodiscard]] size_t row() const { return static_cast<size_t>(shape_.kv_heads) * shape_.head_dim; }
  [[nodiscard]] size_t qrow() const { return static_cast<size_t>(shape_.q_heads) * shape_.head_dim; }
  [[nodiscard]] int64_t tokens() const { return static_cast<int64_t>(exact_k_.size() / row()); }

  /// Appends k, v ([n][kv_heads][D]) to `layer`, remembering the exact values.
  void append(int layer, const std::vector<float>& k, const std::vector<float>& v) {
    const int64_t n = static_cast<int64_t>(k.size() / row());
    auto st = cache_.append(layer, k, v, iota_positions(tokens(), n));
    ASSERT_TRUE(st) << st.error().message;
    chunk_start_ = tokens();
    exact_k_.insert(exact_k_.end(), k.begin(), k.end());
    exact_v_.insert(exact_v_.end(), v.begin(), v.end());
  }

  /// K and V as attention must read them: tokens before the latest chunk from the cache's own
  /// read_back (dequantized), the latest chunk exact. [n][kv_heads][D] float64.
  void reference_kv(int layer, std::vector<double>& K, std::vector<double>& V) {
    const int D = shape_.head_dim, H = shape_.kv_heads;
    const int64_t n = tokens();
    K.assign(static_cast<size_t>(n) * row(), 0.0);
    V.assign(K.size(), 0.0);
    for (int h = 0; h < H; ++h) {
      auto c = cache_.read_back(layer, h);
      ASSERT_TRUE(c);
      ASSERT_EQ(static_cast<int64_t>(c->k.size()), n * D);
      for (int64_t t = 0; t < n; ++t)
        for (int d = 0; d < D; ++d) {
          const size_t dst = (static_cast<size_t>(t) * H + h) * D + d;
          const bool exact = t >= chunk_start_;
          K[dst] = exact ? exact_k_[dst] : c->k[static_cast<size_t>(t) * D + d];
          V[dst] = exact ? exact_v_[dst] : c->v[static_cast<size_t>(t) * D + d];
        }
    }
  }

  /// Group over which the cache's backend quantizes the query for integer Q·K (0: fp32 scores);
  /// see kvpack::kernels::query_int8_group.
  static constexpr int query_group =
      kvpack::kernels::query_int8_group<typename Cache::backend_tag, typename Cache::key_codec, Cache::keys_per_channel>;
  /// Whether the backend accumulates INT4 values from their codes (kernels::value_int_accumulate).
  static constexpr bool int_values =
      kvpack::kernels::value_int_accumulate<typename Cache::backend_tag, typename Cache::value_codec>;

  /// Attends the last n_q tokens with q and returns the max relative error against ref64 over the
  /// cache's own dequantized past and the exact current chunk. On a backend with integer Q·K
  /// (query_group > 0) the error first loses the bound its quantized query allows (query_error_bound):
  /// what is returned is the kernel's error beyond that documented tolerance.
  double attend_error(int layer, const std::vector<float>& q) {
    std::vector<float> out(q.size());
    auto st = cache_.attend(layer, q, out);
    EXPECT_TRUE(st) << (st ? "" : st.error().message);
    for (float x : out) EXPECT_TRUE(std::isfinite(x));
    std::vector<double> K, V;
    reference_kv(layer, K, V);
    const int n_q = static_cast<int>(q.size() / qrow());
    const double scale = 1.0 / std::sqrt(static_cast<double>(shape_.head_dim));
    const auto ref = attention_ref64(K, V, tokens(), q, n_q, shape_.q_heads, shape_.kv_heads, shape_.head_dim, scale,
                                     tokens() - n_q);
    if constexpr (query_group > 0 || int_values) {
      const int D = shape_.head_dim;
      for (size_t r = 0; r < ref.size() / static_cast<size_t>(D); ++r) {
        const double bound = query_error_bound(K, V, q, ref, static_cast<int>(r), n_q, scale);
        for (int d = 0; d < D; ++d) {  // move out toward ref by at most the bound
          const size_t i = r * static_cast<size_t>(D) + static_cast<size_t>(d);
          const double diff = static_cast<double>(out[i]) - ref[i];
          out[i] = static_cast<float>(ref[i] + std::copysign(std::max(0.0, std::abs(diff) - bound), diff));
        }
      }
    }
    return max_rel_error(out, ref, shape_.head_dim);
  }

  /// Output error a quantized query (groups of query_group channels, half a step, max|q_g| * kernels::query_int_error, per
  /// element) allows for output row r = (query i, head h): every logit moves by at most
  ///   e = scale * max_t Σ_g max_{d in g}|q_d| * query_int_error * Σ_{d in g} |k_td|,
  /// so each probability by a factor within e^{±2e}, ||Δp||_1 <= e^{2e} - 1, and each output channel
  /// by at most (e^{2e} - 1) * max_t |v_td - o_d|.
  double query_error_bound(const std::vector<double>& K, const std::vector<double>& V, const std::vector<float>& q,
                           const std::vector<double>& ref, int r, int n_q, double scale) const {
    const int D = shape_.head_dim, G = query_group > 0 ? query_group : D, H = shape_.kv_heads;
    const int i = r / shape_.q_heads, h = r % shape_.q_heads, kh = h / (shape_.q_heads / H);
    const float* qr = q.data() + static_cast<size_t>(r) * static_cast<size_t>(D);
    const int64_t visible = tokens() - n_q + i + 1;
    double e = 0, spread = 0;
    for (int64_t t = 0; t < visible; ++t) {
      const double* k = K.data() + (static_cast<size_t>(t) * H + static_cast<size_t>(kh)) * D;
      const double* v = V.data() + (static_cast<size_t>(t) * H + static_cast<size_t>(kh)) * D;
      double et = 0;
      for (int g = 0; g < D / G; ++g) {
        double qmax = 0, ksum = 0;
        for (int d = g * G; d < (g + 1) * G; ++d) {
          qmax = std::max(qmax, std::abs(static_cast<double>(qr[d])));
          ksum += std::abs(k[d]);
        }
        et += qmax * kvpack::kernels::query_int_error * ksum;
      }
      e = std::max(e, et * scale);
      for (int d = 0; d < D; ++d)
        spread = std::max(spread, std::abs(v[d] - ref[static_cast<size_t>(r) * static_cast<size_t>(D) + static_cast<size_t>(d)]));
    }
    double bound = query_group > 0 ? (std::exp(2 * e) - 1) * spread : 0.0;
    if constexpr (int_values) {  // tokens before the latest chunk are read from INT4 blocks (or exactly)
      using VC = typename Cache::value_codec;
      std::vector<double> logit(static_cast<size_t>(visible)), p, sc;
      double mx = -INFINITY, l = 0;
      for (int64_t t = 0; t < visible; ++t) {
        const double* k = K.data() + (static_cast<size_t>(t) * H + static_cast<size_t>(kh)) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(qr[d]) * k[d];
        logit[static_cast<size_t>(t)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      for (double x : logit) l += std::exp(x - mx);
      for (int64_t t = 0; t < std::min(visible, chunk_start_); ++t) {
        const double* v = V.data() + (static_cast<size_t>(t) * H + static_cast<size_t>(kh)) * D;
        double smax = 0;
        for (int g = 0; g < D / VC::group_size; ++g)
          smax = std::max(smax, int4_group_scale(v + g * VC::group_size, VC::group_size, VC::asymmetric));
        p.push_back(std::exp(logit[static_cast<size_t>(t)] - mx) / l);
        sc.push_back(smax);
      }
      bound += int4_value_error_bound(p, sc);
    }
    return bound;
  }

  const std::vector<float>& exact_k() const { return exact_k_; }
  const std::vector<float>& exact_v() const { return exact_v_; }

 private:
  kvpack::ModelShape shape_;
  Cache cache_;
  std::vector<float> exact_k_, exact_v_;
  int64_t chunk_start_ = 0;
};

}  // namespace kvtest
