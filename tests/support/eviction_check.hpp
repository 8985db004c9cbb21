// Checks attention of an evicting cache against float64 attention over exactly the rows it holds.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace kvtest
