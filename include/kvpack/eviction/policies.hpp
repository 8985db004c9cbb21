// Eviction policies: which tokens a KVCache keeps. Every policy keeps original token positions
// (keys arrive post-RoPE and are never re-rotated) and composes with every codec.
//
// Common rules (documented once here, asserted by tests/test_eviction_*.cpp and CASES C7-C10):
//  * Eviction runs at the start of each append, after the previous append's tokens were
//    committed: the tokens of the latest append are always kept until the next append, and
//    queries of one chunk attend causally to the whole chunk (exact) plus whatever was retained
//    before it (eviction at chunk granularity; pure decode is exact token-level eviction).
//  * Budgets count every token the layer holds: fp32 sinks, quantized slots and pending tokens.
//  * Evicted slots are zeroed and reused by later tokens, so memory stays constant once a budget
//    is reached.
//  * GQA: decisions are per KV head; scores are summed over the query heads of its group (the
//    ranking equals the mean's) unless a policy says otherwise.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kvpack/eviction/budget.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

namespace detail {
// N for Tokens<N>; -1 for Fraction<> (resolved at run time) and for a type that is no budget.
template <class B>
inline constexpr std::int64_t fixed_budget_v = -1;
template <std::int64_t N>
inline constexpr std::int64_t fixed_budget_v<Tokens<N>> = N;
// B::resolve(n) for a budget type (Tokens<N>: N; Fraction<Num, Den>: floor(n * Num / Den), at least 1);
// 0 for a type that is no budget (only reached after that policy's static_assert failed).
template <class B>
[[nodiscard]] constexpr std::int64_t resolve_budget(std::int64_t n) noexcept {
  if constexpr (is_budget_v<B>) return B::resolve(n);
  else return (void)n, 0;
}
}  // namespace detail

/// Keep every token (the default).
struct NoEviction {
  using kvpack_role = role::eviction;
  static constexpr bool evicts = false;
};

