// Inspection of a SequenceStore: decoding what a KV head holds (read_back) and counting bytes
// (held and allocated). Read-only; offloaded blocks are fetched through the offload state.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kvpack/cache/head_store.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/result.hpp"

namespace kvpack {

/// Whether store type St holds a Demote<> low-precision tier (cache/demotion_tier.hpp).
template <class St>
concept DemotingStore = St::tier_type::enabled;

/// Decodes everything (layer li, KV head h) of `st` holds as attention reads it (the latest chunk
/// aside), sorted by cache index; with a demotion tier, its rows too (decoded by the low codecs). Errors: the fetch errors of off.hold for offloaded blocks;
/// Errc::corrupt_data for an offloaded payload whose size disagrees with its header (count, modes).
template <class St, class Offload>
[[nodiscard]] Result<HeadContents> read_back_head(const St& st, const Offload& off, int li, int h) {
  const auto& L = st.layer(li);
  const auto& H = L.heads[static_cast<std::size_t>(h)];
  const auto D = static_cast<std::size_t>(st.shape().head_dim);
  const std::size_t stride = st.row_floats(), hoff = static_cast<std::size_t>(h) * D;
  const int B = st.layout().tokens;
  HeadContents c;
  auto exact = [&](const float* ks, const float* vs, auto pos_at, std::int64_t n, std::int64_t first) {
    for (std::int64_t t = 0; t < n; ++t) {
      const std::size_t at = static_cast<std::size_t>(t) * stride + hoff;
      c.k.insert(c.k.end(), ks + at, ks + at + D);
      c.v.insert(c.v.end(), vs + at, vs + at + D);
      c.positions.push_back(pos_at(t));
      c.indices.push_back(first + t);
    }
  };
  exact(L.sink_k.data(), L.sink_v.data(), [&](std::int64_t t) { return L.sink_pos[static_cast<std::size_t>(t)]; },
        L.sinks_held, 0);
  kernels::Scratch s;
  s.ensure(1, st.shape().head_dim, B);
  std::vector<std::pair<std::int64_t, std::size_t>> order;  // (cache index, row in tk/tv)
  std::vector<float> tk, tv;
  std::vector<std::int32_t> tp;
  for (std::size_t bi = 0; bi < H.blocks.size(); ++bi) {
    const auto& b = H.blocks[bi];
    const std::byte* data = b.data.get();
    const BlockLayout BL = st.layout().at(b.header.flags);  // keyframe blocks: offsets follow the modes
    typename Offload::handle held{};  // keeps an offloaded block's bytes alive below
    if (!data) {
      auto r = off.hold(li, h, static_cast<std::int64_t>(bi));
      if (!r) return r.error();
      held = std::move(r).value();
      data = held.bytes().data();
      if (const std::size_t need = BL.used_bytes(b.header.count, b.header.flags); held.bytes().size() != need)
        return fail(Errc::corrupt_data, "read_back: layer " + std::to_string(li) + ", kv_head " + std::to_string(h) +
                                            ", block " + std::to_string(bi) + ": offloaded payload of " +
                                            std::to_string(held.bytes().size()) + " bytes, but its header (count " + std::to_string(b.header.count) +
                                            ", flags " + std::to_string(b.header.flags) + ") says " + std::to_string(need));
    }
    St::codec::decode(st.layout(), data, b.header.flags, b.header.count, s);
    for (std::size_t t = 0; t < b.header.count; ++t) {
      const std::size_t slot = bi * static_cast<std::size_t>(B) + t;
      std::int64_t index = L.sinks_held + static_cast<std::int64_t>(slot);
      if constexpr (St::evicts) {
        if (H.slot_token[slot] < 0) continue;
        index = H.slot_token[slot];
      }
      order.emplace_back(index, tp.size());
      tk.insert(tk.end(), s.k_tile.begin() + static_cast<std::ptrdiff_t>(t * D), s.k_tile.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
      tv.insert(tv.end(), s.v_tile.begin() + static_cast<std::ptrdiff_t>(t * D), s.v_tile.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
      std::int32_t p;
      if (BL.pos_bytes) std::memcpy(&p, data + BL.positions + t * sizeof p, sizeof p);
      else p = L.block_pos.at(static_cast<std::int64_t>(slot));  // no eviction: slot = commit order
      tp.push_back(p);
    }
  }
  if constexpr (DemotingStore<St>) {  // the low tier: rows in demotion order
    const auto& T = st.tier();
    const auto& LH = T.head(li, h);
    const BlockLayout& TL = T.layout();
    s.ensure(1, st.shape().head_dim, TL.tokens);  // low blocks hold whole key groups: may exceed B
    for (std::size_t bi = 0; bi < LH.blocks.size(); ++bi) {
      const auto& b = LH.blocks[bi];
      St::tier_type::low_hook::decode(TL, b.data.get(), b.header.flags, b.header.count, s);
      for (std::size_t t = bi == 0 ? static_cast<std::size_t>(LH.dropped) : 0; t < b.header.count; ++t) {  // live rows
        order.emplace_back(LH.tokens[bi * static_cast<std::size_t>(TL.tokens) + t], tp.size());
        tk.insert(tk.end(), s.k_tile.begin() + static_cast<std::ptrdiff_t>(t * D), s.k_tile.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
        tv.insert(tv.end(), s.v_tile.begin() + static_cast<std::ptrdiff_t>(t * D), s.v_tile.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
        std::int32_t p;
        std::memcpy(&p, b.data.get() + TL.positions + t * sizeof p, sizeof p);
        tp.push_back(p);
      }
    }
    for (std::size_t t = 0; t < LH.stage_tok.size(); ++t) {  // per-channel keys: staged fp32 rows
      order.emplace_back(LH.stage_tok[t], tp.size());
      tk.insert(tk.end(), LH.stage_k.begin() + static_cast<std::ptrdiff_t>(t * D), LH.stage_k.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
      tv.insert(tv.end(), LH.stage_v.begin() + static_cast<std::ptrdiff_t>(t * D), LH.stage_v.begin() + static_cast<std::ptrdiff_t>((t + 1) * D));
      tp.push_back(LH.stage_pos[t]);
    }
  }
  std::sort(order.begin(), order.end());
  for (const auto& [index, r] : order) {
    c.k.insert(c.k.end(), tk.begin() + static_cast<std::ptrdiff_t>(r * D), tk.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
    c.v.insert(c.v.end(), tv.begin() + static_cast<std::ptrdiff_t>(r * D), tv.begin() + static_cast<std::ptrdiff_t>((r + 1) * D));
    c.positions.push_back(tp[r]);
    c.indices.push_back(index);
  }
  exact(L.pend.k(), L.pend.v(), [&](std::int64_t t) { return L.pend.position(t); }, L.pend.size(), L.total - L.pend.size());
  return c;
}

/// Bytes of KV data `st` holds (KVCache::memory_bytes documents the count); `hook` adds its
/// per-head bookkeeping and says which slots hold payload.
template <class St, class Hook>
[[nodiscard]] std::size_t held_bytes(const St& st, const Hook& hook) noexcept {
  std::size_t total = 0;
  const std::size_t fp_row = st.row_floats() * 2 * sizeof(float) + sizeof(std::int32_t);
  const auto& BL = st.layout();
  int li = 0;
  for (const auto& L : st.layers()) {
    int h = 0;
    for (const auto& H : L.heads) {
      if constexpr (St::evicts) {
        total += hook.payload_slots(H) * BL.used_bytes(1) +
                 H.blocks.size() * (sizeof(BlockHeader) + HeadStore::words_per_block(BL.tokens) * sizeof(std::uint64_t)) +
                 H.slot_token.size() * (sizeof(std::int32_t) + sizeof(float)) +
                 static_cast<std::size_t>(L.pend.size()) * sizeof(float) + hook.extra_bytes(li, h);
      } else {
        for (const auto& b : H.blocks) total += BL.used_bytes(b.header.count, b.header.flags) + sizeof(BlockHeader);
      }
      ++h;
    }
    total += static_cast<std::size_t>(L.sinks_held + L.pend.size()) * fp_row + L.block_pos.held_bytes();
    ++li;
  }
  if constexpr (DemotingStore<St>) total += st.tier().held_bytes();
  return total;
}

/// Bytes `st` and `hook` have allocated for KV data (blocks, buffer capacities, the latest chunk).
template <class St, class Hook>
[[nodiscard]] std::size_t allocated_bytes_of(const St& st, const Hook& hook) noexcept {
  std::size_t total = hook.allocated_bytes();
  for (const auto& L : st.layers()) {
    for (const auto& H : L.heads) {
      total += H.blocks.size() * sizeof(BlockHeader) + H.valid.capacity() * sizeof(std::uint64_t) +
               (H.slot_token.capacity() + H.slot_score.capacity()) * 4;
      for (const auto& b : H.blocks) total += b.data ? b.bytes : 0;
      for (const auto& b : H.spare) total += b.bytes;
    }
    total += (L.sink_k.capacity() + L.sink_v.capacity() + L.chunk_k.capacity() + L.chunk_v.capacity()) * sizeof(float) +
             L.sink_pos.capacity() * sizeof(std::int32_t) + L.pend.allocated_bytes() + L.block_pos.allocated_bytes();
  }
  if constexpr (DemotingStore<St>) total += st.tier().allocated_bytes();
  if constexpr (requires { st.stage_bytes(); }) total += st.stage_bytes();
  return total;
}

/// Measured storage of the quantized K and V a cache holds in blocks (KVCache::stored_bits).
/// Codes and metadata only: positions, block headers and full-precision rows are not included
/// (memory_bytes counts everything).
struct StoredBits {
  double key_bits_per_value = 0;    ///< 8 * bytes of K codes and metadata / K values in blocks (0: no block)
  double value_bits_per_value = 0;  ///< the same for V
  std::int64_t values = 0;          ///< values per role in blocks: quantized tokens x head_dim, all layers and KV heads
};

/// StoredBits of `st`: per block from its header (token count, keyframe modes); with eviction,
/// per live slot (codec bytes per token; no keyframe codecs there); with a demotion tier, plus
/// its low rows at the low codecs' bytes per token.
template <class St>
[[nodiscard]] StoredBits stored_bits_of(const St& st) noexcept {
  const auto& BL = st.layout();
  std::size_t kb = 0, vb = 0;
  std::int64_t tokens = 0;
  for (const auto& L : st.layers())
    for (const auto& H : L.heads) {
      if constexpr (St::evicts) {
        kb += static_cast<std::size_t>(H.live) * BL.k_bytes(1), vb += static_cast<std::size_t>(H.live) * BL.v_bytes(1);
        tokens += H.live;
      } else {
        for (const auto& b : H.blocks) {
          kb += BL.k_bytes(b.header.count, b.header.flags), vb += BL.v_bytes(b.header.count, b.header.flags);
          tokens += b.header.count;
        }
      }
    }
  if constexpr (DemotingStore<St>) {
    const auto low = static_cast<std::size_t>(st.tier().rows());  // K metadata per whole group of rows
    kb += st.tier().layout().k_bytes(static_cast<int>(low)), vb += st.tier().layout().v_bytes(static_cast<int>(low));
    tokens += static_cast<std::int64_t>(low);
  }
  StoredBits r;
  r.values = tokens * st.shape().head_dim;
  if (r.values > 0) {
    r.key_bits_per_value = 8.0 * static_cast<double>(kb) / static_cast<double>(r.values);
    r.value_bits_per_value = 8.0 * static_cast<double>(vb) / static_cast<double>(r.values);
  }
  return r;
}

}  // namespace kvpack
