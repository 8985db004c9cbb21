// Positions without a per-slot int32 (issue 20): PositionRuns' run-length coding, and caches
// without eviction (PreRope included) keeping one run list per layer instead of 4 bytes per token
// and KV head in every block; evicting caches still store slot positions.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

std::vector<std::int32_t> decode_all(const PositionRuns& r) {
  std::vector<std::int32_t> out;
  for (std::int64_t i = 0; i < r.size(); ++i) out.push_back(r.at(i));
  return out;
}

TEST(PositionRuns, ConsecutivePositionsAreOneRun) {
  PositionRuns r;
  const auto a = kvtest::iota_positions(0, 31), b = kvtest::iota_positions(31, 33);
  EXPECT_EQ(r.runs_added(a, b), 1u);
  r.push(a.data(), 31);
  EXPECT_EQ(r.runs_added(b), 0u);
  r.push(b.data(), 33);
  EXPECT_EQ(r.size(), 64);
  ASSERT_EQ(r.runs().size(), 1u);
  EXPECT_EQ(r.held_bytes(), sizeof(PositionRuns::Run));
  EXPECT_EQ(decode_all(r), kvtest::iota_positions(0, 64));
}

TEST(PositionRuns, JumpsRepeatsAndDescentsEachStartARun) {
  const std::vector<std::int32_t> p{5, 6, 7, 100, 101, 101, 3, 2, 0, 1, INT32_MAX - 1, INT32_MAX, 0};
  PositionRuns r;
  EXPECT_EQ(r.runs_added(p), 8u);  // 5.., 100.., 101, 3, 2, 0.., INT32_MAX-1.., 0
  r.push(p.data(), static_cast<std::int64_t>(p.size()));
  EXPECT_EQ(r.runs().size(), 8u);
  EXPECT_EQ(decode_all(r), p);
  r.push_consecutive(1, 4);  // continues the last run: 0, 1, 2, 3, 4
  EXPECT_EQ(r.runs().size(), 8u);
  r.push_consecutive(9, 2);
  EXPECT_EQ(r.runs().size(), 9u);
  auto want = p;
  for (std::int32_t x : {1, 2, 3, 4, 9, 10}) want.push_back(x);
  EXPECT_EQ(decode_all(r), want);
  r.wipe();
  EXPECT_EQ(r.size(), 0);
  EXPECT_EQ(r.allocated_bytes(), 0u);
}

TEST(PositionRuns, ReservedRunsAreNotReallocated) {
  PositionRuns r;
  const std::vector<std::int32_t> p{0, 2, 4, 6, 8};
  r.reserve_runs(r.runs_added(p));
  const std::size_t cap = r.allocated_bytes();
  r.push(p.data(), 5);
  EXPECT_EQ(r.allocated_bytes(), cap);
  EXPECT_EQ(r.runs().size(), 5u);
}

TEST(PositionRuns, TruncateKeepsTheFirstTokensWithoutAllocating) {
  const std::vector<std::int32_t> p{0, 1, 2, 3, 10, 11, 12, 4, 5, 20};
  PositionRuns r;
  r.push(p.data(), static_cast<std::int64_t>(p.size()));
  EXPECT_EQ(r.leading_indices(), 4);  // 0, 1, 2, 3 sit at their indices
  const std::size_t cap = r.allocated_bytes();
  for (const std::int64_t n : {10, 9, 8, 6, 5, 4, 3, 0}) {
    r.truncate(n);
    EXPECT_EQ(r.size(), n);
    EXPECT_EQ(decode_all(r), std::vector<std::int32_t>(p.begin(), p.begin() + n)) << n;
    EXPECT_EQ(r.allocated_bytes(), cap);
  }
  EXPECT_TRUE(r.runs().empty());
  EXPECT_EQ(r.leading_indices(), 0);
  r.push_consecutive(0, 40);
  EXPECT_EQ(r.leading_indices(), 40);
  r.push_consecutive(7, 1);
  EXPECT_EQ(r.leading_indices(), 40);
  PositionRuns shifted;
  shifted.push_consecutive(1, 8);
  EXPECT_EQ(shifted.leading_indices(), 0);
}

using Dense = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Blocks<16>>;
using DenseKivi = KVCache<Keys<Int4<Group<16>>, PerChannel>, Values<Int4<Group<32>>>, Blocks<16>, Sinks<3>, Residual<5>>;
using Evicting = KVCache<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>, H2O<8, 24>>;
using Rotating = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, PreRope<>>;

static_assert(!Dense::slot_positions && !DenseKivi::slot_positions);
static_assert(Evicting::slot_positions && !Rotating::slot_positions);

ModelShape shape() { return {.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 512}; }

