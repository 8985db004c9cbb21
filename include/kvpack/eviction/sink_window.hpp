// SinkWindow (StreamingLLM): the first S tokens and a recent window; its hook evicts the oldest
// window token first, the slots forming a ring (a FIFO of slots in arrival order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "kvpack/eviction/budget.hpp"
#include "kvpack/eviction/token_budget.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

namespace eviction {
/// SinkWindow's hook: per (layer, KV head) a FIFO of the slots of non-sink tokens, oldest first;
/// the victim is its front once that token has left the recent window.
template <class P>
class SinkWindowHook : public TokenBudgetHook<SinkWindowHook<P>, P> {
 public:
  void init(const ModelShape& shape) {
    TokenBudgetHook<SinkWindowHook<P>, P>::init(shape);
    heads_ = shape.kv_heads;
    fifo_.assign(static_cast<std::size_t>(shape.layers) * static_cast<std::size_t>(shape.kv_heads), {});
  }
  void reset() {
    for (auto& f : fifo_) f.clear();
  }
  template <class St>
  void on_commit(St&, int li, int h, std::int64_t slot, std::int64_t token) {
    if (token >= P::sink_tokens) fifo(li, h).push_back(static_cast<std::int32_t>(slot));
  }
  template <class St>
  [[nodiscard]] std::int64_t victim(St& st, int li, int h, std::int64_t recent_from) {
    const HeadStore& H = st.layer(li).heads[static_cast<std::size_t>(h)];
    std::deque<std::int32_t>& f = fifo(li, h);
    while (!f.empty() && H.slot_token[static_cast<std::size_t>(f.front())] < 0) f.pop_front();
    if (f.empty() || H.slot_token[static_cast<std::size_t>(f.front())] >= recent_from) return -1;
    const std::int32_t v = f.front();
    f.pop_front();
    return v;
  }
  void wipe() noexcept { fifo_.clear(); }

 private:
  std::deque<std::int32_t>& fifo(int li, int h) {
    return fifo_[static_cast<std::size_t>(li) * static_cast<std::size_t>(heads_) + static_cast<std::size_t>(h)];
  }
  int heads_ = 0;
  std::vector<std::deque<std::int32_t>> fifo_;  // [layer * kv_heads + h]
};
}  // namespace eviction

/// StreamingLLM (Xiao et al. 2023, arXiv:2309.17453): keep the first S tokens (attention sinks)
/// for ever and the most recent W tokens; older window tokens are evicted oldest first, their
/// slots reused as a ring. Memory is constant once S + W tokens have arrived.
template <int S, int W>
struct SinkWindow {
  static_assert(S >= 0 && W >= 1, "kvpack::SinkWindow<S, W>: need S >= 0 sinks and a window W >= 1");
  using kvpack_role = role::eviction;
  static constexpr bool evicts = true;
  using hook = eviction::SinkWindowHook<SinkWindow>;
  static constexpr int sink_tokens = S;
  static constexpr int recent_tokens = W;
  static constexpr int budget = S + W;
  /// Smallest budget the policy accepts (checked by KVCache::create for run-time budgets).
  static constexpr std::int64_t min_budget = S + 1;
  /// Budget in tokens per (layer, KV head) for a cache of `max_tokens` tokens: S + W.
  [[nodiscard]] static constexpr std::int64_t resolve_budget(std::int64_t /*max_tokens*/) noexcept { return budget; }
  /// Recent-window tokens for a resolved `budget`: W.
  [[nodiscard]] static constexpr std::int64_t recent_for(std::int64_t /*budget*/) noexcept { return W; }
};

/// StreamingLLM (SinkWindow) sized by one total budget: Budget is Tokens<N> or Fraction<Num, Den>
/// of ModelShape::max_tokens (resolved by KVCache::create, as for BlockSparse), of which the first
/// S tokens are attention sinks and the rest, budget - S, is the recent window. So
/// SinkWindowBudget<Fraction<1, 4>> with max_tokens = 4096 behaves exactly as SinkWindow<4, 1020>
/// (1024 tokens per layer and KV head). Eviction, ring reuse and constant memory as SinkWindow.
/// Errors: a budget of Tokens<N> with N <= S, or a Budget that is no budget type, fails to
/// compile; a Fraction that resolves to <= S tokens makes KVCache::create return
/// Errc::invalid_argument.
template <class Budget, int S = 4>
struct SinkWindowBudget {
  static_assert(EvictionBudget<Budget>,
                "kvpack::SinkWindowBudget<Budget, S>: Budget must be kvpack::Tokens<N> or kvpack::Fraction<Num, Den>");
  static_assert(S >= 0, "kvpack::SinkWindowBudget<Budget, S>: need S >= 0 sinks");
  static_assert(detail::fixed_budget_v<Budget> < 0 || detail::fixed_budget_v<Budget> > S,
                "kvpack::SinkWindowBudget<Tokens<N>, S>: the budget N must exceed the S sinks (the window needs at "
                "least one token)");
  using kvpack_role = role::eviction;
  using budget_type = Budget;
  static constexpr bool evicts = true;
  using hook = eviction::SinkWindowHook<SinkWindowBudget>;
  static constexpr int sink_tokens = S;
  /// Smallest budget the policy accepts: the sinks plus a one-token window.
  static constexpr std::int64_t min_budget = S + 1;
  /// Budget in tokens per (layer, KV head): Budget resolved against `max_tokens`.
  [[nodiscard]] static constexpr std::int64_t resolve_budget(std::int64_t max_tokens) noexcept {
    return detail::resolve_budget<Budget>(max_tokens);
  }
  /// Recent-window tokens for a resolved `budget`: budget - S.
  [[nodiscard]] static constexpr std::int64_t recent_for(std::int64_t budget) noexcept { return budget - S; }
};

}  // namespace kvpack
