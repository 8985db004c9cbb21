// Protocol<Policy, PromptOnce | FixedBudget>: runs an eviction policy under one of the two
// protocols of issue 24 at the same token budget, a budget resolved against the prompt.
//
//   KVCache<Keys<Int4<>>, Values<Int4<>>, Protocol<H2OBudget<Fraction<1, 2>>, FixedBudget>>
//
// Both protocols keep every token while the prompt is prefilled (H2O and BlockSparse gather the
// attention mass of every prefill attend meanwhile), and end the prompt on the first single-token
// append or on KVCache::compress_prompt(layer), whichever comes first. Then the policy resolves its
// budget against the prompt (a Fraction<Num, Den> is of the prompt's tokens, not of
// ModelShape::max_tokens) and evicts down to it with its own rule; PromptOnce lets the cache grow
// afterwards, FixedBudget holds the budget through decoding.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kvpack/eviction/hook.hpp"
#include "kvpack/eviction/protocol_tags.hpp"
#include "kvpack/eviction/snapkv.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

namespace eviction {

namespace protocol_detail {
// Whether policy P compresses a prompt natively (SnapKV, SnapKVBudget).
template <class P>
inline constexpr bool compresses_prompt_v = requires { P::held_after_compression(std::int64_t{0}); };
// Whether P's budget is a fraction (resolved at the end of the prompt, unknown at create()).
template <class P>
[[nodiscard]] constexpr bool fraction_budget() noexcept {
  if constexpr (requires { P::budget_type::is_fraction; }) return P::budget_type::is_fraction;
  else return false;
}
// P's budget for a prompt of `prompt` tokens, never below what P protects (sinks plus a
// one-token recent window; BlockSparse: its sink, recent and open blocks).
template <class P>
[[nodiscard]] constexpr std::int64_t prompt_budget(std::int64_t prompt) noexcept {
  std::int64_t b = 0, floor = 1;
  if constexpr (requires { P::resolve_budget(prompt); }) b = P::resolve_budget(prompt);
  else b = P::budget_type::resolve(prompt);
  if constexpr (requires { P::min_budget; }) floor = P::min_budget;
  else if constexpr (requires { P::protected_tokens; }) floor = P::protected_tokens;
  return std::max(b, floor);
}
}  // namespace protocol_detail

/// The hook of Protocol<P, Proto> for a policy that evicts continuously (SinkWindow, H2O,
/// BlockSparse, TOVA and their Budget forms): P's own hook, whose eviction waits for the end of the
/// prompt and (PromptOnce) stops after it. Per layer: whether its prompt has ended.
template <class P, class Proto>
class PromptProtocolHook : public P::hook {
  using Base = typename P::hook;

 public:
  static constexpr bool fixed = std::is_same_v<Proto, FixedBudget>;
  static constexpr bool evicts_continuously = fixed;

  /// A Tokens<N> budget is checked as P checks it; a fraction of the prompt cannot be checked
  /// before the prompt (it is raised to what P protects when the prompt ends).
  [[nodiscard]] static Status check(const ModelShape& shape) {
    if constexpr (protocol_detail::fraction_budget<P>()) return (void)shape, Status{};
    else return Base::check(shape);
  }
  void init(const ModelShape& shape) {
    Base::init(shape);
    ended_.assign(static_cast<std::size_t>(shape.layers), 0);
    resolved_ = !protocol_detail::fraction_budget<P>();
  }
  void reset() {
    Base::reset();
    std::fill(ended_.begin(), ended_.end(), 0);
    resolved_ = !protocol_detail::fraction_budget<P>();
  }
  /// The budget in tokens per (layer, KV head) resolved at the latest end of a prompt; before
  /// any prompt ended, P's Tokens<N> figure, or 0 for a fraction.
  [[nodiscard]] std::int64_t budget() const noexcept { return resolved_ ? Base::budget() : 0; }
  /// While the prompt lasts, and after it under PromptOnce, every token stays; under FixedBudget
  /// after the prompt, P's bound.
  template <class St>
  [[nodiscard]] std::int64_t held_after(const St& st, int li, std::int64_t n) const noexcept {
    if (fixed && ended(li)) return Base::held_after(st, li, n);
    return st.held(st.layer(li)) + n;
  }
  /// The first single-token append ends the prompt.
  template <class St>
  [[nodiscard]] Status before_append(St& st, Workspace& ws, int li, std::int64_t n) {
    if (!ended(li) && n == 1) end_prompt(st, li);
    return Base::before_append(st, ws, li, n);
  }
  /// KVCache::compress_prompt: ends the prompt of layer li now. Errc::invalid_argument when it
  /// has already ended.
  template <class St>
  [[nodiscard]] Status compress_prompt(St& st, Workspace&, int li) {
    if (ended(li))
      return fail(Errc::invalid_argument, "compress_prompt: layer " + std::to_string(li) + " has already ended its prompt");
    end_prompt(st, li);
    return {};
  }
  /// P's eviction, only after the prompt ended and (PromptOnce) only at its end.
  template <class St>
  void enforce(St& st, int li, int h, std::int64_t pend) {
    if (fixed && ended(li)) Base::enforce(st, li, h, pend);
  }
  /// Whether layer li's prompt has ended.
  [[nodiscard]] bool ended(int li) const noexcept { return ended_[static_cast<std::size_t>(li)] != 0; }

