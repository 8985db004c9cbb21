// H2O (heavy-hitter oracle): sinks, a recent window and the tokens with the largest cumulative
// attention mass; its hook credits the mass the kernel gathers and evicts the lowest score.
#pragma once

#include <cstdint>
#include <span>

#include "kvpack/eviction/budget.hpp"
#include "kvpack/eviction/token_budget.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

namespace eviction {
/// H2O's hook: scores are the cumulative attention mass of each token (summed over steps,
/// queries and the KV head's query heads); the victim is the lowest-scored non-sink, non-recent
/// token, the oldest on ties.
template <class P>
class H2OHook : public TokenBudgetHook<H2OHook<P>, P> {
 public:
  static constexpr bool wants_mass = true;
  template <class St>
  void on_mass(St& st, int li, int h, const kernels::HeadSegments& seg, std::span<const float> mass) {
    credit_mass(st, li, h, seg, mass, Credit::add);
  }
  template <class St>
  [[nodiscard]] std::int64_t victim(St& st, int li, int h, std::int64_t recent_from) const noexcept {
    return this->lowest_score(st.layer(li).heads[static_cast<std::size_t>(h)], recent_from);
  }
};
}  // namespace eviction

/// H2O heavy-hitter oracle (Zhang et al. 2023, arXiv:2306.14048): keep S sinks, the Recent most
/// recent tokens and the Heavy tokens with the largest cumulative attention mass among the rest.
/// Mass is gathered from the attention kernel as it runs (AttendArgs::key_mass), summed over
/// steps, queries and the KV head's query heads; ties evict the oldest token. A newcomer is
/// always kept while it is among the Recent most recent tokens. Without attention mass (a layer
/// appended to but not yet attended, or tokens that arrived since the last attend) a token's
/// score is 0, the paper's value for a token no query has seen: this is a deliberate fallback,
/// not an error, since H2O evicts continuously and every newcomer starts at 0. Zero-score tokens
/// are evicted oldest first, so a cache never attended keeps exactly the S sinks and the
/// Heavy + Recent newest tokens (SinkWindow<S, Heavy + Recent>; tests/test_eviction_empty_scores.cpp).
template <int Heavy, int Recent, int S = 0>
struct H2O {
  static_assert(Heavy >= 0 && Recent >= 1 && S >= 0, "kvpack::H2O<Heavy, Recent, S>: need Heavy >= 0, Recent >= 1, S >= 0");
  using kvpack_role = role::eviction;
  static constexpr bool evicts = true;
  using hook = eviction::H2OHook<H2O>;
  static constexpr int sink_tokens = S;
  static constexpr int recent_tokens = Recent;
  static constexpr int heavy_tokens = Heavy;
  static constexpr int budget = S + Recent + Heavy;
  /// Smallest budget the policy accepts (checked by KVCache::create for run-time budgets).
  static constexpr std::int64_t min_budget = S + 1;
  /// Budget in tokens per (layer, KV head) for a cache of `max_tokens` tokens: S + Recent + Heavy.
  [[nodiscard]] static constexpr std::int64_t resolve_budget(std::int64_t /*max_tokens*/) noexcept { return budget; }
  /// Recent tokens for a resolved `budget`: Recent.
  [[nodiscard]] static constexpr std::int64_t recent_for(std::int64_t /*budget*/) noexcept { return Recent; }
};

/// H2O sized by one total budget: Budget is Tokens<N> or Fraction<Num, Den> of
/// ModelShape::max_tokens (resolved by KVCache::create). Split, as the paper's default of equal
/// heavy and recent shares: heavy = floor(budget / 2), sinks = S, recent = budget - heavy - S.
/// So H2OBudget<Fraction<1, 4>> with max_tokens = 4096 behaves exactly as H2O<512, 508, 4>, and
/// H2OBudget<Fraction<1, 2>> as H2O<1024, 1020, 4>. Scoring and eviction as H2O.
/// Errors: Tokens<N> with recent < 1 (N < 2 * S + 1), or a Budget that is no budget type, fails to
/// compile; a Fraction resolving below 2 * S + 1 tokens makes KVCache::create return
/// Errc::invalid_argument.
template <class Budget, int S = 4>
struct H2OBudget {
  static_assert(EvictionBudget<Budget>,
                "kvpack::H2OBudget<Budget, S>: Budget must be kvpack::Tokens<N> or kvpack::Fraction<Num, Den>");
  static_assert(S >= 0, "kvpack::H2OBudget<Budget, S>: need S >= 0 sinks");
  static_assert(detail::fixed_budget_v<Budget> < 0 || detail::fixed_budget_v<Budget> >= 2 * static_cast<std::int64_t>(S) + 1,
                "kvpack::H2OBudget<Tokens<N>, S>: the budget N must be at least 2 * S + 1 (heavy = N / 2, and the "
                "recent window N - N / 2 - S needs at least one token)");
  using kvpack_role = role::eviction;
  using budget_type = Budget;
  static constexpr bool evicts = true;
  using hook = eviction::H2OHook<H2OBudget>;
  static constexpr int sink_tokens = S;
  /// Smallest budget the policy accepts: recent = budget - budget / 2 - S >= 1.
  static constexpr std::int64_t min_budget = 2 * static_cast<std::int64_t>(S) + 1;
  /// Budget in tokens per (layer, KV head): Budget resolved against `max_tokens`.
  [[nodiscard]] static constexpr std::int64_t resolve_budget(std::int64_t max_tokens) noexcept {
    return detail::resolve_budget<Budget>(max_tokens);
  }
  /// Heavy-hitter tokens for a resolved `budget`: floor(budget / 2).
  [[nodiscard]] static constexpr std::int64_t heavy_for(std::int64_t budget) noexcept { return budget / 2; }
  /// Recent tokens for a resolved `budget`: budget - floor(budget / 2) - S.
  [[nodiscard]] static constexpr std::int64_t recent_for(std::int64_t budget) noexcept { return budget - budget / 2 - S; }
};

}  // namespace kvpack
