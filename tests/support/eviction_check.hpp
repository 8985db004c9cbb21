// Checks attention of an evicting cache against float64 attention over exactly the rows it holds.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <set>
#include <vector>

#include "support/reference.hpp"

namespace kvtest {

/// Cache indices held by (layer, kv_head), ascending.
template <class Cache>
std::vector<int64_t> kept_indices(const Cache& c, int layer, int kv_head) {
  auto rb = c.read_back(layer, kv_head);
  EXPECT_TRUE(rb);
  return rb ? rb->indices : std::vector<int64_t>{};
}

/// Attends q ([n_q][q_heads][D], the last n_q tokens) and returns the max relative error against
/// ref64 over the rows read_back reports (the latest chunk is exact there: eviction caches commit
/// lazily).
template <class Cache>
double evicting_attend_error(Cache& c, int layer, const std::vector<float>& q) {
  const auto& S = c.shape();
  const int D = S.head_dim, group = S.q_heads / S.kv_heads;
  std::vector<float> out(q.size());
  auto st = c.attend(layer, q, out);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  const int n_q = static_cast<int>(q.size() / (static_cast<size_t>(S.q_heads) * D));
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  double worst = 0;
  for (int h = 0; h < S.kv_heads; ++h) {
    auto rb = c.read_back(layer, h).value();
    const auto ref = attention_ref64_indexed(rb.k, rb.v, rb.indices, q.data() + h * group * D, n_q, group,
                                             static_cast<int64_t>(S.q_heads) * D, D, scale, c.tokens(layer) - n_q);
    std::vector<float> o;
    for (int i = 0; i < n_q; ++i)
      for (int j = 0; j < group; ++j)
        for (int d = 0; d < D; ++d)
          o.push_back(out[(static_cast<size_t>(i) * S.q_heads + h * group + j) * D + d]);
    worst = std::max(worst, max_rel_error(o, ref, D));
  }
  return worst;
}

/// Keys for n_rows tokens of `shape` ([n_rows][kv_heads][head_dim], N(0,1), seed) with outlier
/// channels: channel c scaled by 12 when c % 8 == 3 (per-token groups then spend their range on them).
inline std::vector<float> outlier_keys(const kvpack::ModelShape& shape, std::size_t n_rows, int seed) {
  const auto D = static_cast<std::size_t>(shape.head_dim);
  auto k = normal(n_rows * static_cast<std::size_t>(shape.kv_heads) * D, static_cast<uint32_t>(seed));
  for (std::size_t i = 0; i < k.size(); ++i)
    if ((i % D) % 8 == 3) k[i] *= 12.f;
  return k;
}

/// Feeds a prompt of p tokens (outlier keys, attended) and `steps` decode tokens to `c` and, with
/// the same data, to every cache in `others`, checking after each that `c`'s attention equals
/// float64 attention over the rows it holds within 1e-5 (evicting_attend_error).
template <class C, class... Others>
void feed_outlier_checked(C& c, int p, int steps, Others&... others) {
  const kvpack::ModelShape& S = c.shape();
  const std::size_t row = static_cast<std::size_t>(S.kv_heads) * static_cast<std::size_t>(S.head_dim);
  const std::size_t qrow = static_cast<std::size_t>(S.q_heads) * static_cast<std::size_t>(S.head_dim);
  auto append = [&](auto& x, std::size_t n, int seed, int first) {
    ASSERT_TRUE(x.append(0, outlier_keys(S, n, seed), normal(n * row, static_cast<uint32_t>(seed + 1)),
                         iota_positions(first, static_cast<int64_t>(n))));
  };
  append(c, static_cast<std::size_t>(p), 1, 0);
  (append(others, static_cast<std::size_t>(p), 1, 0), ...);
  EXPECT_LE(evicting_attend_error(c, 0, normal(static_cast<std::size_t>(p) * qrow, 3)), 1e-5) << "p " << p;
  std::vector<float> o(static_cast<std::size_t>(p) * qrow);
  (void(others.attend(0, normal(static_cast<std::size_t>(p) * qrow, 3), o)), ...);
  o.resize(qrow);
  for (int s = 0; s < steps; ++s) {
    append(c, 1, 10 + 2 * s, p + s);
    (append(others, 1, 10 + 2 * s, p + s), ...);
    const auto q = normal(qrow, static_cast<uint32_t>(500 + s));
    EXPECT_LE(evicting_attend_error(c, 0, q), 1e-5) << "p " << p << ", step " << s;
    (void(others.attend(0, q, o)), ...);
  }
}

}  // namespace kvtest
