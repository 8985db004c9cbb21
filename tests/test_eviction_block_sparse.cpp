// BlockSparse: block-granular eviction with a block bitmask, compaction, budgets in tokens or as a
// fraction of the context. Masked blocks are never read (poisoned payloads change nothing),
// compaction keeps attention output bit-identical and equal to ref64 over the kept tokens at
// their original positions, odd chunk sizes, memory bounded over 1,000,000 tokens.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"
#include "support/sweep.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

template <class Cache>
std::size_t live_blocks(const Cache& c, int layer, int h) {
  std::size_t n = 0;
  for (std::uint64_t w : c.block_mask(layer, h)) n += static_cast<std::size_t>(std::popcount(w));
  return n;
}
template <class Cache>
bool is_live(const Cache& c, int layer, int h, std::size_t b) {
  return ((c.block_mask(layer, h)[b / 64] >> (b % 64)) & 1u) != 0;
}
bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Decode stream with B = 16, budget 128 tokens = 8 blocks, 1 sink block, 1 recent + the open one.
template <class Backend>
using Sparse = KVCache<Keys<Int4<Group<16>>>, Values<Int8<Group<16>>>, BlockSparse<Tokens<128>, 16, 1, 1>, Backend>;

template <class Cache>
void masked_blocks_are_never_read() {
  constexpr int D = 32, KV = 2, QH = 6;
  auto c = Cache::create({.layers = 1, .q_heads = QH, .kv_heads = KV, .head_dim = D, .max_tokens = 512}).value();
  const std::size_t row = KV * D, qrow = QH * D;
  // 31-token prompt, then decode; query positions start at 1000 (positions are not indices).
  ASSERT_TRUE(c.append(0, kvtest::normal(31 * row, 1), kvtest::normal(31 * row, 2), kvtest::iota_positions(1000, 31)));
  std::vector<float> out(31 * qrow);
  ASSERT_TRUE(c.attend(0, kvtest::normal(31 * qrow, 3), out));
  bool checked = false;
  for (int s = 0; s < 300; ++s) {
    ASSERT_TRUE(c.append(0, kvtest::normal(row, 10 + s), kvtest::normal(row, 5000 + s), kvtest::iota_positions(1031 + s, 1)));
    const auto q = kvtest::normal(qrow, 9000 + s);
    EXPECT_LE(kvtest::evicting_attend_error(c, 0, q), 1e-5) << "step " << s;
    for (int h = 0; h < KV; ++h) {
      EXPECT_LE(c.held_tokens(0, h), 128);
      EXPECT_LE(c.blocks(0, h).size(), 2 * live_blocks(c, 0, h) + 1);
    }
    // Where a head has masked-out blocks still allocated, poison their payload: output unchanged.
    if (s % 7 != 3) continue;
    std::vector<float> before(qrow), after(qrow);
    ASSERT_TRUE(c.attend(0, q, before));
    std::size_t poisoned = 0;
    for (int h = 0; h < KV; ++h) {
      const auto blocks = c.blocks(0, h);
      for (std::size_t b = 0; b < blocks.size(); ++b)
        if (!is_live(c, 0, h, b)) {
          std::memset(blocks[b].data.get(), 0xFF, c.block_layout().bytes);  // NaN scales, garbage codes
          ++poisoned;
        }
    }
    ASSERT_TRUE(c.attend(0, q, after));
    EXPECT_TRUE(bit_equal(before, after)) << "step " << s << ": a masked-out block was read";
    checked |= poisoned > 0;
  }
  EXPECT_TRUE(checked) << "the stream must reach states with masked, not yet compacted blocks";
}

TEST(BlockSparse, MaskedBlocksAreNeverReadScalar) { masked_blocks_are_never_read<Sparse<Backend<Scalar>>>(); }
TEST(BlockSparse, MaskedBlocksAreNeverReadAuto) { masked_blocks_are_never_read<Sparse<Backend<Auto>>>(); }

