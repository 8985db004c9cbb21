// The two eviction protocols (issue 24): what an eviction policy does at the end of the prompt
// and afterwards. Tags only; eviction/protocol.hpp applies them to a policy.
#pragma once

namespace kvpack {

/// Prompt compression (SnapKV's protocol): nothing is evicted while the prompt is prefilled; at
/// the end of the prompt the policy keeps its budget (a fraction of the prompt, or N tokens) and
/// the cache then grows again: every decoded token is kept.
struct PromptOnce {
  static constexpr const char* name = "prompt-once";
};

/// Fixed budget: as PromptOnce up to the end of the prompt, then the policy holds that budget
/// through decoding, evicting (by its own rule) as tokens arrive.
struct FixedBudget {
  static constexpr const char* name = "fixed-budget";
};

namespace detail {
template <class T>
inline constexpr bool is_protocol_v = false;
template <>
inline constexpr bool is_protocol_v<PromptOnce> = true;
template <>
inline constexpr bool is_protocol_v<FixedBudget> = true;
}  // namespace detail

}  // namespace kvpack
