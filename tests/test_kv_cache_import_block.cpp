// KVCache::import_block (the remote tier's prefix import): a cache that imports another cache's
// full blocks attends bit-identically to it, and every misuse is a clear error that changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include <kvpack/kvpack.hpp>

namespace {

using ImportCache = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>, kvpack::Values<kvpack::Int4<kvpack::Group<32>>>,
                                    kvpack::Blocks<32>>;

kvpack::ModelShape import_shape() {
  kvpack::ModelShape s;
  s.layers = 2;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.max_tokens = 256;
  return s;
}

template <class Cache>
void import_fill(Cache& c, int from, int n) {
  const auto& s = c.shape();
  const std::size_t row = static_cast<std::size_t>(s.kv_heads * s.head_dim);
  std::vector<float> k(static_cast<std::size_t>(n) * row), v(k.size());
  std::vector<int32_t> pos(static_cast<std::size_t>(n));
  for (int l = 0; l < s.layers; ++l) {
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = std::sin(0.37f * static_cast<float>(i + static_cast<std::size_t>(from) * row) + static_cast<float>(l));
      v[i] = std::cos(0.11f * static_cast<float>(i + static_cast<std::size_t>(from) * row) - static_cast<float>(l));
    }
    for (int t = 0; t < n; ++t) pos[static_cast<std::size_t>(t)] = from + t;
    ASSERT_TRUE(c.append(l, k, v, pos));
  }
}

template <class Cache>
std::vector<std::byte> import_payloads(const Cache& c, int layer, std::size_t block) {
  const std::size_t bytes = c.block_layout().bytes;
  std::vector<std::byte> p(bytes * static_cast<std::size_t>(c.shape().kv_heads));
  for (int h = 0; h < c.shape().kv_heads; ++h)
    std::memcpy(p.data() + static_cast<std::size_t>(h) * bytes, c.blocks(layer, h)[block].data.get(), bytes);
  return p;
}

TEST(KvCacheImportBlock, ImportedPrefixAttendsBitIdentically) {
  ImportCache a = ImportCache::create(import_shape()).value();
  import_fill(a, 0, 64);  // two full blocks
  ImportCache b = ImportCache::create(import_shape()).value();
  for (std::size_t blk = 0; blk < 2; ++blk)
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(b.import_block(l, import_payloads(a, l, blk)));
  EXPECT_EQ(b.tokens(0), 64);
  EXPECT_EQ(b.quantized_tokens(1), 64);
  // One more token on both, then attention must match bit for bit (odd count of queries: 1).
  import_fill(a, 64, 1);
  import_fill(b, 64, 1);
  std::vector<float> q(static_cast<std::size_t>(4 * 64)), oa(q.size()), ob(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.05f * static_cast<float>(i));
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(a.attend(l, q, oa));
    ASSERT_TRUE(b.attend(l, q, ob));
    EXPECT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float))) << "layer " << l;
  }
}

TEST(KvCacheImportBlock, MisuseIsAnErrorAndChangesNothing) {
  ImportCache a = ImportCache::create(import_shape()).value();
  import_fill(a, 0, 32);
  const auto good = import_payloads(a, 0, 0);
  ImportCache b = ImportCache::create(import_shape()).value();
  EXPECT_EQ(b.import_block(2, good).error().code, kvpack::Errc::invalid_argument);
  EXPECT_EQ(b.import_block(0, std::span(good).first(good.size() - 1)).error().code, kvpack::Errc::invalid_argument);
  EXPECT_EQ(b.tokens(0), 0);
  import_fill(b, 0, 5);  // a partial block: import would leave a gap
  EXPECT_EQ(b.import_block(0, good).error().code, kvpack::Errc::invalid_argument);
  EXPECT_EQ(b.tokens(0), 5);
  using Sinky = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>, kvpack::Values<kvpack::Int4<kvpack::Group<32>>>,
                                kvpack::Blocks<32>, kvpack::Sinks<4>>;
  Sinky s = Sinky::create(import_shape()).value();
  EXPECT_EQ(s.import_block(0, good).error().code, kvpack::Errc::unsupported);
  // Capacity: 256 tokens = 8 blocks; the 9th is refused.
  ImportCache full = ImportCache::create(import_shape()).value();
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(full.import_block(0, good));
  EXPECT_EQ(full.import_block(0, good).error().code, kvpack::Errc::capacity_exceeded);
}

// Without eviction or PreRope the payload stores no positions (KVCache::slot_positions): the
// imported tokens take their cache indices, which is what a shared prefix holds.
TEST(KvCacheImportBlock, PayloadWithoutPositionsImportsIndices) {
  static_assert(!ImportCache::slot_positions);
  ImportCache a = ImportCache::create(import_shape()).value();
  import_fill(a, 0, 64);
  ImportCache b = ImportCache::create(import_shape()).value();
  for (std::size_t blk = 0; blk < 2; ++blk) ASSERT_TRUE(b.import_block(0, import_payloads(a, 0, blk)));
  EXPECT_EQ(b.block_layout().pos_bytes, 0u);
  EXPECT_EQ(b.block_positions(0).size(), 64);
  EXPECT_EQ(b.block_positions(0).runs().size(), 1u);
  const auto rb = b.read_back(0, 1).value();
  ASSERT_EQ(rb.positions.size(), 64u);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(rb.positions[static_cast<std::size_t>(t)], t);
}

// A PreRope cache keeps positions per layer too (its kernels get a base per block): imported
// blocks take their cache indices, so a cache filled at positions 0.. attends bit-identically
// to the one it imported from.
TEST(KvCacheImportBlock, PreRopeImportsIndicesAsPositions) {
  using Rope = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>, kvpack::Values<kvpack::Int4<kvpack::Group<32>>>,
                               kvpack::Blocks<32>, kvpack::PreRope<>>;
  static_assert(!Rope::slot_positions);
  Rope a = Rope::create(import_shape()).value();
  import_fill(a, 0, 64);
  Rope b = Rope::create(import_shape()).value();
  for (std::size_t blk = 0; blk < 2; ++blk) ASSERT_TRUE(b.import_block(0, import_payloads(a, 0, blk)));
  EXPECT_EQ(b.block_positions(0).runs().size(), 1u);
  std::vector<float> kv(2 * 64, 0.25f);
  const std::vector<int32_t> next{64};
  ASSERT_TRUE(a.append(0, kv, kv, next));
  ASSERT_TRUE(b.append(0, kv, kv, next));
  std::vector<float> q(4 * 64), oa(q.size()), ob(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.5f * static_cast<float>(i));
  ASSERT_TRUE(a.attend(0, q, oa));
  ASSERT_TRUE(b.attend(0, q, ob));
  EXPECT_EQ(oa, ob);
}

}  // namespace
