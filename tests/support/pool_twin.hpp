// Test helpers for PagedCache: a sequence of a pool driven beside a KVCache of the same policies
// (its "twin"), so the pool can be checked bit for bit against the single-sequence cache, and
// through the twin's Harness against the float64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvpack/pool/paged_cache.hpp"
#include "support/cache_harness.hpp"
#include "support/reference.hpp"

namespace kvtest {

/// Expects the pages of (layer, kv_head) of `id` to hold exactly the twin's blocks: same count,
/// same codes and metadata bytes, same positions (pages store one per slot; a twin without slot
/// positions keeps them as the layer's runs, KVCache::slot_positions).
template <class Pool, class Cache>
void expect_same_pages(const Pool& pool, kvpack::SeqId id, const Cache& twin, int layer, int kv_head) {
  auto pages = pool.pages(id, layer, kv_head);
  ASSERT_TRUE(pages) << pages.error().message;
  const auto blocks = twin.blocks(layer, kv_head);
  ASSERT_EQ(pages->size(), blocks.size()) << "layer " << layer << " head " << kv_head;
  const kvpack::BlockLayout& PL = pool.block_layout();
  ASSERT_EQ(PL.pos_bytes, sizeof(std::int32_t));
  ASSERT_EQ(PL.positions, twin.block_layout().positions);  // the same codes and metadata before it
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    EXPECT_EQ((*pages)[b].header.count, blocks[b].header.count) << "block " << b;
    EXPECT_EQ(std::memcmp((*pages)[b].data, blocks[b].data.get(), PL.positions), 0) << "block " << b << " bytes differ";
    for (int t = 0; t < PL.tokens; ++t) {
      std::int32_t page_pos = 0, twin_pos = 0;
      std::memcpy(&page_pos, (*pages)[b].data + PL.positions + static_cast<std::size_t>(t) * 4, 4);
      if constexpr (Cache::slot_positions) {
        std::memcpy(&twin_pos, blocks[b].data.get() + PL.positions + static_cast<std::size_t>(t) * 4, 4);
      } else if (t < blocks[b].header.count) {
        twin_pos = twin.block_positions(layer).at(static_cast<std::int64_t>(b) * PL.tokens + t);
      }
      EXPECT_EQ(page_pos, twin_pos) << "block " << b << " slot " << t;
    }
  }
}

/// Expects two sequences of (possibly different) pools to hold the same page bytes and counts.
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
