// The append's one-pass NaN/Inf check and copy (cache/chunk_stage.hpp): copy_finite against
// std::isfinite at odd sizes and every position, and KVCache keeping each layer's latest chunk
// exact while the staged buffers are swapped between layers, with the stage counted in
// allocated_bytes and a rejected append changing nothing; prefill-sized buffers (latest-chunk
// copies, pending rows) released once decoding runs (ChunkStage, PendingRows::shrink_for).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace chunk_stage_test {

using namespace kvpack;  // NOLINT: test file

std::vector<float> finite_values(std::size_t n) {
  const float edge[] = {0.f, -0.f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                        std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(), 1.5f};
  std::vector<float> x = kvtest::normal(n, 3);
  for (std::size_t i = 0; i < n; ++i)
    if (i % 5 == 0) x[i] = edge[(i / 5) % 7];
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

TEST(CopyFinite, CopiesEveryValueAndFindsEachNonFiniteOne) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::bit_cast<float>(0x7F800001u)};  // a signalling NaN
  for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 31u, 32u, 33u, 64u, 95u, 130u}) {  // the AVX2 loop takes 32 at a time
    std::vector<float> src = finite_values(n), dst(n, 7.f);
    EXPECT_TRUE(copy_finite(src.data(), dst.data(), n)) << n;
    EXPECT_TRUE(same_bits(src, dst)) << n;
    for (std::size_t at = 0; at < n; ++at)
      for (float b : bad) {
        src = finite_values(n);
        src[at] = b;
        std::fill(dst.begin(), dst.end(), 7.f);
        EXPECT_FALSE(copy_finite(src.data(), dst.data(), n)) << n << " at " << at;
        EXPECT_TRUE(same_bits(src, dst)) << "the copy completes: " << n << " at " << at;
      }
  }
}

TEST(ShrinkBuffers, PendingRowsShrinkKeepsTheLiveRowsAndScores) {
  constexpr std::size_t row = 128;
  PendingRows p;
  p.configure(row, 2);
  p.reserve(600);
  const auto k = kvtest::normal(600 * row, 2), v = kvtest::normal(600 * row, 3);
  const auto pos = kvtest::iota_positions(0, 600);
  p.push(k.data(), v.data(), pos.data(), 600);
  for (std::int64_t i = 0; i < 600; ++i) p.score(i, 1) = static_cast<float>(i);
  p.drop_front(597);
  const std::size_t big = p.allocated_bytes();
  p.shrink_for(1);
  EXPECT_LT(p.allocated_bytes() * 50, big);
  ASSERT_EQ(p.size(), 3);
  for (std::int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p.position(i), 597 + i);
    EXPECT_EQ(p.score(i, 1), static_cast<float>(597 + i));
    EXPECT_EQ(p.k()[i * row + 7], k[(597 + i) * row + 7]);
    EXPECT_EQ(p.v()[i * row + 127], v[(597 + i) * row + 127]);
  }
  const std::size_t small = p.allocated_bytes();
  p.shrink_for(1);  // no longer oversized: unchanged
  EXPECT_EQ(p.allocated_bytes(), small);
}

constexpr int kD = 64, kKvHeads = 2, kQHeads = 4, kLayers = 3;
constexpr std::size_t kRow = kKvHeads * kD;

/// An fp32 cache: blocks hold the rows exactly too, so attention over the latest chunk can only
/// go wrong if its copy is another layer's or a stale one.
using Exact = KVCache<Keys<Fp32>, Values<Fp32>, Backend<Scalar>>;
using Int4Cache = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>;
constexpr ModelShape kShape{.layers = kLayers, .q_heads = kQHeads, .kv_heads = kKvHeads, .head_dim = kD, .max_tokens = 600};

TEST(ChunkStage, EachLayersLatestChunkStaysExactAcrossSwaps) {
  Exact c = Exact::create(kShape).value();
  std::vector<std::vector<float>> all_k(kLayers), all_v(kLayers);
  std::vector<std::size_t> last_n(kLayers, 0);
  std::uint32_t seed = 10;
  // Chunk sizes that grow and shrink, layers visited out of order: the stage holds another
  // layer's previous chunk each time and is resized.
  const int plan[][2] = {{0, 95}, {2, 1}, {1, 33}, {0, 1}, {2, 200}, {1, 31}, {0, 17}, {2, 3}, {1, 95}, {0, 64}};
  for (const auto& step : plan) {
    const int layer = step[0];
    const auto n = static_cast<std::size_t>(step[1]);
    const auto k = kvtest::normal(n * kRow, ++seed), v = kvtest::normal(n * kRow, ++seed);
    const auto first = static_cast<std::int64_t>(all_k[layer].size() / kRow);
    ASSERT_TRUE(c.append(layer, k, v, kvtest::iota_positions(first, static_cast<std::int64_t>(n))));
    all_k[layer].insert(all_k[layer].end(), k.begin(), k.end());
    all_v[layer].insert(all_v[layer].end(), v.begin(), v.end());
    last_n[layer] = n;
    for (int l = 0; l < kLayers; ++l) {  // every layer, not only the one appended to
      if (last_n[l] == 0) continue;
      const int n_q = static_cast<int>(std::min<std::size_t>(last_n[l], 3));
      const auto q = kvtest::normal(static_cast<std::size_t>(n_q) * kQHeads * kD, ++seed);
      std::vector<float> out(q.size());
      ASSERT_TRUE(c.attend(l, q, out));
      const std::int64_t n_keys = static_cast<std::int64_t>(all_k[l].size() / kRow);
      const std::vector<double> K(all_k[l].begin(), all_k[l].end()), V(all_v[l].begin(), all_v[l].end());
      const auto ref = kvtest::attention_ref64(K, V, n_keys, q, n_q, kQHeads, kKvHeads, kD, 1.0 / std::sqrt(double{kD}),
                                               n_keys - n_q);
      EXPECT_LT(kvtest::max_rel_error(out, ref, kD), 1e-5) << "layer " << l << " after appending to layer " << layer;
    }
  }
}

