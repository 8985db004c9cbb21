// kvpack::plan: choose one cache configuration per layer under a memory budget.
//
// The problem is a multiple-choice knapsack: layer l takes exactly one candidate c, costing
// bytes[l][c] bytes and a predicted quality loss cost[l][c] (mean KL against the fp32 cache,
// measured by `kvpack-eval --profile`); minimise the summed cost with the summed bytes within the
// budget. Solved exactly by dynamic programming over layers on a byte axis discretised in units
// of `granularity` bytes.
//
// Exactness. Let g be the granularity and w[l][c] = ceil(bytes[l][c] / g). When every
// bytes[l][c] is a multiple of g (the default g is the gcd of all byte counts, which makes this
// true), sum bytes = g * sum w, so  sum bytes <= B  <=>  sum w <= B / g  <=>  sum w <= floor(B / g)
// (sum w is an integer). The DP enumerates, per layer, the minimum cost over all choices of
// layers 0..l with total units <= u, for every u in 0..floor(B/g): by induction it equals the
// minimum over all feasible assignments, which is the brute-force optimum. When the gcd would
// need more than `max_units` units, g is raised to ceil(B / max_units) and weights round up: every
// returned plan is still within the budget (conservative), and it is optimal among plans whose
// rounded-up total fits, i.e. at least as good as the optimum for a budget of B - layers * g.
// Plan::exact says which case held.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "kvpack/result.hpp"

namespace kvpack::plan {

/// Per layer x candidate: predicted quality cost and memory cost.
/// Layout: cost and bytes_per_token are [layers][candidates] row-major.
struct SensitivityTable {
  std::string model;                    ///< model the table was measured on (free text)
  std::vector<std::string> candidates;  ///< candidate configuration names, in variant order
  int layers = 0;                       ///< transformer layers
  std::vector<double> cost;             ///< mean KL(fp32 || only layer l compressed by c), nats/token, >= 0
  std::vector<double> bytes_per_token;  ///< bytes one token costs in layer l under c (all KV heads)

