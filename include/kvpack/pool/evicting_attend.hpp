// The attention of one sequence of an EvictingPagedCache (pool/paged_eviction.hpp) and the score
// update that follows it, in two steps so that a batched decode runs every kernel before any
// score changes: evicting_kernels (KVCache::attend's serial loop over the KV heads, each head's
// key mass collected) and evicting_credit (the policy's on_mass / on_queries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpack/cache/shape.hpp"
#include "kvpack/cache/workspace.hpp"
#include "kvpack/kernels/dispatch.hpp"
#include "kvpack/pool/pool_checks.hpp"
#include "kvpack/result.hpp"

namespace kvpack::pool_detail {

/// Attention of the n_q = q.size() / (q_heads * D) newest tokens of `layer` of sequence s (its
/// `store` and eviction `hook`) into out, with Codec's kernel, each KV head's key mass into
/// mass[h] when the policy wants it; bias: its additive mask by cache index (AttendArgs::bias,
/// read for held slots through BlockRef::slot_index) or nullptr; i: the sequence's batch index
/// or -1 (for the error message). Scores untouched. Errc::non_finite for a non-finite output; may throw
/// std::bad_alloc (scratch).
template <class Codec, class Seq>
Status evicting_kernels(Seq& s, const ModelShape& shape, int layer, std::span<const float> q, std::span<float> out,
                        Workspace& ws, std::vector<std::vector<float>>& mass, std::int64_t i, const float* bias = nullptr) {
  using Hook = decltype(s.hook);
  const int D = shape.head_dim, group = shape.q_heads / shape.kv_heads;
  const auto& L = s.store.layer(layer);
  const auto n_q = static_cast<std::int64_t>(q.size() / (static_cast<std::size_t>(shape.q_heads) * static_cast<std::size_t>(D)));
  mass.resize(static_cast<std::size_t>(shape.kv_heads));
  for (int h = 0; h < shape.kv_heads; ++h) {
    const std::int64_t at = static_cast<std::int64_t>(h) * group * D;
    kernels::AttendArgs a = s.store.args_for(L, q.data() + at, out.data() + at, n_q, group);
    a.bias = bias;
    const kernels::HeadSegments seg = s.store.segments(layer, h, s.hook, 0, ws.refs);
    if constexpr (Hook::wants_mass) {
      std::vector<float>& m = mass[static_cast<std::size_t>(h)];
      m.assign(static_cast<std::size_t>(s.store.ordinals(seg)), 0.f);
      a.key_mass = m.data();
    }
    Codec::attend(a, seg, s.store.layout(), ws.scratch);
  }
  return check_output(shape, layer, out, i);
}

/// The score update after evicting_kernels (finite outputs): the key masses, the queries.
/// Allocates nothing (ws.refs has the room evicting_kernels gave it for this sequence) except
/// SnapKV's observation window, which reserves before it changes.
template <class Seq>
void evicting_credit(Seq& s, const ModelShape& shape, int layer, std::span<const float> q, Workspace& ws,
                     std::vector<std::vector<float>>& mass) {
  using Hook = decltype(s.hook);
  const std::size_t qrow = static_cast<std::size_t>(shape.q_heads) * static_cast<std::size_t>(shape.head_dim);
  const auto n_q = static_cast<std::int64_t>(q.size() / qrow);
  if constexpr (Hook::wants_mass)
    for (int h = 0; h < shape.kv_heads; ++h)
      s.hook.on_mass(s.store, layer, h, s.store.segments(layer, h, s.hook, 0, ws.refs), mass[static_cast<std::size_t>(h)]);
  s.hook.on_queries(s.store, layer, q, n_q);
}

}  // namespace kvpack::pool_detail
