// Eviction budgets: how many tokens an evicting cache may hold, per layer and KV head (the same
// for every layer), given as a token count or as a fraction of the cache's context.
#pragma once

#include <cstdint>
#include <type_traits>

namespace kvpack {

/// A budget of exactly N tokens (N >= 1), whatever the context length.
template <std::int64_t N>
struct Tokens {
  static_assert(N >= 1, "kvpack::Tokens<N>: a budget needs N >= 1 tokens");
  static constexpr bool is_fraction = false;
  /// The budget in tokens for a cache of `max_tokens` tokens per layer: N (max_tokens unused).
  [[nodiscard]] static constexpr std::int64_t resolve(std::int64_t /*max_tokens*/) noexcept { return N; }
};

/// A budget of Num/Den of the context, resolved when the cache is created:
/// floor(ModelShape::max_tokens * Num / Den) tokens (at least 1). "Context" is the capacity the
/// engine declares in ModelShape::max_tokens, so create the cache with max_tokens = the context
/// length the fraction should refer to (e.g. 4096 and Fraction<1, 4> hold 1024 tokens).
template <int Num, int Den>
struct Fraction {
  static_assert(Num >= 1 && Den >= 1 && Num <= Den, "kvpack::Fraction<Num, Den>: need 1 <= Num <= Den");
  static constexpr bool is_fraction = true;
  /// floor(max_tokens * Num / Den), at least 1 (max_tokens <= 2^31 - 1, so no overflow).
  [[nodiscard]] static constexpr std::int64_t resolve(std::int64_t max_tokens) noexcept {
    const std::int64_t b = max_tokens * Num / Den;
    return b < 1 ? 1 : b;
  }
};

namespace detail {
template <class T>
inline constexpr bool is_budget_v = false;
template <std::int64_t N>
inline constexpr bool is_budget_v<Tokens<N>> = true;
template <int N, int D>
inline constexpr bool is_budget_v<Fraction<N, D>> = true;
}  // namespace detail

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


/// A budget type: Tokens<N> or Fraction<Num, Den>.
template <class T>
concept EvictionBudget = detail::is_budget_v<T>;

}  // namespace kvpack