// The poison test can fail: poisoning a LIVE block changes (breaks) the output.
TEST(BlockSparse, PoisoningALiveBlockIsSeen) {
  using C = Sparse<Backend<Auto>>;
  auto c = C::create({.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 32, .max_tokens = 512}).value();
  for (int t = 0; t < 60; ++t)
    ASSERT_TRUE(c.append(0, kvtest::normal(32, 10 + t), kvtest::normal(32, 500 + t), kvtest::iota_positions(t, 1)));
  const auto q = kvtest::normal(64, 7);
  std::vector<float> before(64), after(64);
  ASSERT_TRUE(c.attend(0, q, before));
  ASSERT_TRUE(is_live(c, 0, 0, 1));
  std::memset(c.blocks(0, 0)[1].data.get(), 0x7F, c.block_layout().bytes);
  // Seen either as a changed output or, since attend reports a non-finite output (0x7F7F scales
  // are fp16 NaN), as Errc::non_finite.
  const Status st = c.attend(0, q, after);
  if (st) {
    EXPECT_FALSE(bit_equal(before, after));
  } else {
    EXPECT_EQ(st.error().code, Errc::non_finite) << st.error().message;
  }
}

// RoPE (adjacent pairs) at position pos, theta 10000, in float64.
std::vector<double> rope64(const std::vector<float>& x, int D, int pos) {
  std::vector<double> y(x.begin(), x.end());
  for (int i = 0; i < D / 2; ++i) {
    const double a = pos * std::pow(10000.0, -2.0 * i / D);
    y[2 * i] = x[2 * i] * std::cos(a) - x[2 * i + 1] * std::sin(a);
    y[2 * i + 1] = x[2 * i] * std::sin(a) + x[2 * i + 1] * std::cos(a);
  }
  return y;
}

TEST(BlockSparse, CompactionKeepsOutputExactAndOriginalPositions) {
  constexpr int D = 64;
  using C = KVCache<Keys<Fp32>, Values<Fp32>, BlockSparse<Tokens<128>, 16, 1, 1>>;
  auto c = C::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 512}).value();
  std::vector<std::vector<float>> raw_k, raw_v;
  const int T = 213;  // odd
  for (int t = 0; t < T; ++t) {
    raw_k.push_back(kvtest::normal(D, 100 + static_cast<uint32_t>(t)));
    raw_v.push_back(kvtest::normal(D, 9000 + static_cast<uint32_t>(t)));
    const auto kr = rope64(raw_k.back(), D, 7 + 3 * t);  // positions 7 + 3t, not the indices
    std::vector<float> kf(kr.begin(), kr.end());
    ASSERT_TRUE(c.append(0, kf, raw_v.back(), std::vector<int32_t>{7 + 3 * t}));
    std::vector<float> q = kvtest::normal(D, 50000 + static_cast<uint32_t>(t)), out(D);
    ASSERT_TRUE(c.attend(0, q, out));
  }
  ASSERT_LT(live_blocks(c, 0, 0), c.blocks(0, 0).size()) << "need masked blocks before compacting";
  const auto kept = kvtest::kept_indices(c, 0, 0);
  const auto q64 = rope64(kvtest::normal(D, 777), D, 7 + 3 * (T - 1));
  const std::vector<float> q(q64.begin(), q64.end());
  std::vector<float> before(D), after(D);
  ASSERT_TRUE(c.attend(0, q, before));
  ASSERT_TRUE(c.compact_blocks(0));
  // Dense: every allocated block live, all but the last full.
  EXPECT_EQ(live_blocks(c, 0, 0), c.blocks(0, 0).size());
  EXPECT_EQ(kvtest::kept_indices(c, 0, 0), kept);
  ASSERT_TRUE(c.attend(0, q, after));
  EXPECT_TRUE(bit_equal(before, after)) << "compaction changed the attention output";
  // ref64 over exactly the kept tokens, keys rotated at their ORIGINAL positions 7 + 3 * index.
  const auto rb = c.read_back(0, 0).value();
  std::vector<double> K, V;
  for (std::size_t r = 0; r < rb.indices.size(); ++r) {
    const int t = static_cast<int>(rb.indices[r]);
    EXPECT_EQ(rb.positions[r], 7 + 3 * t);
    const auto kr = rope64(raw_k[static_cast<size_t>(t)], D, 7 + 3 * t);
    K.insert(K.end(), kr.begin(), kr.end());
    V.insert(V.end(), raw_v[static_cast<size_t>(t)].begin(), raw_v[static_cast<size_t>(t)].end());
  }
  const auto ref = kvtest::attention_ref64(K, V, static_cast<int64_t>(rb.indices.size()), q, 1, 1, 1, D, 1.0 / 8.0,
                                           static_cast<int64_t>(rb.indices.size()) - 1);
  EXPECT_LE(kvtest::max_rel_error(after, ref, D), 1e-5);
  // Kept tokens come in whole blocks of 16 consecutive indices (plus the open block and the chunk).
  std::set<int64_t> firsts;
  for (int64_t i : kept) firsts.insert(i / 16);
  for (int64_t b : firsts)
    for (int64_t i = b * 16; i < std::min<int64_t>(b * 16 + 16, T); ++i)
      EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), i)) << "block " << b << " kept partly";
  EXPECT_LE(static_cast<int64_t>(kept.size()), 128);
  EXPECT_GT(static_cast<int64_t>(kept.size()), 128 - 16);
}

