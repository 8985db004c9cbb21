// kvpack-eval: score_policy / needle_policy, which ask each shard of the registry in turn.
#include "policy_dispatch.hpp"

#include <algorithm>
#include <utility>

namespace kvpack_eval {
namespace {

static_assert(kPolicyShards == 4, "policy_dispatch.cpp asks shards 0..3: list every shard below");

template <class R>
R unknown(const std::string& name) {
  if (auto s = require_compiled(name); !s) return R(s.error());
  return R(kvpack::fail(kvpack::Errc::invalid_argument, "unknown policy " + name));
}

}  // namespace

kvpack::Status require_compiled(const std::string& name) {
  const auto compiled = kl::policy_names(!kAllPolicies);
  if (!kl::has_policy(name) || std::find(compiled.begin(), compiled.end(), name) != compiled.end()) return {};
  return kvpack::fail(kvpack::Errc::invalid_argument,
                      "policy '" + name + "' is not compiled into this kvpack-eval (configured with "
                      "-DKVPACK_EVAL_POLICIES=defaults); reconfigure with -DKVPACK_EVAL_POLICIES=all");
}

kvpack::Status score_policy(Evaluator& ev, const std::string& name, PolicyStats& st, const Window& w, bool baseline,
                            bool first_window, Progress& prog, KvDump* dump) {
  for (auto* shard : {&score_in_shard<0>, &score_in_shard<1>, &score_in_shard<2>, &score_in_shard<3>})
    if (auto r = shard(ev, name, st, w, baseline, first_window, prog, dump)) return std::move(*r);
  return unknown<kvpack::Status>(name);
}

kvpack::Result<NeedleResult> needle_policy(const Evaluator& ev, const std::string& name,
                                           const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                                           int64_t context, Progress& prog, const std::string& label) {
  for (auto* shard : {&needle_in_shard<0>, &needle_in_shard<1>, &needle_in_shard<2>, &needle_in_shard<3>})
    if (auto r = shard(ev, name, prompt, answer, context, prog, label)) return std::move(*r);
  return unknown<kvpack::Result<NeedleResult>>(name);
}

}  // namespace kvpack_eval
