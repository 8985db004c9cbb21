// Swap-out / swap-in on an evicting pool (EvictingPagedCache::swap_out / swap_in): a sequence
// swapped out between decode steps, its freed pages reused by another sequence meanwhile, then
// swapped back in, goes on exactly as a KVCache of the same policies fed the same appends and
// attends (attention bits, pages, held tokens, read_back after every step): its slots, scores and
// policy state never left memory. SinkWindow, H2O (scores from attention mass), SnapKV (prompt
// compression after the swap) and BlockSparse (whole pages dropped). Shared pages of a fork stay resident; a swapped sequence refuses
// attends; freeing it erases its copies.
#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "kvpack/pool/page_swap.hpp"
#include "support/pool_twin.hpp"

namespace pool_swap_evict_test {

using namespace kvpack;  // NOLINT: test file

using SW = std::tuple<Keys<Int4<>>, Values<Int4<>>, Residual<4>, Blocks<16>, SinkWindow<4, 40>>;
using HH = std::tuple<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Blocks<16>, H2O<16, 16, 2>>;
using Snap = std::tuple<Keys<Int4<>>, Values<Int4<>>, Blocks<16>, SnapKV<24, 8, 3>>;
using BS = std::tuple<Keys<Int8<>>, Values<Int4<>>, Sinks<2>, Blocks<16>, BlockSparse<Tokens<80>, 16, 1, 1>>;

template <class T>
using Types = kvtest::PoolTypes<T>;

const ModelShape kShape{.layers = 2, .q_heads = 6, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096};
constexpr std::size_t kRow = 2 * 64, kQRow = 6 * 64;

/// Appends n tokens (seeded) to every layer of the pool sequence and the cache, attends the last
/// min(n, 8) in every layer on both, and expects equal bits, pages, held tokens and read_back.
template <class Pool, class Cache>
void step(Pool& pool, SeqId id, Cache& cache, int n, std::uint32_t seed) {
  const std::int64_t first = cache.tokens(0);
  for (int l = 0; l < kShape.layers; ++l) {
    const auto k = kvtest::normal(static_cast<std::size_t>(n) * kRow, seed * 16 + 2 * l);
    const auto v = kvtest::normal(static_cast<std::size_t>(n) * kRow, seed * 16 + 2 * l + 1);
    auto a = pool.append(id, l, k, v, kvtest::iota_positions(first, n));
    ASSERT_TRUE(a) << a.error().message;
    ASSERT_TRUE(cache.append(l, k, v, kvtest::iota_positions(first, n)));
  }
  Workspace ws;
  for (int l = 0; l < kShape.layers; ++l) {
    const auto q = kvtest::normal(static_cast<std::size_t>(std::min(n, 8)) * kQRow, seed * 16 + 8 + l);
    std::vector<float> got(q.size()), want(q.size());
    ASSERT_TRUE(pool.attend(id, l, q, got, ws));
    ASSERT_TRUE(cache.attend(l, q, want));
    EXPECT_TRUE(kvtest::same_bits(got, want)) << "layer " << l << " at " << cache.tokens(0) << " tokens";
  }
  for (int l = 0; l < kShape.layers; ++l)
    for (int h = 0; h < kShape.kv_heads; ++h) {
      kvtest::expect_same_pages(pool, id, cache, l, h);
      EXPECT_EQ(*pool.held_tokens(id, l, h), cache.held_tokens(l, h));
      const auto got = pool.read_back(id, l, h), want = cache.read_back(l, h);
      ASSERT_TRUE(got && want);
      EXPECT_EQ(got->k, want->k);
      EXPECT_EQ(got->indices, want->indices);
    }
}

template <class T>
class PoolSwapEvict : public ::testing::Test {};
using Configs = ::testing::Types<SW, HH, Snap, BS>;
TYPED_TEST_SUITE(PoolSwapEvict, Configs);

TYPED_TEST(PoolSwapEvict, GoesOnAsASequenceNeverSwapped) {
  using Pool = typename Types<TypeParam>::pool;
  using Cache = typename Types<TypeParam>::cache;
  for (int prompt : {1, 33, 95}) {
    SCOPED_TRACE("prompt " + std::to_string(prompt));
    auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 21, .max_sequences = 3}).value();
    auto cache = Cache::create(kShape).value();
    HostSwapTarget target;
    const SeqId id = pool.create_sequence().value();
    step(pool, id, cache, prompt, 1);
    std::uint32_t seed = 2;
    for (int round = 0; round < 3; ++round) {
      // Round 0 swaps the prompt before any decode token: SnapKV compresses it after the swap.
      const std::size_t used = pool.stats().pages_used;
      auto out = pool.swap_out(id, target);
      ASSERT_TRUE(out) << out.error().message;
      EXPECT_EQ(*out, used);
      EXPECT_EQ(pool.stats().pages_used, 0u);
      EXPECT_EQ(pool.stats().pages_swapped, used);
      std::vector<float> q(kQRow), o(kQRow);
      Workspace ws;
      auto refused = pool.attend(id, 0, q, o, ws);
      EXPECT_EQ(refused.error().code, Errc::not_present);
      EXPECT_EQ(pool.tokens(id, 1).value(), cache.tokens(1));
      const SeqId other = pool.create_sequence().value();  // takes and writes the freed pages
      auto other_cache = Cache::create(kShape).value();
      step(pool, other, other_cache, 60, 900 + static_cast<std::uint32_t>(round));
      ASSERT_TRUE(pool.free_sequence(other));
      auto in = pool.swap_in(id);
      ASSERT_TRUE(in) << in.error().message;
      EXPECT_EQ(*in, used);
      EXPECT_EQ(target.pages(), 0u);
      for (int t = 0; t < 7; ++t) step(pool, id, cache, 1, seed++);  // SnapKV compresses on the first of round 0
    }
    for (int t = 0; t < 20; ++t) step(pool, id, cache, 1, seed++);  // evicting on, past the budgets
  }
}

TEST(PoolSwapEvict, SharedPagesStayAndFreeingErasesTheCopies) {
  using Pool = Types<HH>::pool;
  using Cache = Types<HH>::cache;
  auto pool = Pool::create({.shape = kShape, .byte_budget = 1 << 21, .max_sequences = 3}).value();
  auto cache = Cache::create(kShape).value();
  HostSwapTarget target;
  const SeqId parent = pool.create_sequence().value();
  step(pool, parent, cache, 40, 1);
  const SeqId child = pool.fork(parent).value();
  auto out = pool.swap_out(parent, target);
  ASSERT_TRUE(out);
  EXPECT_EQ(*out, 0u) << "every page of the parent is shared with its fork";
  EXPECT_TRUE(pool.swapped_out(parent).value());
  ASSERT_TRUE(pool.swap_in(parent));
  step(pool, parent, cache, 1, 2);  // copy-on-write: the parent now holds copies alone
  ASSERT_TRUE(pool.swap_out(parent, target));
  EXPECT_GT(target.pages(), 0u);
  ASSERT_TRUE(pool.free_sequence(parent));
  EXPECT_EQ(target.pages(), 0u);
  EXPECT_TRUE(pool.valid(child));
}

}  // namespace pool_swap_evict_test
