// The offload role of KVCache when no offload is configured: NoOffload, the default. It keeps
// every block in the cache's own memory and needs nothing beyond the core library (no
// libsodium). The real policy, offload::Offload<Tiers..., Prefetch<N>>, lives in
// include/kvpack/offload/cache_offload.hpp (target kvpack::offload).
//
// What a policy of role::offload provides to KVCache (a compile-time interface):
//   static constexpr bool enabled;     false here
//   using options = ...;               runtime options, the second argument of KVCache::create
//   using state = ...;                 a movable member of the cache holding the store;
//                                      state::handle keeps a fetched block's bytes alive
#pragma once

#include "kvpack/policy.hpp"

namespace kvpack {

/// Default offload policy: every block stays resident in the cache; nothing is ever written
/// anywhere. Needs no library beyond kvpack::kvpack.
struct NoOffload {
  using kvpack_role = role::offload;
  static constexpr bool enabled = false;
  /// No runtime options.
  struct options {};
  /// No state.
  struct state {
    struct handle {};  ///< never used: without offload every block is in the cache's memory
  };
};

}  // namespace kvpack
