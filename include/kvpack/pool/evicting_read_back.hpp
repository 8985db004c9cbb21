// The read-back of one evicting pool sequence (PagedEvictStore, pool/evicting_store.hpp): what
// a KV head holds, decoded from its pages, as KVCache::read_back of an evicting cache decodes its
// blocks, so tests and tools compare the two bit for bit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvpack/cache/head_store.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/kernels/dispatch.hpp"

namespace kvpack::pool_detail {

/// Decodes what KV head h of layer li of `st` holds as attention reads it (the latest chunk
/// aside), as KVCache::read_back of an evicting cache: fp32 sinks, then every held slot of the
/// pages (decoded, free slots skipped) and the pending rows, sorted by cache index, with the positions
/// the pages store per slot. May throw std::bad_alloc (nothing changes: read-only).
template <class Store>
[[nodiscard]] HeadContents evicting_read_back(const Store& st, int li, int h) {
  using Codec = typename Store::codec;
  const auto& L = st.layer(li);
  const HeadStore& H = L.heads[static_cast<std::size_t>(h)];
  const auto D = static_cast<std::size_t>(st.shape().head_dim);
  const std::size_t stride = st.row_floats(), hoff = static_cast<std::size_t>(h) * D;
  const int B = st.layout().tokens;
  struct Row { std::int64_t index; const float* k; const float* v; std::int32_t pos; };
  std::vector<Row> rows;
  for (std::int64_t t = 0; t < L.sinks_held; ++t)
    rows.push_back({t, L.sink_k.data() + t * stride + hoff, L.sink_v.data() + t * stride + hoff, L.sink_pos[static_cast<std::size_t>(t)]});
  const auto& table = L.pages[static_cast<std::size_t>(h)];
  std::vector<float> dk(table.size() * static_cast<std::size_t>(B) * D), dv(dk.size());  // decoded pages
  kernels::Scratch s;
  s.ensure(1, st.shape().head_dim, B);
  for (std::size_t b = 0; b < table.size(); ++b) {
    const std::byte* data = st.pool().data(table[b]);
    const std::int64_t count = std::min<std::int64_t>(B, H.slots() - static_cast<std::int64_t>(b) * B);
    Codec::decode(st.layout(), data, st.pool().header(table[b]).flags, static_cast<std::size_t>(count), s);
    std::copy_n(s.k_tile.begin(), count * static_cast<std::int64_t>(D), dk.begin() + static_cast<std::ptrdiff_t>(b * B * D));
    std::copy_n(s.v_tile.begin(), count * static_cast<std::int64_t>(D), dv.begin() + static_cast<std::ptrdiff_t>(b * B * D));
    for (std::int64_t t = 0; t < count; ++t) {
      const std::size_t slot = b * static_cast<std::size_t>(B) + static_cast<std::size_t>(t);
      if (H.slot_token[slot] < 0) continue;  // free
      std::int32_t pos;
      std::memcpy(&pos, data + st.layout().positions + static_cast<std::size_t>(t) * sizeof pos, sizeof pos);
      rows.push_back({H.slot_token[slot], dk.data() + slot * D, dv.data() + slot * D, pos});
    }
  }
  for (std::int64_t t = 0; t < L.pend.size(); ++t)
    rows.push_back({L.total - L.pend.size() + t, L.pend.k() + t * stride + hoff, L.pend.v() + t * stride + hoff, L.pend.position(t)});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.index < b.index; });
  HeadContents c;
  for (const Row& r : rows) {
    c.k.insert(c.k.end(), r.k, r.k + D);
    c.v.insert(c.v.end(), r.v, r.v + D);
    c.positions.push_back(r.pos);
    c.indices.push_back(r.index);
  }
  return c;
}

}  // namespace kvpack::pool_detail