  [[nodiscard]] double cost_at(int l, int c) const { return cost[static_cast<std::size_t>(l) * candidates.size() + static_cast<std::size_t>(c)]; }
  [[nodiscard]] double bytes_at(int l, int c) const {
    return bytes_per_token[static_cast<std::size_t>(l) * candidates.size() + static_cast<std::size_t>(c)];
  }
};

/// Planner knobs.
struct PlanOptions {
  /// Largest byte axis the DP may use (units); bounds its memory to layers * (max_units + 1) bytes
  /// of back-pointers plus 2 * 8 * (max_units + 1) bytes of costs.
  std::uint64_t max_units = std::uint64_t{1} << 20;
};

/// A chosen configuration per layer.
struct Plan {
  std::vector<int> choice;          ///< [layers] candidate index per layer
  double cost = 0;                  ///< summed predicted cost of the choice (layer order 0..L-1)
  std::uint64_t bytes = 0;          ///< summed bytes of the choice (exact, not rounded)
  std::uint64_t budget = 0;         ///< budget planned for, bytes
  std::uint64_t granularity = 1;    ///< bytes per DP unit
  bool exact = true;                ///< every byte count was a multiple of granularity (optimum proven)
};

/// Core planner on integer byte counts. cost, bytes: [layers][candidates] row-major; every cost
/// finite and >= 0; budget in bytes. Deterministic: where candidates of a layer tie in cost for the
/// same remaining budget, the lower candidate index wins. Errors: Errc::invalid_argument for bad sizes, negative or
/// non-finite costs, more than 255 candidates; Errc::capacity_exceeded when even the smallest
/// candidate of every layer exceeds the budget (the message gives the minimum bytes), or when
/// rounding to a coarse granularity made the budget unreachable.
[[nodiscard]] inline Result<Plan> plan_bytes(int layers, int candidates, std::span<const double> cost,
                                             std::span<const std::uint64_t> bytes, std::uint64_t budget,
                                             const PlanOptions& opt = {}) {
  if (layers < 1 || candidates < 1 || candidates > 255)
    return fail(Errc::invalid_argument, "plan: need >= 1 layer and 1..255 candidates");
  const auto n = static_cast<std::size_t>(layers) * static_cast<std::size_t>(candidates);
  if (cost.size() != n || bytes.size() != n)
    return fail(Errc::invalid_argument, "plan: cost and bytes must hold layers * candidates entries");
  for (double c : cost)
    if (!std::isfinite(c) || c < 0) return fail(Errc::invalid_argument, "plan: costs must be finite and >= 0");
  if (opt.max_units < 1) return fail(Errc::invalid_argument, "plan: max_units must be >= 1");
  const auto C = static_cast<std::size_t>(candidates);
  // Feasibility in exact bytes first (clear message).
  std::uint64_t min_total = 0;
  for (int l = 0; l < layers; ++l) {
    std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
    for (std::size_t c = 0; c < C; ++c) m = std::min(m, bytes[static_cast<std::size_t>(l) * C + c]);
    min_total += m;
  }
  if (min_total > budget)
    return fail(Errc::capacity_exceeded, "plan: infeasible budget: " + std::to_string(budget) +
                                             " bytes, but the smallest candidate of every layer needs " +
                                             std::to_string(min_total) + " bytes");
  Plan p;
  p.budget = budget;
  std::uint64_t g = 0;
  for (auto b : bytes) g = std::gcd(g, b);
  if (g == 0) g = 1;  // every candidate free
  if (budget / g > opt.max_units) g = (budget + opt.max_units - 1) / opt.max_units;
  p.granularity = g;
  for (auto b : bytes) p.exact = p.exact && b % g == 0;
  const std::uint64_t cap = budget / g;
  const auto U = static_cast<std::size_t>(cap) + 1;
  std::vector<std::uint64_t> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = bytes[i] / g + (bytes[i] % g != 0);
  constexpr double inf = std::numeric_limits<double>::infinity();
  // dp[u]: least cost of layers 0..l with total units <= u (nonincreasing in u).
  std::vector<double> dp(U, 0.0), nd(U);
  std::vector<std::uint8_t> back(static_cast<std::size_t>(layers) * U, 0);
  for (int l = 0; l < layers; ++l) {
    const std::size_t row = static_cast<std::size_t>(l) * C;
    std::uint8_t* bk = back.data() + static_cast<std::size_t>(l) * U;
    for (std::size_t u = 0; u < U; ++u) {
      double best = inf;
      std::uint8_t arg = 0;
      for (std::size_t c = 0; c < C; ++c) {
        if (w[row + c] > u) continue;
        const double v = dp[u - static_cast<std::size_t>(w[row + c])] + cost[row + c];
        if (v < best) {
          best = v;
          arg = static_cast<std::uint8_t>(c);
        }
      }
      nd[u] = best;
      bk[u] = arg;
    }
    dp.swap(nd);
  }
  if (!std::isfinite(dp[cap]))
    return fail(Errc::capacity_exceeded, "plan: budget " + std::to_string(budget) + " bytes unreachable at granularity " +
                                             std::to_string(g) + " bytes (weights round up; raise max_units)");
  p.choice.assign(static_cast<std::size_t>(layers), 0);
  std::size_t u = static_cast<std::size_t>(cap);
  for (int l = layers - 1; l >= 0; --l) {
    const int c = back[static_cast<std::size_t>(l) * U + u];
    p.choice[static_cast<std::size_t>(l)] = c;
    u -= static_cast<std::size_t>(w[static_cast<std::size_t>(l) * C + static_cast<std::size_t>(c)]);
  }
  for (int l = 0; l < layers; ++l) {
    const std::size_t i = static_cast<std::size_t>(l) * C + static_cast<std::size_t>(p.choice[static_cast<std::size_t>(l)]);
    p.cost += cost[i];
    p.bytes += bytes[i];
  }
  return p;
}

/// Bytes layer l needs under candidate c for `context_tokens` tokens: bytes_per_token * context,
/// rounded up (a value within 1e-6 of an integer counts as that integer, so tables built from
/// measured bytes / context round-trip exactly).
[[nodiscard]] inline std::uint64_t bytes_for(double bytes_per_token, std::int64_t context_tokens) {
  const double x = bytes_per_token * static_cast<double>(context_tokens);
  const double r = std::round(x);
  return static_cast<std::uint64_t>(std::fabs(x - r) <= 1e-6 * std::max(1.0, r) ? r : std::ceil(x));
}

/// Plans from a sensitivity table for a sequence of `context_tokens` tokens within
/// `budget_bytes`. Errors: those of plan_bytes; Errc::invalid_argument when the table's sizes do
/// not match, a bytes_per_token is negative or non-finite, or context_tokens < 1.
[[nodiscard]] inline Result<Plan> plan_layers(const SensitivityTable& t, std::uint64_t budget_bytes,
                                              std::int64_t context_tokens, const PlanOptions& opt = {}) {
  const auto C = t.candidates.size();
  if (t.layers < 1 || C < 1 || t.cost.size() != static_cast<std::size_t>(t.layers) * C ||
      t.bytes_per_token.size() != t.cost.size())
    return fail(Errc::invalid_argument, "plan: sensitivity table sizes do not match layers x candidates");
  if (context_tokens < 1) return fail(Errc::invalid_argument, "plan: context_tokens must be >= 1");
  std::vector<std::uint64_t> b(t.cost.size());
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(t.bytes_per_token[i]) || t.bytes_per_token[i] < 0)
      return fail(Errc::invalid_argument, "plan: bytes_per_token must be finite and >= 0");
    b[i] = bytes_for(t.bytes_per_token[i], context_tokens);
  }
  return plan_bytes(t.layers, static_cast<int>(C), t.cost, b, budget_bytes, opt);
}

}  // namespace kvpack::plan
