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

#include "kvpack/policy.hpp"

namespace kvpack {

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
/// are aggregated by Agg (mean by default).
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
};

namespace detail {
template <class E>
inline constexpr bool is_sink_window_v = false;
template <int S, int W>
inline constexpr bool is_sink_window_v<SinkWindow<S, W>> = true;
template <class E>
inline constexpr bool is_h2o_v = false;
template <int H, int R, int S>
inline constexpr bool is_h2o_v<H2O<H, R, S>> = true;
template <class E>
inline constexpr bool is_snapkv_v = false;
template <int B, int W, int K, GroupAggregate A>
inline constexpr bool is_snapkv_v<SnapKV<B, W, K, A>> = true;
}  // namespace detail

}  // namespace kvpack
