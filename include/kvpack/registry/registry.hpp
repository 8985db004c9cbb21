// The runtime registry: a cache or a page pool of a policy chosen by NAME at run time.
//
//   auto pool = kvpack::registry::make_pool("int8", {.shape = shape, .byte_budget = 64 << 20,
//                                                    .max_sequences = 16});
//   auto q = kvpack::registry::make_pool("q8_0/q4_0", cfg);   // llama.cpp --cache-type-k/-v names
//   auto solo = (*pool)->make_single(shape);   // a single-sequence KVCache of the same policy
//
// A name is an entry of the policy table (policy_table.hpp: "fp32", "fp16", "int8", "int4-g32",
// "int4-g64", "k8v4", "kivi4", "fp8-e4m3", "sink-window-50", ...) or llama.cpp cache type names
// (llama_cpp_types.hpp: "f16", "q8_0", "q4_0", "q4_1", or "K/V" such as "q8_0/q4_0").
// make_pool instantiates every pool-capable policy (about 38 PagedCache types: 15 without eviction,
// 23 with SinkWindow / H2O / SnapKV / BlockSparse; each with its single-sequence twin for make_single) in the
// translation unit that calls it: call it from one TU (about 75 s of CPU with g++ 12 -O2, 41 s
// without the evicting ones), or link the CMake target kvpack::registry, which compiles it once
// (src/registry/make_pool.cpp) for every program that links it. A single-sequence cache of any policy
// (keyframes included) is chosen by type (KVCache<...>), or by name through
// with_policy_set and erase_cache (any_cache.hpp). Nothing throws of its own; std::bad_alloc from an
// allocation can propagate (the C ABI catches it).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvpack/pool/paged_cache.hpp"
#include "kvpack/registry/any_cache.hpp"
#include "kvpack/registry/any_pool.hpp"
#include "kvpack/registry/llama_cpp_types.hpp"
#include "kvpack/registry/policy_table.hpp"

