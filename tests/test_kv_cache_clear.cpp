// KVCache::clear(): reset() that keeps the quantized blocks' allocations, zeroed, for the next
// tokens (an engine reusing its cache for the next request). After clear() the cache holds
// nothing, and refilling it gives codes, read_back and attention bit-identical to a fresh cache,
// with the recycled block buffers reused instead of new ones; for every kind of store: per-token,
// per-channel keys with a residual window and sinks, eviction (H2O), keyframe intervals.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace test_kv_cache_clear {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

const ModelShape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 512};

// Appends `n` tokens (seeded) in chunks of 1, 31, 33 and 95 to every layer.
template <class Cache>
void fill(Cache& c, int n, std::uint32_t seed) {
  const std::size_t row = 2 * 64;
  int t = 0;
  for (int i = 0; t < n; ++i) {
    const int chunk = std::min(n - t, std::vector<int>{1, 31, 33, 95}[static_cast<std::size_t>(i % 4)]);
    const auto k = kvtest::normal(static_cast<std::size_t>(chunk) * row, seed + 2 * static_cast<std::uint32_t>(i));
    const auto v = kvtest::normal(k.size(), seed + 2 * static_cast<std::uint32_t>(i) + 1);
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(c.append(l, k, v, kvtest::iota_positions(t, chunk)));
    t += chunk;
  }
}

template <class Cache>
std::set<const std::byte*> block_buffers(const Cache& c) {
  std::set<const std::byte*> s;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h)
      for (const Block& b : c.blocks(l, h)) s.insert(b.data.get());
  return s;
}

template <class Cache>
void expect_same(Cache& a, Cache& b) {
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      const auto ra = a.read_back(l, h).value(), rb = b.read_back(l, h).value();
      EXPECT_EQ(ra.k, rb.k) << "layer " << l << " head " << h;
      EXPECT_EQ(ra.v, rb.v);
      EXPECT_EQ(ra.positions, rb.positions);
      EXPECT_EQ(ra.indices, rb.indices);
      const auto ba = a.blocks(l, h), bb = b.blocks(l, h);
      ASSERT_EQ(ba.size(), bb.size());
      for (std::size_t i = 0; i < ba.size(); ++i) {
        ASSERT_EQ(ba[i].header.count, bb[i].header.count);
        EXPECT_EQ(std::memcmp(ba[i].data.get(), bb[i].data.get(), a.block_layout().at(ba[i].header.flags).bytes), 0)
            << "block " << i << " bytes differ";
      }
    }
    const auto q = kvtest::normal(4 * 64, 99 + static_cast<std::uint32_t>(l), 0.5f);
    std::vector<float> oa(q.size()), ob(q.size());
    ASSERT_TRUE(a.attend(l, q, oa));
    ASSERT_TRUE(b.attend(l, q, ob));
    EXPECT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)), 0) << "layer " << l;
  }
  EXPECT_EQ(a.memory_bytes(), b.memory_bytes());
}

template <class Cache>
class KvCacheClear : public ::testing::Test {};
using Caches = ::testing::Types<KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Blocks<16>>,
                                KVCache<Keys<Int4<Group<16>>, PerChannel>, Values<Int8<>>, Blocks<16>, Sinks<3>, Residual<5>>,
                                KVCache<Keys<Int8<>>, Values<Int4<>>, H2O<24, 40>, Blocks<16>>,
                                KVCache<Keys<Keyframe<8, Int4<>, Fp16>>, Values<Fp16>>>;
TYPED_TEST_SUITE(KvCacheClear, Caches);

TYPED_TEST(KvCacheClear, RefillEqualsAFreshCacheAndReusesTheBlocks) {
  auto c = TypeParam::create(kShape).value();
  fill(c, 160, 1);
  const auto before = block_buffers(c);
  std::size_t block_bytes = 0;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h)
      for (const Block& b : c.blocks(l, h)) block_bytes += b.bytes;
  ASSERT_GT(c.memory_bytes(), 0u);
  c.clear();
  EXPECT_EQ(c.memory_bytes(), 0u);
  EXPECT_EQ(c.tokens(0), 0);
  EXPECT_EQ(c.quantized_tokens(1), 0);
  EXPECT_TRUE(c.blocks(0, 0).empty());
  EXPECT_TRUE(c.read_back(1, 1).value().k.empty());
  if constexpr (!TypeParam::codec_hook::interval_blocks) {  // keyframe blocks are fitted to their modes: released
    EXPECT_GE(c.allocated_bytes(), block_bytes) << "the block allocations stay";
  }

  auto fresh = TypeParam::create(kShape).value();
  fill(c, 150, 7);
  fill(fresh, 150, 7);
  expect_same(c, fresh);
  if constexpr (!TypeParam::codec_hook::interval_blocks) {
    for (const std::byte* p : block_buffers(c)) EXPECT_TRUE(before.count(p)) << "a new block was allocated";
  }
}

TYPED_TEST(KvCacheClear, ResetReleasesWhatClearKeeps) {
  auto a = TypeParam::create(kShape).value(), b = TypeParam::create(kShape).value();
  fill(a, 160, 1);
  fill(b, 160, 1);
  a.clear();
  b.reset();
  EXPECT_EQ(a.memory_bytes(), b.memory_bytes());
  EXPECT_GE(a.allocated_bytes(), b.allocated_bytes());
  fill(a, 100, 3);
  fill(b, 100, 3);
  expect_same(a, b);
}

}  // namespace
}  // namespace test_kv_cache_clear
