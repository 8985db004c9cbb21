// The RoPE half of a PreRope<> cache (policy.hpp): what KVCache adds so that its kernels rotate
// pre-RoPE queries and keys (kernels/rope.hpp). It owns the cos/sin table, grows it before an
// append changes anything, and fills each KV head's kernel arguments with positions: the stored
// ones (original positions: sinks, pending rows, the latest chunk, and the blocks' slots: from
// their payloads with eviction, else from the layer's run-length coded positions, a base per
// block) or ranks among the held tokens (cache-relative). PostRope caches get RopeState<PostRope>, whose calls are no-ops.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <vector>

#include "kvpack/cache/alloc_guard.hpp"
#include "kvpack/cache/position_runs.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/cache/workspace.hpp"
#include "kvpack/kernels/rope.hpp"
#include "kvpack/policy.hpp"

namespace kvpack {

/// Whether cache type C takes keys and queries before RoPE (a KVCache with PreRope<>).
template <class C>
inline constexpr bool takes_pre_rope_v = [] {
  if constexpr (requires { C::pre_rope; }) return static_cast<bool>(C::pre_rope);
  else return false;
}();

/// Whether cache type C (a PreRope<> cache, or an adaptor over one) rotates keys at their rank
/// among the held tokens (PreRope<CacheRelative>).
template <class C>
inline constexpr bool rope_cache_relative_v = [] {
  if constexpr (requires { C::rope_cache_relative; }) return static_cast<bool>(C::rope_cache_relative);
  else return false;
}();

/// Points seg's exact rows (sinks, pending rows, the latest chunk's non-sink rows) at layer L's
/// own original positions, for the kernels' RoPE.
template <class Layer>
void rope_exact_positions(kernels::HeadSegments& seg, const Layer& L) noexcept {
  seg.sinks.pos = L.sink_pos.empty() ? nullptr : L.sink_pos.data();
  seg.pending.pos = L.pend.positions();
  seg.chunk.pos = L.chunk_pos.data() + (seg.chunk.first - (L.total - L.chunk_tokens));
}

/// Original positions of a layer without eviction for the kernels (RopeState<PreRope<>> and the
/// page pool): blocks (refs[i] holds the layer's quantized tokens [i * B, i * B + count)) get
/// their slots' positions from L.block_pos when `from_runs` (payloads without slot positions): a
/// base when a block lies inside one run (the common case: one run per layer), else a copy in
/// `spill`; sinks, pending and latest-chunk rows point at the layer's own positions, and
/// args.q_pos at those of the n_q newest queries. Throws std::bad_alloc when `spill` cannot grow
/// (refs unchanged then).
template <class Layer>
void rope_original_positions(const kernels::AttendArgs& a, kernels::HeadSegments& seg, std::vector<kernels::BlockRef>& refs,
                             const Layer& L, int B, bool from_runs, kernels::RopeArgs& args, std::vector<std::int32_t>& spill) {
  if (from_runs) {
    const PositionRuns& runs = L.block_pos;
    const std::span<const PositionRuns::Run> rs = runs.runs();
    // Index of the run holding token j, advanced monotonically (blocks come in token order).
    std::size_t r = 0;
    auto run_end = [&](std::size_t i) { return i + 1 < rs.size() ? std::int64_t{rs[i + 1].first} : runs.size(); };
    std::size_t spilled = 0;
    for (std::size_t i = 0; i < refs.size(); ++i) {
      const std::int64_t j = static_cast<std::int64_t>(i) * B;
      while (run_end(r) <= j) ++r;
      if (j + refs[i].count > run_end(r)) ++spilled;
    }
    spill.resize(spilled * static_cast<std::size_t>(B));
    r = 0, spilled = 0;
    for (std::size_t i = 0; i < refs.size(); ++i) {
      kernels::BlockRef& b = refs[i];
      const std::int64_t j = static_cast<std::int64_t>(i) * B;
      while (run_end(r) <= j) ++r;
      if (j + b.count <= run_end(r)) {
        b.pos = nullptr;
        b.pos_base = rs[r].position + (j - rs[r].first);
      } else {
        std::int32_t* out = spill.data() + spilled++ * static_cast<std::size_t>(B);
        for (int t = 0; t < b.count; ++t) out[t] = runs.at(j + t);
        b.pos = out;
      }
    }
  }
  rope_exact_positions(seg, L);
  args.q_pos = L.chunk_pos.data() + (L.chunk_tokens - a.n_q);
}

/// No RoPE in the cache (PostRope): every call does nothing.
template <class RopeP>
class RopeState {
 public:
  void init(const ModelShape&, bool) {}
  void reserve(std::span<const std::int32_t>, std::int64_t, Workspace& ws) { ws.rope = nullptr; }
  Workspace& publish(Workspace& ws) {
    ws.rope = nullptr;
    return ws;
  }
  template <class Layer>
  void decorate(kernels::AttendArgs&, kernels::HeadSegments&, std::vector<kernels::BlockRef>&, const Layer&, int,
                const std::vector<std::int32_t>*, int) {}
  [[nodiscard]] std::size_t bytes() const noexcept { return 0; }
};

/// PreRope<Positions>: the table and per-head kernel arguments (see the file comment).
template <class Positions>
class RopeState<PreRope<Positions>> {
 public:
  static constexpr bool relative = PreRope<Positions>::cache_relative;

