// The eviction hook interface: the points of the token lifecycle where KVCache calls its
// eviction policy, the defaults (what NoEviction does), and helpers shared by policies.
//
// A policy type P names its hook as `using hook = ...;` (an object the cache owns, holding the
// policy's resolved budget and per-layer state). The cache calls, with St its SequenceStore:
//
//   static Status check(const ModelShape&)      create(): reject a budget the shape cannot hold
//   void init(const ModelShape&)                 resolve budgets, size per-layer state
//   void reset()                                 KVCache::reset(): forget per-layer state
//   std::int64_t budget() const                  KVCache::eviction_budget()
//   held_after(const St&, layer, n)              capacity bound after an append of n tokens
//   keep_exact(const St&, layer)                 pending tokens commit must leave in fp32
//   Status before_append(St&, Workspace&, layer, n)  before the lazy commit of the previous chunk;
//                                                an error fails the append, nothing changed
//   on_commit(St&, layer, h, slot, token)        a token took a slot
//   enforce(St&, layer, h, pending)              evict until the budget holds
//   block_visible(const St&, layer, h, block)    whether attention reads a block
//   on_mass(St&, layer, h, segments, mass)       key mass of a successful attend (wants_mass)
//   on_queries(St&, layer, q, n_q)               the queries of a successful attend
//   payload_slots(const HeadStore&), extra_bytes(layer, h), allocated_bytes(), wipe()
//
// and reads `wants_mass` (attention gathers key mass), `required_block_tokens` (0: any) and
// `evicts_continuously` (holds at most its budget as tokens arrive). A hook derives from
// HookDefaults and replaces only the points it needs. Scratch comes from the caller's Workspace;
// per-sequence state stays in the SequenceStore and the hook, never in the Workspace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvpack/cache/head_store.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/cache/workspace.hpp"
#include "kvpack/policy.hpp"
#include "kvpack/result.hpp"

namespace kvpack::eviction {

/// Hook points that do nothing: a cache that keeps every token.
struct HookDefaults {
  static constexpr bool wants_mass = false;
  static constexpr int required_block_tokens = 0;
  static constexpr bool evicts_continuously = false;
  [[nodiscard]] static Status check(const ModelShape&) { return {}; }
  void init(const ModelShape&) {}
  void reset() {}
  [[nodiscard]] std::int64_t budget() const noexcept { return 0; }
  template <class St>
  [[nodiscard]] std::int64_t held_after(const St& st, int li, std::int64_t n) const noexcept {
    return st.held(st.layer(li)) + n;
  }
  template <class St>
  [[nodiscard]] std::int64_t keep_exact(const St&, int) const noexcept { return 0; }
  template <class St>
  [[nodiscard]] Status before_append(St&, Workspace&, int, std::int64_t) { return {}; }
  template <class St>
  void on_commit(St&, int, int, std::int64_t, std::int64_t) {}
  template <class St>
  void enforce(St&, int, int, std::int64_t) {}
  template <class St>
  [[nodiscard]] bool block_visible(const St& st, int li, int h, std::size_t b) const noexcept {
    return st.layer(li).heads[static_cast<std::size_t>(h)].any_valid(b, st.layout().tokens);
  }
  template <class St>
  void on_mass(St&, int, int, const kernels::HeadSegments&, std::span<const float>) {}
  template <class St>
  void on_queries(St&, int, std::span<const float>, std::int64_t) {}
  [[nodiscard]] std::size_t payload_slots(const HeadStore& H) const noexcept { return static_cast<std::size_t>(H.live); }
  [[nodiscard]] std::size_t extra_bytes(int, int) const noexcept { return 0; }
  [[nodiscard]] std::size_t allocated_bytes() const noexcept { return 0; }
  void wipe() noexcept {}
};

/// How credit_mass combines a new mass with a token's score.
enum class Credit { add, replace };

/// Credits `mass` (AttendArgs::key_mass ordinals of `seg`) to the slot and pending scores of KV
/// head h of layer li: added (cumulative scores: H2O, BlockSparse, SnapKV) or replacing the score
/// (the latest attention only: TOVA). Sinks (fp32, never evicted) are not scored.
template <class St>
void credit_mass(St& st, int li, int h, const kernels::HeadSegments& seg, std::span<const float> mass, Credit how) {
  auto& L = st.layer(li);
  HeadStore& H = L.heads[static_cast<std::size_t>(h)];
  const std::int64_t B = st.layout().tokens;
  auto apply = [how](float& s, float m) { s = how == Credit::add ? s + m : m; };
  std::int64_t o = seg.sinks.count;
  for (std::size_t b = 0; b < seg.blocks.size(); ++b, o += B)
    for (std::int64_t t = 0; t < seg.blocks[b].count; ++t) {
      const std::int64_t slot = static_cast<std::int64_t>(b) * B + t;
      if (slot < H.slots()) apply(H.slot_score[static_cast<std::size_t>(slot)], mass[static_cast<std::size_t>(o + t)]);
    }
  // Pending rows then chunk rows are consecutive pending tokens (the chunk is the pending tail).
  const std::int64_t pend_ord = seg.sinks.count + static_cast<std::int64_t>(seg.blocks.size()) * B;
  const std::int64_t pend_first = L.total - L.pend.size();
  auto rows = [&](const kernels::ExactRows& r, std::int64_t ord) {
    for (std::int64_t t = 0; t < r.count; ++t) {
      const std::int64_t p = r.first + t - pend_first;
      if (p >= 0 && p < L.pend.size()) apply(L.pend.score(p, h), mass[static_cast<std::size_t>(ord + t)]);
    }
  };
  rows(seg.pending, pend_ord);
  rows(seg.chunk, pend_ord + seg.pending.count);
}

}  // namespace kvpack::eviction

namespace kvpack {

/// Keep every token (the default eviction policy).
struct NoEviction {
  using kvpack_role = role::eviction;
  static constexpr bool evicts = false;
  using hook = eviction::HookDefaults;
};

}  // namespace kvpack
