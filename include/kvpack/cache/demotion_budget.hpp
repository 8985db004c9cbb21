// Budgets of a Demote<> low tier (issue 24: "budgets may then be given in bytes"): how many
// demoted rows each (layer, KV head) keeps before the oldest demoted row is deleted.
//
//   Demote<Keys<Int2<>>, Values<Int2<>>>                         no cap (every dropped token kept low)
//   Demote<Keys<Int2<>>, Values<Int2<>>, Fraction<1, 4>>         at most max_tokens / 4 low rows
//   Demote<Keys<Int2<>>, Values<Int2<>>, Tokens<256>>            at most 256 low rows
//   Demote<Keys<Int2<>>, Values<Int2<>>, Fp16Share<1, 8>>        both tiers within 1/8 of the bytes
//                                                                of an fp16 cache of max_tokens
//
// Fp16Share<Num, Den> is a byte budget per (layer, KV head): Num/Den of max_tokens * head_dim * 2
// (K and V) * 2 bytes. The high tier's eviction budget (in tokens, as the policy resolved it when it
// evicts: a Fraction of the prompt under Protocol<>, of max_tokens otherwise) takes its share at
// the high tier's bytes per token; the low tier keeps what is left at its own bytes per token:
//     cap = floor((budget - high_tokens * high_cost) / low_cost)
//     high_cost = codes + metadata + position of one token, + 8 bytes of slot bookkeeping
//                 (cache index and score), + (block header + valid mask) / B
//     low_cost  = codes + metadata + position + 4 bytes of cache index, + block header / B
// (the bytes KVCache::memory_bytes counts for them). Sinks, pending rows and the latest chunk stay
// outside (fp32 rows the policy keeps by its own rule). A budget the high tier alone exceeds leaves
// no low rows (cap 0: demotion becomes deletion), which kvpack-eval's kv_bytes then shows.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kvpack/cache/block.hpp"
#include "kvpack/eviction/budget.hpp"

namespace kvpack {

/// Demote<>'s default low-tier budget: no cap.
struct Unbounded {};

/// A byte budget for both tiers of a Demote<> cache, per (layer, KV head): Num/Den of the bytes an
/// fp16 cache of ModelShape::max_tokens tokens would hold (max_tokens * head_dim * 2 * 2 bytes).
template <int Num, int Den>
struct Fp16Share {
  static_assert(Num >= 1 && Den >= 1 && Num <= Den, "kvpack::Fp16Share<Num, Den>: need 1 <= Num <= Den");
  static constexpr int num = Num, den = Den;
};

namespace detail {
template <class T>
inline constexpr bool is_fp16_share_v = false;
template <int N, int D>
inline constexpr bool is_fp16_share_v<Fp16Share<N, D>> = true;
}  // namespace detail

/// A low-tier budget: Unbounded, Tokens<N>, Fraction<Num, Den> (of max_tokens) or Fp16Share<Num, Den>.
template <class T>
concept LowTierBudget = std::is_same_v<T, Unbounded> || EvictionBudget<T> || detail::is_fp16_share_v<T>;

/// Resolved low-tier budget of one cache shape: a fixed cap, or the byte terms of Fp16Share.
struct LowTierCap {
  std::int64_t fixed = -1;     ///< rows per (layer, KV head); -1: none or byte-resolved
  double budget_bytes = -1;    ///< Fp16Share: bytes per (layer, KV head); -1: not a byte budget
  double high_cost = 0, low_cost = 0;  ///< bytes per token of each tier (file comment)

  /// The cap for a high tier holding `high_tokens` per (layer, KV head) (byte budgets), else `fixed`.
  [[nodiscard]] std::int64_t for_high(std::int64_t high_tokens) const noexcept {
    if (budget_bytes < 0) return fixed;
    const double left = budget_bytes - static_cast<double>(high_tokens) * high_cost;
    return left <= 0 ? 0 : static_cast<std::int64_t>(left / low_cost);
  }
};

/// Resolves Budget for a cache of `max_tokens` tokens per layer, head_dim `D`, whose high blocks
/// have layout `high` and low blocks `low`.
template <LowTierBudget Budget>
[[nodiscard]] LowTierCap resolve_low_cap(std::int64_t max_tokens, int D, const BlockLayout& high, const BlockLayout& low) {
  LowTierCap c;
  if constexpr (EvictionBudget<Budget>) {
    c.fixed = Budget::resolve(max_tokens);
  } else if constexpr (detail::is_fp16_share_v<Budget>) {
    c.budget_bytes = static_cast<double>(max_tokens) * D * 2 * 2 * Budget::num / Budget::den;
    const double words = static_cast<double>((high.tokens + 63) / 64) * 8;
    c.high_cost = static_cast<double>(high.used_bytes(1)) + 8 + (sizeof(BlockHeader) + words) / high.tokens;
    c.low_cost = static_cast<double>(low.used_bytes(1)) + 4 + static_cast<double>(sizeof(BlockHeader)) / low.tokens;
  }
  return c;
}

}  // namespace kvpack