/// StreamingLLM (Xiao et al. 2023, arXiv:2309.17453): keep the first S tokens (attention sinks)
/// for ever and the most recent W tokens; older window tokens are evicted oldest first, their
/// slots reused as a ring. Memory is constant once S + W tokens have arrived.
template <int S, int W>
struct SinkWindow {
  static_assert(S >= 0 && W >= 1, "kvpack::SinkWindow<S, W>: need S >= 0 sinks and a window W >= 1");
  using kvpack_role = role::eviction;
  static constexpr bool evicts = true;
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

/// H2O heavy-hitter oracle (Zhang et al. 2023, arXiv:2306.14048): keep S sinks, the Recent most
/// recent tokens and the Heavy tokens with the largest cumulative attention mass among the rest.
/// Mass is gathered from the attention kernel as it runs (AttendArgs::key_mass), summed over
/// steps, queries and the KV head's query heads; ties evict the oldest token. A newcomer is
/// always kept while it is among the Recent most recent tokens.
template <int Heavy, int Recent, int S = 0>
struct H2O {
  static_assert(Heavy >= 0 && Recent >= 1 && S >= 0, "kvpack::H2O<Heavy, Recent, S>: need Heavy >= 0, Recent >= 1, S >= 0");
  using kvpack_role = role::eviction;
  static constexpr bool evicts = true;
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

/// How SnapKV aggregates the scores of the query heads that share one KV head (GQA).
enum class GroupAggregate { mean, max };

/// SnapKV (Li et al. 2024, arXiv:2404.14469): when decoding starts (the first single-token
/// append after a prompt longer than Budget + Window, or an explicit compress_prompt()), every
/// prompt token outside the observation window is scored by the attention it receives from the
/// last Window prompt queries (summed over those queries), smoothed by 1-D max pooling of width
/// Kernel, and the top Budget per KV head are kept together with the window; ties prefer the
/// larger raw score, then the older token. Decoding then appends without further eviction.
/// Defaults follow the paper: Window 32, Kernel 5. GQA: per KV head, the per-query-head scores
/// are aggregated by Agg (mean by default). Choosing Kernel: the window's queries tend to attend
/// to the start of a span they will need (e.g. the first digits of a number that is spelled one
/// token per digit); pooling is what keeps the rest of the span. On SmolLM2-135M with a 5-digit
/// pass key (6 tokens) at 25 % of a 4096-token prompt, Kernel 5 lost the 4th digit at every depth
/// (0/3 needles) and Kernel 9 kept 3/3 at no perplexity cost (examples/RESULTS-snapkv-needle.md):
/// widen it for longer spans.
template <int Budget, int Window = 32, int Kernel = 5, GroupAggregate Agg = GroupAggregate::mean>
struct SnapKV {
  static_assert(Budget >= 1 && Window >= 1 && Kernel >= 1 && Kernel % 2 == 1,
                "kvpack::SnapKV<Budget, Window, Kernel>: need Budget >= 1, Window >= 1 and an odd Kernel");
  using kvpack_role = role::eviction;
  static constexpr bool evicts = true;
  static constexpr int sink_tokens = 0;
  static constexpr int budget = Budget + Window;
  static constexpr int window = Window;
  static constexpr int kernel = Kernel;
  static constexpr GroupAggregate aggregate = Agg;
  /// Tokens per (layer, KV head) held right after compressing a prompt of `prompt` tokens (the
  /// window included): Budget + Window. Compression evicts only when this is below `prompt`.
  [[nodiscard]] static constexpr std::int64_t held_after_compression(std::int64_t /*prompt*/) noexcept { return budget; }
  /// The budget known before any prompt is seen (KVCache::eviction_budget()): Budget + Window.
  static constexpr std::int64_t fixed_budget = budget;
};

/// SnapKV sized by a total budget that includes the observation window. Budget is Tokens<N> (N
/// tokens per layer and KV head after compression) or Fraction<Num, Den> **of the prompt**: the
/// tokens the layer holds when compression runs (KVCache::compress_prompt, or the first decode
/// append). SnapKV compresses the prompt once, so the prompt is the context a fraction refers to
/// (not ModelShape::max_tokens). After compressing a prompt of P tokens each KV head holds
/// K = max(floor(P * Num / Den), Window) tokens (Tokens<N>: K = N): the Window observation-window
/// tokens plus the top K - Window scored prompt tokens (nothing is evicted when K >= P). So
/// SnapKVBudget<Tokens<1024>> equals SnapKV<992>, and SnapKVBudget<Fraction<1, 4>> keeps 512 of a
/// 2048-token prompt (32 window + 480 selected) and 1024 of a 4096-token one. Decoding then
/// appends without further eviction (the cache grows again, as SnapKV). Scoring, pooling, GQA
/// aggregation and tie rules as SnapKV.
/// Errors: Tokens<N> with N <= Window, a Budget that is no budget type, an even Kernel, or
/// Window < 1 fails to compile.
template <class Budget, int Window = 32, int Kernel = 5, GroupAggregate Agg = GroupAggregate::mean>
struct SnapKVBudget {
  static_assert(EvictionBudget<Budget>,
                "kvpack::SnapKVBudget<Budget, Window, Kernel>: Budget must be kvpack::Tokens<N> or "
                "kvpack::Fraction<Num, Den> (of the prompt)");
  static_assert(Window >= 1 && Kernel >= 1 && Kernel % 2 == 1,
                "kvpack::SnapKVBudget<Budget, Window, Kernel>: need Window >= 1 and an odd Kernel");
  static_assert(detail::fixed_budget_v<Budget> < 0 || detail::fixed_budget_v<Budget> > Window,
                "kvpack::SnapKVBudget<Tokens<N>, Window>: the budget N counts the observation window and must "
                "exceed Window");
  using kvpack_role = role::eviction;
  using budget_type = Budget;
  static constexpr bool evicts = true;
  static constexpr int sink_tokens = 0;
  static constexpr int window = Window;
  static constexpr int kernel = Kernel;
  static constexpr GroupAggregate aggregate = Agg;
  /// Tokens per (layer, KV head) held right after compressing a prompt of `prompt` tokens:
  /// max(Budget resolved against `prompt`, Window) (Tokens<N>: N).
  [[nodiscard]] static constexpr std::int64_t held_after_compression(std::int64_t prompt) noexcept {
    return std::max<std::int64_t>(detail::resolve_budget<Budget>(prompt), Window);
  }
  /// The budget known before any prompt is seen: N for Tokens<N>, 0 for a Fraction (resolved at
  /// compression; KVCache::eviction_budget() then reports it).
  static constexpr std::int64_t fixed_budget = std::max<std::int64_t>(detail::fixed_budget_v<Budget>, 0);
};

namespace detail {
template <class E>
inline constexpr bool is_sink_window_v = false;
template <int S, int W>
inline constexpr bool is_sink_window_v<SinkWindow<S, W>> = true;
template <class B, int S>
inline constexpr bool is_sink_window_v<SinkWindowBudget<B, S>> = true;
template <class E>
inline constexpr bool is_h2o_v = false;
template <int H, int R, int S>
inline constexpr bool is_h2o_v<H2O<H, R, S>> = true;
template <class B, int S>
inline constexpr bool is_h2o_v<H2OBudget<B, S>> = true;
template <class E>
inline constexpr bool is_snapkv_v = false;
template <int B, int W, int K, GroupAggregate A>
inline constexpr bool is_snapkv_v<SnapKV<B, W, K, A>> = true;
template <class B, int W, int K, GroupAggregate A>
inline constexpr bool is_snapkv_v<SnapKVBudget<B, W, K, A>> = true;
}  // namespace detail

}  // namespace kvpack