 private:
  // Commits the prompt (no eviction: the layer has not ended), resolves the budget against the
  // prompt's tokens, and evicts every KV head down to it with P's rule.
  template <class St>
  void end_prompt(St& st, int li) {
    auto& L = st.layer(li);
    st.commit(li, *this);
    this->set_budget(protocol_detail::prompt_budget<P>(L.total));
    resolved_ = true;
    ended_[static_cast<std::size_t>(li)] = 1;
    for (int h = 0; h < static_cast<int>(L.heads.size()); ++h) Base::enforce(st, li, h, L.pend.size());
  }

  std::vector<char> ended_;  // [layer]: the prompt has ended
  bool resolved_ = false;    // budget() is known
};

template <class P, class Proto>
struct protocol_hook {
  using type = PromptProtocolHook<P, Proto>;
};
template <class P, class Proto>
  requires protocol_detail::compresses_prompt_v<P>
struct protocol_hook<P, Proto> {
  using type = SnapKVHook<P, Proto>;
};

}  // namespace eviction

/// Runs eviction policy P under protocol Proto (PromptOnce or FixedBudget,
/// eviction/protocol_tags.hpp) with its budget resolved against the prompt:
///  * P: SinkWindow, SinkWindowBudget, H2O, H2OBudget, TOVA, BlockSparse (evicting as tokens
///    arrive) or SnapKV, SnapKVBudget (compressing the prompt). A Fraction<Num, Den> budget is a
///    fraction of the prompt's tokens (floor(prompt x Num / Den), raised to what P protects: its
///    sinks and one recent token; BlockSparse's sink, recent and open blocks); Tokens<N> and the
///    integer forms are N tokens per (layer, KV head).
///  * During the prompt nothing is evicted (the cache's max_tokens must hold the prompt); H2O,
///    TOVA and BlockSparse gather the mass of every prefill attend as scores, SnapKV remembers its
///    observation window.
///  * The prompt ends on the first single-token append or KVCache::compress_prompt(layer): the
///    layer evicts down to the budget with P's rule (SinkWindow: sinks + newest; H2O: sinks,
///    recent and the largest cumulative prefill mass; BlockSparse: lowest-mass blocks; SnapKV: its
///    observation-window selection).
///  * PromptOnce: the cache then grows (every decoded token kept). FixedBudget: the budget holds
///    through decoding, P evicting as tokens arrive (SnapKV: lowest SnapKV score plus decode mass
///    outside the newest Window tokens).
/// Budgets are per (layer, KV head); eviction_budget() is 0 for a fraction until a prompt ended.
/// Errors: P not an eviction policy or Proto not a protocol fails to compile.
template <class P, class Proto = PromptOnce>
struct Protocol {
  static_assert(std::is_same_v<typename P::kvpack_role, role::eviction> && P::evicts,
                "kvpack::Protocol<P, Proto>: P must be an evicting policy (SinkWindow, H2O, SnapKV, BlockSparse, ... "
                "or their Budget forms)");
  static_assert(kvpack::detail::is_protocol_v<Proto>, "kvpack::Protocol<P, Proto>: Proto must be kvpack::PromptOnce or kvpack::FixedBudget");
  using kvpack_role = role::eviction;
  using policy = P;
  using protocol = Proto;
  static constexpr bool evicts = true;
  using hook = typename eviction::protocol_hook<P, Proto>::type;
  static constexpr int sink_tokens = P::sink_tokens;
};

}  // namespace kvpack
