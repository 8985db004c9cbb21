// The changing half of KVCache::append (the facade validates first): reserve, then mutate. Every
// allocation the push and commit need is made by SequenceStore::reserve_append before anything
// changes, so std::bad_alloc (turned into Errc::out_of_memory by catch_alloc) leaves the cache as
// it was. What still allocates after the reservation, with no rollback: SnapKV's one-time prompt
// compression (scoring and compaction), BlockSparse's compaction, SinkWindow's FIFO (a deque)
// and an offload store's hand-over; the fault-injection test (tests/test_alloc_fault.cpp) covers
// the other caches. A committed keyframe block is moved into an allocation of its own size by a
// nothrow allocation whose failure keeps the reserved buffer (fit_payload): it cannot fail.
#pragma once

#include <cstdint>
#include <span>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/workspace.hpp"
#include "kvpack/result.hpp"

namespace kvpack {

/// Appends n = positions.size() >= 1 validated tokens, staged by st.stage_chunk (which checked
/// them for NaN/Inf), to `layer` of `st`: the eviction hook's
/// before_append and the lazy commit (Evicts), the push, then enforce (Evicts) or, without
/// eviction, the pending rows that commit ahead of the chunk's direct tokens (commit_pending),
/// the direct tokens (commit_direct), the rest of the commit and the hand-over of full blocks
/// to the offload state. Errors: the hook's before_append; may throw
/// std::bad_alloc from reserve_append, before any change (see the file comment for the rest).
template <bool Evicts, class St, class Hook, class Off>
[[nodiscard]] Status append_tokens(St& st, Hook& hook, Workspace& ws, Off& off, int layer, std::span<const float> k,
                                   std::span<const float> v, std::span<const std::int32_t> positions) {
  const auto n = static_cast<std::int64_t>(positions.size());
  st.reserve_append(layer, positions, hook);
  auto& L = st.layer(layer);
  if constexpr (Evicts) {
    // Eviction caches commit lazily: the previous append's tokens are committed (and may be
    // evicted) now, so blocks only ever hold tokens older than the current chunk.
    if (Status s = hook.before_append(st, ws, layer, n); !s) return s;
    st.commit(layer, hook);
  }
  if constexpr (Evicts) {
    st.push(L, k, v, positions);
    for (int h = 0; h < st.shape().kv_heads; ++h) hook.enforce(st, layer, h, L.pend.size());
  } else {
    // Tokens committed within this append skip the pending rows: encoded from the chunk copy.
    const std::int64_t direct = st.direct_tokens(layer, n, hook);
    if (direct > 0 && !L.pend.empty()) st.commit_pending(layer);  // older than the direct tokens: encoded first
    st.push(L, k, v, positions, direct);
    st.commit_direct(layer, direct);
    const bool committed = st.commit(layer, hook) || direct > 0;
    if (committed)  // hand blocks that became full (and old enough) to the offload store
      for (int h = 0; h < st.shape().kv_heads; ++h) off.hand_over(layer, h, L.heads[static_cast<std::size_t>(h)].blocks);
  }
  return {};
}

}  // namespace kvpack