// Which blocks go: lowest summed attention mass, never the sink block or the recent/open blocks.
TEST(BlockSparse, KeepsTheHeavyBlockTheSinkBlockAndRecentBlocks) {
  constexpr int D = 16;
  using C = KVCache<BlockSparse<Tokens<96>, 16, 1, 2>>;  // 6 blocks: sink + heavy + 2 recent + open + 1
  auto c = C::create({.layers = 1, .q_heads = 4, .kv_heads = 1, .head_dim = D, .max_tokens = 1024}).value();
  std::vector<float> e0(D, 0.f);
  e0[0] = 1.f;
  for (int t = 0; t < 400; ++t) {
    auto k = kvtest::normal(D, 1 + static_cast<uint32_t>(t), 0.05f);
    if (t >= 48 && t < 64) k[0] = 4.f;  // block 3: the heavy hitter for queries along e0
    ASSERT_TRUE(c.append(0, k, kvtest::normal(D, 5000 + static_cast<uint32_t>(t)), kvtest::iota_positions(t, 1)));
    std::vector<float> q, out(4 * D);
    for (int j = 0; j < 4; ++j) q.insert(q.end(), e0.begin(), e0.end());
    ASSERT_TRUE(c.attend(0, q, out));
    const auto kept = kvtest::kept_indices(c, 0, 0);
    ASSERT_LE(static_cast<int>(kept.size()), 96) << "t=" << t;
    if (t < 96) continue;
    ASSERT_GT(static_cast<int>(kept.size()), 96 - 16) << "t=" << t;
    std::set<int64_t> s(kept.begin(), kept.end());
    for (int64_t i = 0; i < 16; ++i) EXPECT_TRUE(s.count(i)) << "sink block lost at t=" << t;
    for (int64_t i = 48; i < 64; ++i) EXPECT_TRUE(s.count(i)) << "heavy block lost at t=" << t;
    // Open block and the 2 full blocks before it: every token from the start of the block before
    // last-but-one full block.
    const int64_t open_first = (t / 16) * 16;
    for (int64_t i = std::max<int64_t>(open_first - 32, 0); i <= t; ++i)
      EXPECT_TRUE(s.count(i)) << "recent token " << i << " lost at t=" << t;
  }
}

TEST(BlockSparse, OddChunksAndGqaMatchRef64OverHeldRows) {
  using C = KVCache<Keys<Int8<Group<32>>>, Values<Int4<Group<32>>>, Sinks<3>, BlockSparse<Tokens<160>, 32, 1, 1>>;
  constexpr int D = 64, KV = 2, QH = 8;
  auto c = C::create({.layers = 2, .q_heads = QH, .kv_heads = KV, .head_dim = D, .max_tokens = 2048}).value();
  const std::size_t row = KV * D, qrow = QH * D;
  int64_t pos = 0;
  uint32_t seed = 1;
  for (int n : {1, 31, 33, 95, 1, 1, 33, 95, 31, 1, 95, 1}) {
    for (int layer = 0; layer < 2; ++layer) {
      const auto k = kvtest::normal(n * row, seed++);
      const auto v = kvtest::normal(n * row, seed++);
      ASSERT_TRUE(c.append(layer, k, v, kvtest::iota_positions(pos, n)));
      EXPECT_LE(kvtest::evicting_attend_error(c, layer, kvtest::normal(n * qrow, seed++)), 1e-5) << "chunk " << n;
      // Held before the next append: budget plus the latest chunk (committed lazily).
      for (int h = 0; h < KV; ++h) EXPECT_LE(c.held_tokens(layer, h), 160 + n);
    }
    pos += n;
  }
  EXPECT_EQ(c.tokens(0), pos);
  EXPECT_LT(c.held_tokens(0, 0), pos);
}

