// What the single-sequence store (cache/sequence_store.hpp) and the paged pool
// (pool/paged_sequence.hpp) describe identically to the attention kernel: the kernel arguments of
// the newest queries, and the exact (fp32) segments of one KV head (sinks, pending rows before the
// latest chunk, the latest chunk). Only the quantized blocks differ between the two (owned blocks
// vs pool pages), so each fills HeadSegments::blocks itself.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kvpack/cache/shape.hpp"
#include "kvpack/kernels/dispatch.hpp"

namespace kvpack::cache_detail {

/// Kernel arguments for the n_q newest queries of a layer holding `total` tokens, GQA group
/// `group`. q and out: [n_q][q_heads][head_dim] row-major, pointing at the group's first query
/// head; the scale is shape.attn_scale, or 1/sqrt(head_dim) when that is 0.
[[nodiscard]] inline kernels::AttendArgs attend_args(const ModelShape& shape, std::int64_t total, const float* q,
                                                     float* out, std::int64_t n_q, int group) noexcept {
  kernels::AttendArgs a;
  a.head_dim = shape.head_dim;
  a.group = group;
  a.n_q = static_cast<int>(n_q);
  a.q_first = total - n_q;
  a.scale = shape.attn_scale > 0.f ? shape.attn_scale : 1.f / std::sqrt(static_cast<float>(shape.head_dim));
  a.q = q;
  a.q_stride = static_cast<std::int64_t>(shape.q_heads) * shape.head_dim;
  a.out = out;
  a.out_stride = a.q_stride;
  return a;
}

/// The exact segments of one KV head of layer L: sinks, the pending rows that precede the latest
/// chunk, and the latest chunk (from its first non-sink token). L's fp32 buffers are
/// [tokens][kv_heads * head_dim] with row stride `stride` floats; the head starts `head_offset`
/// floats into a row. Layer: any type with sink_k/sink_v/chunk_k/chunk_v (vectors of float),
/// pend (PendingRows), sinks_held, total and chunk_tokens (tokens). `blocks` is left empty.
template <class Layer>
[[nodiscard]] kernels::HeadSegments exact_segments(const Layer& L, std::int64_t stride,
                                                   std::int64_t head_offset) noexcept {
  auto rows = [&](const float* base, std::int64_t first_row) -> const float* {
    return base ? base + first_row * stride + head_offset : nullptr;  // no arithmetic on an empty buffer
  };
  auto data = [](const auto& buf) -> const float* { return buf.empty() ? nullptr : buf.data(); };
  kernels::HeadSegments seg;
  seg.sinks = {rows(data(L.sink_k), 0), rows(data(L.sink_v), 0), stride, 0, L.sinks_held};
  const std::int64_t chunk_start = L.total - L.chunk_tokens;
  const std::int64_t pend_n = L.pend.size(), pend_first = L.total - pend_n;
  const std::int64_t pend_count = std::max<std::int64_t>(0, chunk_start - pend_first);
  seg.pending = {rows(L.pend.k(), 0), rows(L.pend.v(), 0), stride, pend_first, std::min(pend_count, pend_n)};
  const std::int64_t chunk_first = std::max<std::int64_t>(chunk_start, L.sinks_held);
  const std::int64_t skip = chunk_first - chunk_start;
  seg.chunk = {rows(data(L.chunk_k), skip), rows(data(L.chunk_v), skip), stride, chunk_first, L.total - chunk_first};
  return seg;
}

}  // namespace kvpack::cache_detail
