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
// and the state's hook points, called by KVCache at create (init), after a commit (hand_over),
// around attention (begin_attend, view, end_attend), in read_back (hold) and reset (reset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpack/cache/block.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/result.hpp"

namespace kvpack {

/// Default offload policy: every block stays resident in the cache; nothing is ever written
/// anywhere. Needs no library beyond kvpack::kvpack.
struct NoOffload {
  using kvpack_role = role::offload;
  static constexpr bool enabled = false;
  /// No runtime options.
  struct options {};
  /// No state; every hook point does nothing (blocks never leave the cache's memory).
  struct state {
    /// Never filled: without offload every block is in the cache's memory.
    struct handle {
      [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {}; }
    };
    template <class Cache>
    [[nodiscard]] Status init(const Cache&, const options&) noexcept {
      return {};
    }
    void hand_over(int, int, std::vector<Block>&) noexcept {}
    [[nodiscard]] Status begin_attend(int) noexcept { return {}; }
    [[nodiscard]] const std::byte* view(int, std::size_t) const noexcept { return nullptr; }
    void end_attend() noexcept {}
    /// Errc::invalid_argument: no block is ever held by a store (not reached: data is never null).
    [[nodiscard]] Result<handle> hold(int, int, std::int64_t) const {
      return fail(Errc::invalid_argument, "no offload store holds this block");
    }
    void reset() noexcept {}
  };
};

}  // namespace kvpack