TEST(BlockSparse, MemoryBoundedOverAMillionTokens) {
  constexpr int D = 16;
  using C = KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, BlockSparse<Tokens<256>, 16>>;
  auto c = C::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 1024}).value();
  std::vector<float> kv = kvtest::normal(D, 5);
  std::size_t peak = 0, peak_blocks = 0;
  // A short sweep (sanitizers, qemu) stops at 250k tokens: 150k past the peak's 100k, every block
  // of the ring reused hundreds of times over.
  const int total = kvtest::short_sweep() ? 250'000 : 1'000'000;
  for (int t = 0; t < total; ++t) {
    kv[1] = static_cast<float>(t % 977);
    ASSERT_TRUE(c.append(0, kv, kv, std::vector<int32_t>{t}));
    if (t < 100'000) {
      peak = std::max(peak, c.memory_bytes());
      peak_blocks = std::max(peak_blocks, c.blocks(0, 0).size());
    } else if (t % 1024 == 0 || t > total - 64) {
      ASSERT_LE(c.memory_bytes(), peak) << "t=" << t;
      ASSERT_LE(c.blocks(0, 0).size(), peak_blocks) << "t=" << t;
    }
  }
  EXPECT_LE(peak_blocks, 2u * (256 / 16) + 1);
  EXPECT_LE(c.held_tokens(0), 256);
  EXPECT_GT(c.held_tokens(0), 256 - 16);
  EXPECT_EQ(c.tokens(0), total);
}

TEST(EvictionBudget, TokensAndFractionOfTheContext) {
  using Quarter = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, BlockSparse<Fraction<1, 4>, 64>>;
  auto c = Quarter::create({.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 4096}).value();
  EXPECT_EQ(c.eviction_budget(), 1024);
  auto odd = Quarter::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 64, .max_tokens = 4099}).value();
  EXPECT_EQ(odd.eviction_budget(), 1024);  // floor
  // A fraction too small for the protected blocks (3 * 64 tokens) is rejected at create().
  auto small = Quarter::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 64, .max_tokens = 767});
  ASSERT_FALSE(small);
  EXPECT_EQ(small.error().code, Errc::invalid_argument);
  EXPECT_TRUE(Quarter::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 64, .max_tokens = 768}));
  using Fixed = KVCache<BlockSparse<Tokens<300>, 32>>;
  EXPECT_EQ(Fixed::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 8, .max_tokens = 10000})->eviction_budget(),
            300);
  EXPECT_EQ(Fixed::block_tokens, 32);
  EXPECT_EQ((KVCache<SinkWindow<4, 60>>::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 8, .max_tokens = 99})
                 ->eviction_budget()),
            64);
  EXPECT_EQ((Fraction<1, 2>::resolve(4096)), 2048);
  EXPECT_EQ((Fraction<1, 4>::resolve(3)), 1);  // at least one token
}

TEST(BlockSparse, ResetStartsOver) {
  using C = KVCache<BlockSparse<Tokens<48>, 16, 1, 1>>;
  auto c = C::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 8, .max_tokens = 256}).value();
  for (int t = 0; t < 200; ++t) ASSERT_TRUE(c.append(0, kvtest::normal(8, 1 + static_cast<uint32_t>(t)), kvtest::normal(8, 2), kvtest::iota_positions(t, 1)));
  c.reset();
  EXPECT_EQ(c.memory_bytes(), 0u);
  EXPECT_TRUE(c.block_mask(0, 0).empty());
  for (int t = 0; t < 5; ++t) ASSERT_TRUE(c.append(0, kvtest::normal(8, 1), kvtest::normal(8, 2), kvtest::iota_positions(t, 1)));
  EXPECT_EQ(kvtest::kept_indices(c, 0, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

}  // namespace
