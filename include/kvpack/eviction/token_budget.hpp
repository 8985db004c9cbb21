// TokenBudgetHook: the budget enforcement shared by token-level policies that hold a fixed budget
// as tokens arrive (SinkWindow, H2O, TOVA): evict one victim at a time, chosen by the policy,
// until sinks + live slots + pending tokens fit the budget, never a sink or a recent token.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "kvpack/eviction/hook.hpp"
#include "kvpack/eviction/lowest_score.hpp"

namespace kvpack::eviction {

/// Base of a token-budget hook. P provides sink_tokens, min_budget, resolve_budget(max_tokens)
/// and recent_for(budget); Derived provides victim(st, layer, h, recent_from): the slot to evict
/// (-1: nothing evictable), where tokens at or after cache index recent_from are recent.
template <class Derived, class P>
class TokenBudgetHook : public HookDefaults {
 public:
  static constexpr bool evicts_continuously = true;

  /// Errc::invalid_argument when the budget resolved against max_tokens is below P::min_budget.
  [[nodiscard]] static Status check(const ModelShape& shape) {
    const std::int64_t b = P::resolve_budget(shape.max_tokens);
    if (b >= P::min_budget) return {};
    return fail(Errc::invalid_argument, "KVCache::create: eviction budget of " + std::to_string(b) +
                                            " tokens (from max_tokens " + std::to_string(shape.max_tokens) +
                                            ") is below the " + std::to_string(P::min_budget) +
                                            " tokens its sinks and a one-token recent window need");
  }
  void init(const ModelShape& shape) {
    budget_ = P::resolve_budget(shape.max_tokens);
    recent_ = P::recent_for(budget_);
  }
  [[nodiscard]] std::int64_t budget() const noexcept { return budget_; }
  /// Sets the budget to `b` tokens (and the recent window to P::recent_for(b)): the protocol
  /// wrapper (eviction/protocol.hpp) resolves a budget against the prompt when it ends.
  void set_budget(std::int64_t b) noexcept {
    budget_ = b;
    recent_ = P::recent_for(b);
  }

  /// Evicts until sinks + live + pend pending tokens fit the budget, or only sinks, recent and
  /// pending tokens are left: at most max(Sinks<N>, policy sinks) + max(recent, residual + n)
  /// tokens stay above the budget (held_after).
  template <class St>
  [[nodiscard]] std::int64_t held_after(const St& st, int li, std::int64_t n) const noexcept {
    const std::int64_t plain = st.held(st.layer(li)) + n;
    const std::int64_t floor = std::max<std::int64_t>(St::sink_tokens, P::sink_tokens) +
                               std::max<std::int64_t>(recent_, std::int64_t{St::residual_tokens} + n);
    return std::min(plain, std::max<std::int64_t>(budget_, floor));
  }
  template <class St>
  void enforce(St& st, int li, int h, std::int64_t pend) {
    auto& L = st.layer(li);
    HeadStore& H = L.heads[static_cast<std::size_t>(h)];
    const std::int64_t recent_from = L.total - recent_;
    while (L.sinks_held + H.live + pend > budget_) {
      const std::int64_t victim = static_cast<Derived*>(this)->victim(st, li, h, recent_from);
      if (victim < 0) break;
      st.drop_slot(li, h, victim, budget_);  // demoted first with Demote<> (cache/demotion_tier.hpp)
    }
  }

 protected:
  /// The live slot of `H` with the lowest score among tokens in [P::sink_tokens, recent_from);
  /// ties evict the oldest token. -1 when there is none.
  [[nodiscard]] static std::int64_t lowest_score(const HeadStore& H, std::int64_t recent_from) noexcept {
    return eviction::lowest_score(H.slot_token, H.slot_score, P::sink_tokens, recent_from);
  }

  std::int64_t budget_ = 0;  // tokens per (layer, KV head)
  std::int64_t recent_ = 0;  // newest tokens never evicted
};

}  // namespace kvpack::eviction