// Appends chunks of 1, 31, 33 and 95 tokens at the given positions; returns them all.
template <class Cache>
std::vector<std::int32_t> fill(Cache& c, const std::vector<std::int32_t>& pos) {
  const std::size_t row = 2 * 64;
  std::size_t t = 0;
  for (std::size_t n : {std::size_t{1}, std::size_t{31}, std::size_t{33}, std::size_t{95}}) {
    n = std::min(n, pos.size() - t);
    const auto k = kvtest::normal(n * row, static_cast<std::uint32_t>(t + 1));
    const auto v = kvtest::normal(n * row, static_cast<std::uint32_t>(t + 7));
    const std::vector<std::int32_t> p(pos.begin() + static_cast<std::ptrdiff_t>(t), pos.begin() + static_cast<std::ptrdiff_t>(t + n));
    for (int l = 0; l < 2; ++l) EXPECT_TRUE(c.append(l, k, v, p));
    t += n;
  }
  return std::vector<std::int32_t>(pos.begin(), pos.begin() + static_cast<std::ptrdiff_t>(t));
}

std::vector<std::int32_t> irregular(int n) {
  std::vector<std::int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(i < 40 ? i : i < 70 ? 1000 + i : i < 75 ? 7 : 2000 + i);
  return p;
}

template <class Cache>
void expect_positions_read_back(const std::vector<std::int32_t>& pos) {
  auto c = Cache::create(shape()).value();
  const auto want = fill(c, pos);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) {
      const auto rb = c.read_back(l, h).value();
      std::vector<std::int32_t> got(rb.positions.begin(), rb.positions.end());
      got.insert(got.end(), want.end() - static_cast<std::ptrdiff_t>(c.tokens(l) - static_cast<std::int64_t>(rb.positions.size())), want.end());  // the latest chunk
      EXPECT_EQ(got, want) << "layer " << l << " kv head " << h;
    }
}

TEST(CachePositions, DenseCachesReadBackEveryPosition) {
  expect_positions_read_back<Dense>(kvtest::iota_positions(0, 160));
  expect_positions_read_back<Dense>(irregular(160));
  expect_positions_read_back<DenseKivi>(kvtest::iota_positions(0, 160));
  expect_positions_read_back<DenseKivi>(irregular(160));
}

TEST(CachePositions, DenseBlocksHoldNoPositions) {
  auto c = Dense::create(shape()).value();
  EXPECT_EQ(c.block_layout().pos_bytes, 0u);
  EXPECT_EQ(c.block_layout().bytes, c.block_layout().positions);  // the payload ends with V metadata
  fill(c, kvtest::iota_positions(0, 160));
  EXPECT_EQ(c.block_positions(0).size(), c.quantized_tokens(0));
  EXPECT_EQ(c.block_positions(1).runs().size(), 1u);
  auto d = Dense::create(shape()).value();
  fill(d, irregular(160));
  EXPECT_EQ(d.block_positions(0).runs().size(), 8u);  // 0.., 1040.., five runs of one 7 each, 2075..
  EXPECT_EQ(d.memory_bytes() - c.memory_bytes(), 2 * 7 * sizeof(PositionRuns::Run));
}

TEST(CachePositions, EvictingCachesStoreSlotPositions) {
  auto e = Evicting::create(shape()).value();
  EXPECT_EQ(e.block_layout().pos_bytes, sizeof(std::int32_t));
}

// PreRope caches keep runs too (test_pre_rope.cpp checks their attention against float64 with
// consecutive, jumping and per-token positions).
TEST(CachePositions, PreRopeBlocksHoldNoPositions) {
  auto r = Rotating::create(shape()).value();
  EXPECT_EQ(r.block_layout().pos_bytes, 0u);
  expect_positions_read_back<Rotating>(irregular(160));
  auto c = Rotating::create(shape()).value();
  fill(c, kvtest::iota_positions(0, 160));
  EXPECT_EQ(c.block_positions(0).runs().size(), 1u);
}

// Block storage is the codec's bits per value exactly, once the 16-byte block headers (0.06 bits
// per value at 16 tokens x 64 x 2 values), the fp32 rows and one run per layer are set aside.
TEST(CachePositions, BitsPerValueApproachTheCodecs) {
  auto c = Dense::create(shape()).value();
  fill(c, kvtest::iota_positions(0, 160));
  const double values = 2.0 * 2 * 2 * 64 * static_cast<double>(c.quantized_tokens(0));  // layers x heads x K,V x D
  const double blocks = 2.0 * 2 * static_cast<double>(c.blocks(0, 0).size());
  const double fp_rows = 2.0 * static_cast<double>(c.tokens(0) - c.quantized_tokens(0)) * (2 * 64 * 8 + 4);
  const double bits = 8.0 * (static_cast<double>(c.memory_bytes()) - fp_rows - blocks * sizeof(BlockHeader) -
                             2 * sizeof(PositionRuns::Run)) / values;
  EXPECT_DOUBLE_EQ(bits, (Dense::key_bits_per_value + Dense::value_bits_per_value) / 2);
}

}  // namespace
