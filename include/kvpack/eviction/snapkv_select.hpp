// SnapKV's selection step, separated from the cache so it can be tested on hand-written scores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace kvpack::eviction {

/// Picks `budget` of n candidates (in token order) from their raw scores: scores are smoothed by
/// a centred 1-D max pool of width `kernel` (odd; edges use the part of the window that exists),
/// then ranked by (pooled desc, raw desc, position asc). Returns the chosen positions ascending.
/// budget >= n keeps everything.
[[nodiscard]] inline std::vector<std::int64_t> snapkv_select(const std::vector<float>& raw, int kernel,
                                                            std::int64_t budget) {
  const auto n = static_cast<std::int64_t>(raw.size());
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  if (budget >= n) return order;
  const int half = kernel / 2;
  std::vector<float> pooled(raw.size());
  for (std::int64_t i = 0; i < n; ++i) {
    float m = raw[static_cast<std::size_t>(i)];
    for (std::int64_t j = std::max<std::int64_t>(0, i - half); j <= std::min(n - 1, i + half); ++j)
      m = std::max(m, raw[static_cast<std::size_t>(j)]);
    pooled[static_cast<std::size_t>(i)] = m;
  }
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    const auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
    if (pooled[ua] != pooled[ub]) return pooled[ua] > pooled[ub];
    if (raw[ua] != raw[ub]) return raw[ua] > raw[ub];
    return a < b;
  });
  order.resize(static_cast<std::size_t>(std::max<std::int64_t>(budget, 0)));
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace kvpack::eviction
