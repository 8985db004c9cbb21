// kvpack-eval: running a policy chosen by name. Every registered policy (tools/llama/policies.hpp)
// instantiates the whole model runner for its cache type, so the instantiations are spread over
// kPolicyShards translation units (policy_shard.cpp, compiled once per shard) that compile in
// parallel, instead of one translation unit of every policy (over 10 minutes of one core at -O3).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "evaluator.hpp"

namespace kvpack_eval {

/// Translation units the registry's policies are spread over (policy i goes to shard i % N).
inline constexpr int kPolicyShards = 4;

#ifndef KVPACK_EVAL_ALL_POLICIES
#define KVPACK_EVAL_ALL_POLICIES 1
#endif
/// Whether this build compiled every registered policy (CMake KVPACK_EVAL_POLICIES=all, the
/// default) or only those run by default (=defaults, tools/CMakeLists.txt says why).
inline constexpr bool kAllPolicies = KVPACK_EVAL_ALL_POLICIES != 0;

/// Whether registry entry P (kvpack::llama::Policy) is compiled into this build.
template <class P>
inline constexpr bool compiled_v = kAllPolicies || P::in_defaults;

/// Errc::invalid_argument, saying how to reconfigure, when `name` is registered but not compiled
/// into this build (KVPACK_EVAL_POLICIES=defaults); success otherwise, unknown names included.
kvpack::Status require_compiled(const std::string& name);

/// Evaluator::score<Cache> (scoring.hpp) with the cache type registered under `name`.
/// Errors: an unknown name is Errc::invalid_argument; otherwise score's own.
kvpack::Status score_policy(Evaluator& ev, const std::string& name, PolicyStats& st, const Window& w, bool baseline,
                            bool first_window, Progress& prog, KvDump* dump);

/// Evaluator::needle<Cache> (needle.hpp) with the cache type registered under `name`.
/// Errors: an unknown name is Errc::invalid_argument; otherwise needle's own.
kvpack::Result<NeedleResult> needle_policy(const Evaluator& ev, const std::string& name,
                                           const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                                           int64_t context, Progress& prog, const std::string& label);

/// One shard's part of score_policy / needle_policy: std::nullopt when `name` is not in shard
/// `Shard`. Defined and explicitly instantiated in policy_shard.cpp.
template <int Shard>
std::optional<kvpack::Status> score_in_shard(Evaluator& ev, const std::string& name, PolicyStats& st, const Window& w,
                                             bool baseline, bool first_window, Progress& prog, KvDump* dump);
template <int Shard>
std::optional<kvpack::Result<NeedleResult>> needle_in_shard(const Evaluator& ev, const std::string& name,
                                                            const std::vector<int32_t>& prompt,
                                                            const std::vector<int32_t>& answer, int64_t context,
                                                            Progress& prog, const std::string& label);

}  // namespace kvpack_eval
