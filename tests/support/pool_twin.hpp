// Test helpers for PagedCache: a sequence of a pool driven beside a KVCache of the same policies
// (its "twin"), so the pool can be checked bit for bit against the single-sequence cache, and
// through the twin's Harness against the float64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "kvpack/pool/paged_cache.hpp"
#include "support/cache_harness.hpp"
#include "support/reference.hpp"

namespace kvtest {

/// The pool and the single-sequence cache of one policy list given as a std::tuple<P...> (the
/// typed tests' parameter): PoolTypes<T>::pool = PagedCache<P...>, ::cache = KVCache<P...>.
template <class T>
struct PoolTypes;
template <class... P>
struct PoolTypes<std::tuple<P...>> {
  using pool = kvpack::PagedCache<P...>;
  using cache = kvpack::KVCache<P...>;
};

/// Position of slot t of page b of (layer) in `id`: from the sequence's runs where pages store
/// none (PagedCache without eviction), else from the page (EvictingPagedCache: one per slot).
template <class Pool>
std::int32_t page_position(const Pool& pool, kvpack::SeqId id, int layer, const kvpack::PageView& page, std::size_t b, int t) {
  if constexpr (requires { pool.block_positions(id, layer); }) {
    return pool.block_positions(id, layer).value()->at(static_cast<std::int64_t>(b) * pool.block_layout().tokens + t);
  } else {
    std::int32_t p = 0;
    std::memcpy(&p, page.data + pool.block_layout().positions + static_cast<std::size_t>(t) * 4, 4);
    return p;
  }
}

/// Expects the pages of (layer, kv_head) of `id` to hold exactly the twin's blocks: same count,
/// same codes and metadata bytes, same positions (page_position; a twin keeps one per slot or
/// runs, KVCache::slot_positions). With BlockSparse, the twin's live blocks: the twin masks a
/// victim out until it compacts, the pool drops its page at once.
template <class Pool, class Cache>
void expect_same_pages(const Pool& pool, kvpack::SeqId id, const Cache& twin, int layer, int kv_head) {
  auto pages = pool.pages(id, layer, kv_head);
  ASSERT_TRUE(pages) << pages.error().message;
  const auto all = twin.blocks(layer, kv_head);
  std::vector<const kvpack::Block*> live;
  std::vector<std::size_t> twin_index;  // of each live block among the twin's blocks
  for (std::size_t b = 0; b < all.size(); ++b) {
    if constexpr (requires { twin.block_mask(layer, kv_head); }) {
      const auto m = twin.block_mask(layer, kv_head);
      if (((m[b / 64] >> (b % 64)) & 1u) == 0) continue;
    }
    live.push_back(&all[b]);
    twin_index.push_back(b);
  }
  ASSERT_EQ(pages->size(), live.size()) << "layer " << layer << " head " << kv_head;
  const kvpack::BlockLayout& PL = pool.block_layout();
  ASSERT_EQ(PL.positions, twin.block_layout().positions);  // the same codes and metadata before any positions
  ASSERT_EQ(PL.pos_bytes, twin.block_layout().pos_bytes);
  for (std::size_t b = 0; b < live.size(); ++b) {
    const kvpack::Block& twin_block = *live[b];
    EXPECT_EQ((*pages)[b].header.count, twin_block.header.count) << "block " << b;
    EXPECT_EQ(std::memcmp((*pages)[b].data, twin_block.data.get(), PL.positions), 0) << "block " << b << " bytes differ";
    for (int t = 0; t < twin_block.header.count; ++t) {
      std::int32_t twin_pos = 0;
      if constexpr (Cache::slot_positions) {
        std::memcpy(&twin_pos, twin_block.data.get() + PL.positions + static_cast<std::size_t>(t) * 4, 4);
      } else {
        twin_pos = twin.block_positions(layer).at(static_cast<std::int64_t>(twin_index[b]) * PL.tokens + t);
      }
      EXPECT_EQ(page_position(pool, id, layer, (*pages)[b], b, t), twin_pos) << "block " << b << " slot " << t;
    }
  }
}

/// Expects two sequences of (possibly different) pools to hold the same page bytes, counts and positions.
template <class Pool>
void expect_same_pages(const Pool& a, kvpack::SeqId ia, const Pool& b, kvpack::SeqId ib) {
  for (int l = 0; l < a.shape().layers; ++l)
    for (int h = 0; h < a.shape().kv_heads; ++h) {
      auto pa = a.pages(ia, l, h);
      auto pb = b.pages(ib, l, h);
      ASSERT_TRUE(pa && pb);
      ASSERT_EQ(pa->size(), pb->size()) << "layer " << l << " head " << h;
      for (std::size_t i = 0; i < pa->size(); ++i) {
        EXPECT_EQ((*pa)[i].header.count, (*pb)[i].header.count) << "layer " << l << " head " << h << " page " << i;
        EXPECT_EQ(std::memcmp((*pa)[i].data, (*pb)[i].data, a.block_layout().bytes), 0)
            << "layer " << l << " head " << h << " page " << i << " bytes differ";
      }
      if constexpr (requires { a.block_positions(ia, l); }) {  // pages without positions: compare the runs
        const kvpack::PositionRuns& ra = *a.block_positions(ia, l).value();
        const kvpack::PositionRuns& rb = *b.block_positions(ib, l).value();
        ASSERT_EQ(ra.size(), rb.size()) << "layer " << l;
        for (std::int64_t t = 0; t < ra.size(); ++t) ASSERT_EQ(ra.at(t), rb.at(t)) << "layer " << l << " token " << t;
      }
    }
}

/// Attention output of the sequence's latest n_q tokens (expects success).
template <class Pool>
std::vector<float> pool_attend(const Pool& pool, kvpack::SeqId id, int layer, const std::vector<float>& q) {
  std::vector<float> out(q.size());
  kvpack::Workspace ws;
  auto st = pool.attend(id, layer, q, out, ws);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  return out;
}

/// Bitwise equality of two float vectors.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace kvtest
