// TOVA: a fixed token budget; the token the latest query attends to least is dropped. Added as a
// policy of its own file (policy type + hook), with no change to KVCache.
#pragma once

#include <cstdint>
#include <span>

#include "kvpack/eviction/token_budget.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

namespace eviction {
/// TOVA's hook: a token's score is the attention mass it received from the latest attend only
/// (replaced at every attend, not summed over steps as H2O's); the victim is the lowest-scored
/// non-sink token, the oldest on ties.
template <class P>
class TovaHook : public TokenBudgetHook<TovaHook<P>, P> {
 public:
  static constexpr bool wants_mass = true;
  template <class St>
  void on_mass(St& st, int li, int h, const kernels::HeadSegments& seg, std::span<const float> mass) {
    credit_mass(st, li, h, seg, mass, Credit::replace);
  }
  template <class St>
  [[nodiscard]] std::int64_t victim(St& st, int li, int h, std::int64_t recent_from) const noexcept {
    return this->lowest_score(st.layer(li).heads[static_cast<std::size_t>(h)], recent_from);
  }
};
}  // namespace eviction

/// TOVA, token omission via attention (Oren et al. 2024, "Transformers are Multi-State RNNs",
/// arXiv:2401.06104): the cache holds at most Budget tokens per (layer, KV head); when a new token
/// would exceed it, the token with the lowest attention weight from the latest query is dropped.
/// Unlike H2O, scores are not accumulated: only the latest attend counts (for a prefill chunk, the
/// mass of all its queries, summed). Per KV head, a token's weight is summed over the head's GQA
/// group (the paper averages over all heads and keeps one set of tokens per layer; per-KV-head
/// decisions are kvpack's rule for every policy). The first S tokens are kept for ever (S = 0
/// in the paper; sinks help at long contexts). The tokens of the latest append wait until the
/// next append, as for every policy (eviction/policies.hpp), so the newest token is never its
/// own step's victim. Errors: Budget <= S fails to compile.
template <int Budget, int S = 0>
struct TOVA {
  static_assert(S >= 0 && Budget > S, "kvpack::TOVA<Budget, S>: need S >= 0 sinks and a Budget above S");
  using kvpack_role = role::eviction;
  static constexpr bool evicts = true;
  using hook = eviction::TovaHook<TOVA>;
  static constexpr int sink_tokens = S;
  /// Smallest budget the policy accepts.
  static constexpr std::int64_t min_budget = S + 1;
  /// Budget in tokens per (layer, KV head): Budget (max_tokens unused).
  [[nodiscard]] static constexpr std::int64_t resolve_budget(std::int64_t /*max_tokens*/) noexcept { return Budget; }
  /// No recent window: every committed non-sink token competes.
  [[nodiscard]] static constexpr std::int64_t recent_for(std::int64_t /*budget*/) noexcept { return 0; }
};

}  // namespace kvpack
