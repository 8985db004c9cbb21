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

  /// Attends the last n_q tokens with q and returns the max relative error against ref64 over the
  /// cache's own dequantized past and the exact current chunk.
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
    return max_rel_error(out, ref, shape_.head_dim);
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