  /// slot_positions: whether block payloads store their slots' positions (KVCache::slot_positions);
  /// if not, decorate takes them from the layer's PositionRuns.
  void init(const ModelShape& shape, bool slot_positions) {
    slot_positions_ = slot_positions;
    const int dims = shape.rope_dims > 0 ? shape.rope_dims : shape.head_dim;
    table_ = kernels::RopeTable(static_cast<double>(shape.rope_base), dims / 2);
    proto_.pairs = dims / 2;
    proto_.neox = shape.rope_neox;
    proto_.relative = relative;
    heads_.resize(static_cast<std::size_t>(shape.kv_heads));
  }

  /// Before an append of `positions` to a layer that holds at most `held_after` tokens after it:
  /// the table covers every position a kernel can ask for (ranks < held tokens, so a sliding
  /// window's table stays at its budget however long the stream; original positions up to the
  /// largest appended). Throws std::bad_alloc (the append has changed nothing yet) when it cannot
  /// grow, or when the table would exceed physical memory (a position near 2^31 asks for
  /// hundreds of GB; refused before an overcommitting kernel grants it).
  /// Then publishes the table in ws (publish()).
  void reserve(std::span<const std::int32_t> positions, std::int64_t held_after, Workspace& ws) {
    std::int64_t need = held_after;
    if constexpr (!relative)
      for (const std::int32_t p : positions) need = std::max<std::int64_t>(need, std::int64_t{p} + 1);
    if (need > table_.size() &&
        saturating_bytes(static_cast<std::uint64_t>(need), 2 * sizeof(float) * static_cast<std::uint64_t>(proto_.pairs)) >
            physical_memory_bytes())
      throw std::bad_alloc();
    table_.ensure(need);
    publish(ws);
  }

  /// Points ws.rope at the table and pairing (q_pos unset), for an eviction hook's own attention
  /// (SnapKV's scoring); valid until the table grows or this state moves. Returns ws.
  Workspace& publish(Workspace& ws) {
    published_ = proto_;
    published_.table = table_.data();
    published_.positions = table_.size();
    ws.rope = &published_;
    return ws;
  }

  /// Points `a` at KV head h's RoPE arguments for the n_q newest queries of layer L, and gives
  /// seg its positions (original) or ranks (cache-relative; slot_token: the head's cache index per
  /// slot when slots are reused, else nullptr; B the block tokens). seg.blocks must be `refs`.
  template <class Layer>
  void decorate(kernels::AttendArgs& a, kernels::HeadSegments& seg, std::vector<kernels::BlockRef>& refs, const Layer& L,
                int h, const std::vector<std::int32_t>* slot_token, int B) {
    Head& hd = heads_[static_cast<std::size_t>(h)];
    hd.args = proto_;
    hd.args.table = table_.data();
    hd.args.positions = table_.size();
    if constexpr (relative) {
      hd.args.q_rank = kernels::assign_rope_ranks(seg, refs, B, slot_token, hd.slot_rank, hd.order) - a.n_q;
    } else {
      (void)slot_token;
      rope_original_positions(a, seg, refs, L, B, !slot_positions_, hd.args, hd.block_pos);
    }
    a.rope = &hd.args;
  }

  /// Bytes of the cos/sin table and the rank scratch (not KV data: KVCache::allocated_bytes).
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t b = table_.bytes();
    for (const Head& h : heads_)
      b += (h.slot_rank.capacity() + h.block_pos.capacity()) * sizeof(std::int32_t) + h.order.capacity() * 8;
    return b;
  }

 private:
  struct Head {
    kernels::RopeArgs args;
    std::vector<std::int32_t> slot_rank;  // cache-relative, reused slots: rank of each slot
    std::vector<std::int64_t> order;      // ... and the sort buffer
    std::vector<std::int32_t> block_pos;  // original positions of blocks that span a jump in them
  };

  kernels::RopeTable table_;
  kernels::RopeArgs proto_;
  kernels::RopeArgs published_;  // publish()'s copy with the table
  std::vector<Head> heads_;
  bool slot_positions_ = true;
};

}  // namespace kvpack
