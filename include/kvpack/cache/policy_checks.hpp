// The policy combinations KVCache<Policy...> refuses, as static_asserts with readable messages
// (tests/compile_fail/ checks each message). PagedCache runs them too, through its KVCache type.
#pragma once

#include "kvpack/policy.hpp"

namespace kvpack::cache_detail {

/// Fails to compile, naming the role, when Policies holds more than one policy of a role.
template <class... Policies>
consteval bool check_roles() {
  static_assert(detail::role_count_v<role::keys, Policies...> <= 1, "kvpack::KVCache<...>: more than one Keys<> policy");
  static_assert(detail::role_count_v<role::values, Policies...> <= 1, "kvpack::KVCache<...>: more than one Values<> policy");
  static_assert(detail::role_count_v<role::sinks, Policies...> <= 1, "kvpack::KVCache<...>: more than one Sinks<> policy");
  static_assert(detail::role_count_v<role::residual, Policies...> <= 1, "kvpack::KVCache<...>: more than one Residual<> policy");
  static_assert(detail::role_count_v<role::blocks, Policies...> <= 1, "kvpack::KVCache<...>: more than one Blocks<> policy");
  static_assert(detail::role_count_v<role::backend, Policies...> <= 1, "kvpack::KVCache<...>: more than one Backend<> policy");
  static_assert(detail::role_count_v<role::eviction, Policies...> <= 1,
                "kvpack::KVCache<...>: more than one eviction policy (NoEviction, SinkWindow, H2O, SnapKV, BlockSparse, ...)");
  static_assert(detail::role_count_v<role::offload, Policies...> <= 1, "kvpack::KVCache<...>: more than one Offload<> policy");
  static_assert(detail::role_count_v<role::demotion, Policies...> <= 1, "kvpack::KVCache<...>: more than one Demote<> policy");
  static_assert(detail::role_count_v<role::rope, Policies...> <= 1, "kvpack::KVCache<...>: more than one PreRope<> policy");
  return true;
}

/// Fails to compile, naming the conflict, when the resolved policies of a KVCache cannot work
/// together; returns true otherwise. SnapKVLike: the eviction hook scores saved queries itself;
/// RopeRanks: PreRope<CacheRelative>.
template <bool Offloads, bool Evicts, bool Demotes, bool KeysPerChannel, int CommitUnit, int CodecBlockTokens,
          int EvictBlockTokens, int BlockTokens, int KeyGroup, bool PreRope, bool RopeRanks, bool Keyframe, bool SnapKVLike>
consteval bool check_policies() {
  static_assert(!Offloads || !Evicts,
                "kvpack::KVCache<...>: Offload<> moves full, immutable blocks; it cannot be combined with an "
                "eviction policy, which rewrites blocks in place");
  static_assert(!Demotes || Evicts,
                "kvpack::KVCache<...>: Demote<> re-codes the tokens an eviction policy drops; add an eviction policy "
                "(SinkWindow, H2O, SnapKV, BlockSparse, TOVA or their Budget/Protocol forms) or drop Demote<>");
  static_assert(!Evicts || !KeysPerChannel,
                "kvpack::KVCache<...>: token-level eviction (SinkWindow, H2O, SnapKV) needs per-token keys; "
                "per-channel key groups cannot lose single tokens");
  static_assert(!Evicts || CommitUnit == 1,
                "kvpack::KVCache<...>: eviction policies cannot remove single tokens from a Keyframe<...> interval");
  static_assert(!CodecBlockTokens || BlockTokens == CodecBlockTokens,
                "kvpack::KVCache<...>: with a Keyframe<Interval, ...> codec, a block holds exactly one interval: "
                "Blocks<B> must equal Interval (and K and V keyframe intervals must match)");
  static_assert(!EvictBlockTokens || BlockTokens == EvictBlockTokens,
                "kvpack::KVCache<...>: BlockSparse<Budget, B> sets the storage block size; a Blocks<> policy with "
                "another size contradicts it (drop Blocks<> or make it Blocks<B>)");
  static_assert(!KeysPerChannel || BlockTokens % KeyGroup == 0,
                "kvpack::KVCache<...>: with Keys<Codec, PerChannel>, Blocks<B> must be a multiple of the key group "
                "size (a block holds whole groups of tokens)");
  static_assert(!PreRope || (!Offloads && !Demotes && !Keyframe),
                "kvpack::KVCache<...>: PreRope<> runs in the scalar/AVX2/NEON tile kernels only: not with "
                "Offload<>, Demote<> or Keyframe<...> codecs");
  static_assert(!RopeRanks || !SnapKVLike,
                "kvpack::KVCache<...>: PreRope<CacheRelative> with SnapKV: SnapKV scores the prompt at the tokens' "
                "original positions; use PreRope<OriginalPositions> (or H2O, SinkWindow, TOVA, BlockSparse)");
  return true;
}

}  // namespace kvpack::cache_detail