TEST(ChunkStage, TheStageIsCountedAndDirectTokensReserveNoPendingRows) {
  Int4Cache c = Int4Cache::create(kShape).value();
  const std::int64_t n = 200;
  ASSERT_TRUE(c.append(0, kvtest::normal(n * kRow, 1), kvtest::normal(n * kRow, 2), kvtest::iota_positions(0, n)));
  // The layer's chunk copy and the stage each hold at least n rows of K and of V; the pending
  // rows hold none (every token was encoded directly, without a residual window), so besides the
  // 8 int4 blocks (about 41 KB) nothing near another n rows is allocated.
  const std::size_t rows = 2 * static_cast<std::size_t>(n) * kRow * sizeof(float);
  EXPECT_GE(c.allocated_bytes(), 2 * rows);
  EXPECT_LT(c.allocated_bytes(), 2 * rows + 64 * 1024);
}

TEST(ChunkStage, PrefillChunkCopiesAreReleasedByTheFirstDecodeStep) {
  Int4Cache c = Int4Cache::create(kShape).value();
  const std::int64_t n = 200;
  for (int l = 0; l < kLayers; ++l)
    ASSERT_TRUE(c.append(l, kvtest::normal(n * kRow, 1), kvtest::normal(n * kRow, 2), kvtest::iota_positions(0, n)));
  const std::size_t chunk_bytes = 2 * static_cast<std::size_t>(n) * kRow * sizeof(float);  // K and V
  EXPECT_GT(c.allocated_bytes(), c.memory_bytes() + kLayers * chunk_bytes);  // each layer keeps its chunk
  for (int l = 0; l < kLayers; ++l)
    ASSERT_TRUE(c.append(l, kvtest::normal(kRow, 3), kvtest::normal(kRow, 4), kvtest::iota_positions(n, 1)));
  // Left: the blocks' unused slots (3 layers x 2 heads x under one 64-token block) and small
  // vectors, far below one prefill chunk.
  EXPECT_LT(c.allocated_bytes(), c.memory_bytes() + 64 * 1024);
  EXPECT_EQ(c.tokens(2), n + 1);
}

TEST(ChunkStage, NonFiniteKAndVReportKFirstAndChangeNothing) {
  Exact c = Exact::create(kShape).value();
  const auto k0 = kvtest::normal(40 * kRow, 5), v0 = kvtest::normal(40 * kRow, 6);
  ASSERT_TRUE(c.append(1, k0, v0, kvtest::iota_positions(0, 40)));
  const auto q = kvtest::normal(2 * kQHeads * kD, 4);
  std::vector<float> before(q.size()), after(q.size());
  ASSERT_TRUE(c.attend(1, q, before));
  const std::size_t allocated = c.allocated_bytes();
  auto k = kvtest::normal(512 * kRow, 7), v = kvtest::normal(512 * kRow, 8);
  v[3 * kRow + 2] = std::numeric_limits<float>::infinity();
  k[511 * kRow + kRow - 1] = std::numeric_limits<float>::quiet_NaN();
  const Status s = c.append(1, k, v, kvtest::iota_positions(40, 512));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::non_finite);
  EXPECT_NE(s.error().message.find("non-finite K value nan at layer 1, kv head 1, token 511 of the chunk (cache index 551), channel 63"),
            std::string::npos)
      << s.error().message;
  k[511 * kRow + kRow - 1] = 0.f;  // now only V is bad
  const Status sv = c.append(1, k, v, kvtest::iota_positions(40, 512));
  ASSERT_FALSE(sv);
  EXPECT_NE(sv.error().message.find("non-finite V value inf at layer 1, kv head 0, token 3 of the chunk (cache index 43), channel 2"),
            std::string::npos)
      << sv.error().message;
  EXPECT_EQ(c.tokens(1), 40);
  // Checked before anything is reserved: the rejected 512 tokens grew no buffer (the stage they
  // were copied into is released).
  EXPECT_LE(c.allocated_bytes(), allocated);
  ASSERT_TRUE(c.attend(1, q, after));  // the latest chunk (and its queries) are as they were
  EXPECT_TRUE(same_bits(before, after));
  ASSERT_TRUE(c.append(1, kvtest::normal(kRow, 9), kvtest::normal(kRow, 10), kvtest::iota_positions(40, 1)));
  EXPECT_EQ(c.tokens(1), 41);
}

}  // namespace chunk_stage_test
