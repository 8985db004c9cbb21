// kvpack-eval: one shard of the policy registry (see policy_dispatch.hpp). Compiled once per
// shard with KVPACK_EVAL_SHARD set to the shard's index (tools/CMakeLists.txt generates the
// wrappers); instantiates Evaluator::score and Evaluator::needle for the policies whose registry
// index is KVPACK_EVAL_SHARD modulo kPolicyShards.
#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>

#include "needle.hpp"
#include "policy_dispatch.hpp"
#include "scoring.hpp"

#ifndef KVPACK_EVAL_SHARD
#error "policy_shard.cpp is compiled once per shard with -DKVPACK_EVAL_SHARD=<index>"
#endif

namespace kvpack_eval {
namespace {

// f.template operator()<Cache>() for the policy `name` if its registry index falls in `Shard`.
// Only the shard's policies are instantiated (if constexpr), the others cost nothing here.
template <int Shard, class R, class F>
std::optional<R> run_in_shard(std::string_view name, F&& f) {
  std::optional<R> result;
  [&]<class... Ps>(kl::PolicyList<Ps...>) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      auto one = [&]<std::size_t Index, class P>() {
        if constexpr (Index % kPolicyShards == Shard && compiled_v<P>) {
          if (P::name == name) {
            result.emplace(f.template operator()<typename P::cache>());
            return true;
          }
        }
        return false;
      };
      (void)(one.template operator()<I, Ps>() || ...);
    }(std::index_sequence_for<Ps...>{});
  }(kl::Registry{});
  return result;
}

}  // namespace

template <int Shard>
std::optional<kvpack::Status> score_in_shard(Evaluator& ev, const std::string& name, PolicyStats& st, const Window& w,
                                             bool baseline, bool first_window, Progress& prog, KvDump* dump) {
  return run_in_shard<Shard, kvpack::Status>(
      name, [&]<class Cache>() { return ev.score<Cache>(st, w, baseline, first_window, prog, dump); });
}

template <int Shard>
std::optional<kvpack::Result<NeedleResult>> needle_in_shard(const Evaluator& ev, const std::string& name,
                                                            const std::vector<int32_t>& prompt,
                                                            const std::vector<int32_t>& answer, int64_t context,
                                                            Progress& prog, const std::string& label) {
  return run_in_shard<Shard, kvpack::Result<NeedleResult>>(
      name, [&]<class Cache>() { return ev.needle<Cache>(prompt, answer, context, prog, label); });
}

template std::optional<kvpack::Status> score_in_shard<KVPACK_EVAL_SHARD>(Evaluator&, const std::string&, PolicyStats&,
                                                                         const Window&, bool, bool, Progress&, KvDump*);
template std::optional<kvpack::Result<NeedleResult>> needle_in_shard<KVPACK_EVAL_SHARD>(
    const Evaluator&, const std::string&, const std::vector<int32_t>&, const std::vector<int32_t>&, int64_t, Progress&,
    const std::string&);

}  // namespace kvpack_eval