namespace kvpack::registry {

/// What the registry knows about one name.
struct PolicyInfo {
  std::string name;
  bool in_defaults = false;   ///< run by kvpack-eval when no --policies are given
  bool pool_capable = false;  ///< make_pool accepts it (no Demote<>, offload, keyframe codec, PreRope<> with eviction or CacheRelative)
  double key_bits = 0, value_bits = 0;  ///< stored bits per element (codec metadata included)
  bool evicts = false;  ///< an eviction policy: attends update its scores, truncate is Errc::unsupported
};

/// Calls f.template operator()<Set>() with the PolicySet named `name` (a table entry, or
/// llama.cpp type names) and returns true; false for an unknown name (f not called).
template <class F>
bool with_policy_set(std::string_view name, F&& f) {
  bool found = false;
  [&]<class... Es>(EntryList<Es...>) {
    (void)((Es::name == name ? (f.template operator()<typename Es::set>(), found = true) : false) || ...);
  }(Table{});
  if (found) return true;
  const KvTypeNames kv = split_kv_name(name);
  return with_llama_cpp_types(kv.k, kv.v, f);
}

/// Every table entry, in table order, then the llama.cpp type names usable alone (each for both
/// roles; "K/V" pairs are listed by llama_cpp_pair_names()).
[[nodiscard]] inline std::vector<PolicyInfo> policies() {
  std::vector<PolicyInfo> out;
  auto info = []<class Set>(std::string_view name, bool defaults) {
    using C = apply_t<KVCache, Set>;
    return PolicyInfo{std::string(name), defaults, pool_capable_v<Set>, C::key_bits_per_value, C::value_bits_per_value,
                      C::evicts};
  };
  [&]<class... Es>(EntryList<Es...>) {
    (..., out.push_back(info.template operator()<typename Es::set>(Es::name, Es::in_defaults)));
  }(Table{});
  [&]<class... Ts>(LlamaCppTypeList<Ts...>) {
    (..., out.push_back(info.template operator()<PolicySet<Keys<typename Ts::codec>, Values<typename Ts::codec>>>(Ts::name, false)));
  }(LlamaCppTypes{});
  return out;
}

/// Whether `name` names a policy (table entry or llama.cpp type names).
[[nodiscard]] inline bool has_policy(std::string_view name) {
  return with_policy_set(name, []<class>() {});
}

/// The llama.cpp "K/V" pairs make_pool accepts, e.g. "q8_0/q4_0".
[[nodiscard]] inline std::vector<std::string> llama_cpp_pair_names() {
  std::vector<std::string> out;
  [&]<class... Ps>(LlamaCppPairList<Ps...>) {
    (..., out.push_back(std::string(Ps::key::name) + "/" + std::string(Ps::value::name)));
  }(LlamaCppPairs{});
  return out;
}

namespace detail {
inline Error unknown_name(std::string_view name) {
  const KvTypeNames kv = split_kv_name(name);
  if (is_llama_cpp_type(kv.k) && is_llama_cpp_type(kv.v)) {
    std::string pairs;
    for (const std::string& p : llama_cpp_pair_names()) pairs += (pairs.empty() ? "" : ", ") + p;
    return fail(Errc::unsupported, "kvpack registry: llama.cpp key/value pair '" + std::string(name) +
                                       "' is not compiled in (pairs: " + pairs + ")");
  }
  for (const std::string_view part : {kv.k, kv.v})
    for (const std::string_view u : llama_cpp_unmatched)
      if (part == u)
        return fail(Errc::unsupported, "kvpack registry: llama.cpp cache type '" + std::string(u) +
                                           "' has no matching kvpack codec (supported: f32, f16, q8_0, q4_0, q4_1)");
  std::string known;
  for (const PolicyInfo& p : policies()) known += (known.empty() ? "" : ", ") + p.name;
  return fail(Errc::invalid_argument, "kvpack registry: unknown policy '" + std::string(name) + "' (known: " + known +
                                          "; or llama.cpp types K/V such as q8_0/q4_0)");
}
}  // namespace detail

/// A page pool (PagedCache) of the named policy, behind AnyPool.
/// Errors: unknown name (Errc::invalid_argument), a policy the pool does not support yet
/// (Demote<>, offload, keyframe codecs: Errc::unsupported, naming it), a llama.cpp type without
/// a kvpack codec (Errc::unsupported), errors of PagedCache::create (bad shape, budget below one
/// page, max_sequences < 1: invalid_argument; arena allocation: capacity_exceeded).
/// Compiled once: where KVPACK_REGISTRY_COMPILED is defined, this header only declares make_pool,
/// and one translation unit that also defines KVPACK_REGISTRY_IMPLEMENTATION before including it
/// holds every pool type (kvpack's build: the CMake target kvpack::registry, src/registry/, which
/// defines KVPACK_REGISTRY_COMPILED for whatever links it). Compile that unit with the same
/// instruction-set flags as its callers, so each kernel has one definition per program.
#if defined(KVPACK_REGISTRY_COMPILED) && !defined(KVPACK_REGISTRY_IMPLEMENTATION)
[[nodiscard]] Result<std::unique_ptr<AnyPool>> make_pool(std::string_view name, const PoolConfig& cfg);
#else
#if defined(KVPACK_REGISTRY_IMPLEMENTATION)
#define KVPACK_REGISTRY_LINKAGE
#else
#define KVPACK_REGISTRY_LINKAGE inline
#endif
[[nodiscard]] KVPACK_REGISTRY_LINKAGE Result<std::unique_ptr<AnyPool>> make_pool(std::string_view name, const PoolConfig& cfg) {
  Result<std::unique_ptr<AnyPool>> r = fail(Errc::invalid_argument, "");
  const bool found = with_policy_set(name, [&]<class Set>() {
    if constexpr (pool_capable_v<Set>) {
      auto p = apply_t<PagedCache, Set>::create(cfg);
      if (!p) {
        r = p.error();
      } else {
        [&]<class... Ps>(PolicySet<Ps...>) {
          r = std::unique_ptr<AnyPool>(std::make_unique<PoolAdapter<Ps...>>(std::move(p.value()), std::string(name)));
        }(Set{});
      }
    } else {
      r = fail(Errc::unsupported, "kvpack registry: policy '" + std::string(name) +
                                      "' uses demotion, offload, a keyframe codec or PreRope<> with eviction or "
                                      "CacheRelative, which the page pool does not support yet; "
                                      "use KVCache<...> for a single sequence");
    }
  });
  if (!found) return detail::unknown_name(name);
  return r;
}
#undef KVPACK_REGISTRY_LINKAGE
#endif

}  // namespace kvpack::registry
