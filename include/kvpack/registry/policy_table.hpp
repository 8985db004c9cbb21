// The named policies of kvpack: a compile-time table of (name, policy set) pairs used by the
// runtime registry (registry.hpp) and the C ABI (c/kvpack.h). The names and types are those of
// kvpack-eval's list (tools/llama/policies.hpp, which still keeps its own copy plus tool-only
// entries: offload, reference, zero-v). Adding a policy is one line here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "kvpack/kv_cache.hpp"

namespace kvpack::registry {

/// A string usable as a template argument (a policy's name).
template <std::size_t N>
struct FixedName {
  char text[N]{};
  constexpr FixedName(const char (&s)[N]) { std::copy_n(s, N, text); }  // NOLINT: implicit by design
  [[nodiscard]] constexpr std::string_view view() const { return {text, N - 1}; }
};

/// A list of policies (the arguments of KVCache<...> / PagedCache<...>).
template <class... Policies>
struct PolicySet {};

/// `Tmpl<Policies...>` for PolicySet<Policies...>: apply_t<KVCache, Set>, apply_t<PagedCache, Set>.
template <template <class...> class Tmpl, class Set>
struct apply;
template <template <class...> class Tmpl, class... Policies>
struct apply<Tmpl, PolicySet<Policies...>> {
  using type = Tmpl<Policies...>;
};
template <template <class...> class Tmpl, class Set>
using apply_t = typename apply<Tmpl, Set>::type;

/// Whether PagedCache accepts the set: no offload, no keyframe codec, no Demote<>, PreRope<> only
/// as OriginalPositions without eviction (every eviction policy is accepted otherwise: SinkWindow,
/// H2O, SnapKV, TOVA, BlockSparse): the pool's static_asserts (pool/paged_cache.hpp,
/// pool/paged_eviction.hpp), checked without instantiating it.
template <class Set>
inline constexpr bool pool_capable_v = [] {
  using C = apply_t<KVCache, Set>;
  return !C::demotes && !C::offloads && !C::codec_hook::interval_blocks &&
         !(C::pre_rope && (C::evicts || C::rope_cache_relative));
}();

/// One table entry: `Name` selects `Set`; `Default` entries are what kvpack-eval runs when no
/// --policies are given.
template <FixedName Name, class Set, bool Default = true>
struct Entry {
  static constexpr std::string_view name = Name.view();
  static constexpr bool in_defaults = Default;
  using set = Set;
};

template <class... Entries>
struct EntryList {};

/// Concatenation of two EntryLists (a tool appends its own entries to the library's).
template <class A, class B>
struct concat;
template <class... A, class... B>
struct concat<EntryList<A...>, EntryList<B...>> {
  using type = EntryList<A..., B...>;
};

using G32I4 = Int4<Group<32>>;

/// Every named policy. Names are kvpack-eval's (docs/kvpack-eval.md, results in docs/).
/// Eviction budgets given as Fraction<> resolve against ModelShape::max_tokens (SnapKV: against
/// the prompt), DESIGN.md "Eviction".
using Table = EntryList<
    Entry<"fp32", PolicySet<Keys<Fp32>, Values<Fp32>>>,
    Entry<"fp16", PolicySet<Keys<Fp16>, Values<Fp16>>>,
    Entry<"int8", PolicySet<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>>>,
    Entry<"int4-g32", PolicySet<Keys<G32I4>, Values<G32I4>>>,
    Entry<"int4-g64", PolicySet<Keys<Int4<Group<64>>>, Values<Int4<Group<64>>>>>,
    Entry<"k8v4", PolicySet<Keys<Int8<Group<32>>>, Values<G32I4>>>,
    Entry<"kivi4", PolicySet<Keys<G32I4, PerChannel>, Values<G32I4>, Residual<128>>>,
    // KIVI at 8 bits, no residual: a planner baseline at the INT8 budget (docs/RESULTS-planner.md).
    Entry<"kivi8", PolicySet<Keys<Int8<Group<32>>, PerChannel>, Values<Int8<Group<32>>>>, false>,
    Entry<"fp8-e4m3", PolicySet<Keys<Fp8E4M3<Group<32>>>, Values<Fp8E4M3<Group<32>>>>>,
    // Eviction at a 1024-token budget.
    Entry<"int4-g32+sink-window-1k", PolicySet<Keys<G32I4>, Values<G32I4>, SinkWindow<4, 1020>>, false>,
    Entry<"int4-g32+h2o-1k", PolicySet<Keys<G32I4>, Values<G32I4>, H2O<512, 508, 4>>, false>,
    // Delta / keyframe coding (docs/RESULTS-keyframe.md): fp16 keyframe + INT4-g32 deltas per delta
    // interval of 64 tokens, INT4-g32 rows per plain one; kf64-plain never uses deltas (the control).
    Entry<"kf64-plain", PolicySet<Keys<Keyframe<64, G32I4, Fp16, PlainOnly>>, Values<Keyframe<64, G32I4, Fp16, PlainOnly>>>, false>,
    Entry<"kf64-anchor", PolicySet<Keys<Keyframe<64, G32I4, Fp16, Anchor>>, Values<Keyframe<64, G32I4, Fp16, Anchor>>>, false>,
    Entry<"kf64-chained", PolicySet<Keys<Keyframe<64, G32I4, Fp16, Chained>>, Values<Keyframe<64, G32I4, Fp16, Chained>>>, false>,
    // KIVI keys without kivi4's 128-token fp32 residual.
    Entry<"kivi4-r0", PolicySet<Keys<G32I4, PerChannel>, Values<G32I4>>, false>,
    // Eviction at 50 % / 25 % of the context.
    Entry<"sink-window-50", PolicySet<SinkWindowBudget<Fraction<1, 2>>>, false>,
    Entry<"sink-window-25", PolicySet<SinkWindowBudget<Fraction<1, 4>>>, false>,
    Entry<"h2o-50", PolicySet<H2OBudget<Fraction<1, 2>>>, false>,
    Entry<"h2o-25", PolicySet<H2OBudget<Fraction<1, 4>>>, false>,
    Entry<"snapkv-50", PolicySet<SnapKVBudget<Fraction<1, 2>>>, false>,
    Entry<"snapkv-25", PolicySet<SnapKVBudget<Fraction<1, 4>>>, false>,
    Entry<"block-sparse-50", PolicySet<BlockSparse<Fraction<1, 2>>>, false>,
    Entry<"block-sparse-25", PolicySet<BlockSparse<Fraction<1, 4>>>, false>,
    Entry<"int4-g32+sink-window-50", PolicySet<Keys<G32I4>, Values<G32I4>, SinkWindowBudget<Fraction<1, 2>>>, false>,
    Entry<"int4-g32+sink-window-25", PolicySet<Keys<G32I4>, Values<G32I4>, SinkWindowBudget<Fraction<1, 4>>>, false>,
    Entry<"int4-g32+h2o-50", PolicySet<Keys<G32I4>, Values<G32I4>, H2OBudget<Fraction<1, 2>>>, false>,
    Entry<"int4-g32+h2o-25", PolicySet<Keys<G32I4>, Values<G32I4>, H2OBudget<Fraction<1, 4>>>, false>,
    Entry<"int4-g32+snapkv-50", PolicySet<Keys<G32I4>, Values<G32I4>, SnapKVBudget<Fraction<1, 2>>>, false>,
    Entry<"int4-g32+snapkv-25", PolicySet<Keys<G32I4>, Values<G32I4>, SnapKVBudget<Fraction<1, 4>>>, false>,
    Entry<"int4-g32+block-sparse-50", PolicySet<Keys<G32I4>, Values<G32I4>, BlockSparse<Fraction<1, 2>>>, false>,
    Entry<"int4-g32+block-sparse-25", PolicySet<Keys<G32I4>, Values<G32I4>, BlockSparse<Fraction<1, 4>>>, false>,
    // SnapKV with a max-pooling kernel of 7 or 9 instead of 5 (docs/RESULTS-snapkv-needle.md).
    Entry<"snapkv-25-k7", PolicySet<SnapKVBudget<Fraction<1, 4>, 32, 7>>, false>,
    Entry<"snapkv-50-k9", PolicySet<SnapKVBudget<Fraction<1, 2>, 32, 9>>, false>,
    Entry<"snapkv-25-k9", PolicySet<SnapKVBudget<Fraction<1, 4>, 32, 9>>, false>,
    Entry<"int4-g32+snapkv-50-k9", PolicySet<Keys<G32I4>, Values<G32I4>, SnapKVBudget<Fraction<1, 2>, 32, 9>>, false>,
    Entry<"int4-g32+snapkv-25-k9", PolicySet<Keys<G32I4>, Values<G32I4>, SnapKVBudget<Fraction<1, 4>, 32, 9>>, false>>;

}  // namespace kvpack::registry
