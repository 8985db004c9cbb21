// Issue 23 item 5: keyframe coding cost bytes where it coded nothing. Keyframe<8, Int4, Fp16>
// keys, head_dim 64, 96 tokens of N(0,1) (seed 1): no interval is in delta mode, yet the cache
// held 9312 bytes against 8096 for plain Int4 keys (6.375 vs 5.0 bits per key value): every
// interval paid its fp16 keyframe. Now a plain interval is stored as the plain codec's rows, a
// delta interval as keyframe + deltas, and a block is allocated at its modes' size:
//  * all-plain intervals: memory_bytes equals the same cache with plain Int4 keys and the same
//    Blocks<8> (8256 bytes), i.e. the 8096 plus one 16-byte BlockHeader for each of the 10
//    extra blocks (12 blocks of 8 tokens instead of 2 of 64: the documented per-block overhead);
//    the keys read back equal plain Int4's; stored_bits() reports 5.0 bits per key value;
//  * delta intervals cost exactly keyframe - delta row bytes more each (all delta: 9312 again);
//  * every committed block is allocated at BlockLayout::at(flags).bytes (allocated_bytes sees it).
// On the scalar kernel and the build's SIMD backend (Backend<Auto>: AVX2, NEON).
// Since issue 20 these caches store no per-slot positions (KVCache::slot_positions): every figure
// above is 4 bytes per token lower and holds one 8-byte position run instead (kPositions).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvpack/kv_cache.hpp"
#include "support/reference.hpp"

namespace test_keyframe_bytes {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file

constexpr int D = 64, N = 96, I = 8;
using Kf = Keyframe<I, Int4<>, Fp16>;
const ModelShape kShape{.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 256};
// The figures counted an int32 position per token; now one run holds all N positions.
constexpr size_t kPositions = sizeof(PositionRuns::Run) - 4 * size_t{N};

template <class B>
class KeyframeBytes : public ::testing::Test {};
using Backends = ::testing::Types<Backend<Scalar>, Backend<Auto>>;
TYPED_TEST_SUITE(KeyframeBytes, Backends);

template <class Cache>
Cache filled(const std::vector<float>& k, const std::vector<float>& v) {
  auto c = Cache::create(kShape).value();
  EXPECT_TRUE(c.append(0, k, v, kvtest::iota_positions(0, static_cast<int64_t>(k.size() / D))));
  return c;
}

// Per-interval key data: interval i drifts slowly (a random walk of step 0.02 around a common
// base: delta mode wins) when smooth(i), else i.i.d. N(0, 1) (plain mode wins).
template <class F>
std::vector<float> keys(F smooth) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<float> k(static_cast<size_t>(N) * D), walk(D);
  for (int t = 0; t < N; ++t) {
    if (t % I == 0)
      for (int d = 0; d < D; ++d) walk[static_cast<size_t>(d)] = 3.f * n01(rng);
    for (int d = 0; d < D; ++d) {
      float& w = walk[static_cast<size_t>(d)];
      w += 0.02f * n01(rng);
      k[static_cast<size_t>(t) * D + static_cast<size_t>(d)] = smooth(t / I) ? w : n01(rng);
    }
  }
  return k;
}

TYPED_TEST(KeyframeBytes, AllPlainIntervalsCostThePlainCodec) {
  using KfCache = KVCache<Keys<Kf>, Values<Int4<>>, TypeParam>;
  using Plain8 = KVCache<Keys<Int4<>>, Values<Int4<>>, Blocks<I>, TypeParam>;
  using Plain64 = KVCache<Keys<Int4<>>, Values<Int4<>>, TypeParam>;  // the plain figure
  const auto k = kvtest::normal(static_cast<size_t>(N) * D, 1), v = kvtest::normal(k.size(), 2);
  const auto kf = filled<KfCache>(k, v);
  const auto plain8 = filled<Plain8>(k, v);
  const auto plain64 = filled<Plain64>(k, v);
  ASSERT_EQ(kf.quantized_tokens(0), N);
  ASSERT_EQ(kf.blocks(0, 0).size(), static_cast<size_t>(N / I));
  for (const Block& b : kf.blocks(0, 0)) ASSERT_EQ(b.header.flags & 2u, 0u) << "N(0,1) keys: every interval plain";

  EXPECT_EQ(plain64.memory_bytes(), 8096u + kPositions);
  EXPECT_EQ(plain8.memory_bytes(), 8096u + kPositions + 10 * sizeof(BlockHeader));
  EXPECT_EQ(kf.memory_bytes(), plain8.memory_bytes()) << "was 9312: the fp16 keyframe paid in every plain interval";
  // A plain interval is the plain codec: same reconstruction, 5.0 bits per key value measured.
  EXPECT_EQ(kf.read_back(0, 0)->k, plain8.read_back(0, 0)->k);
  const StoredBits sb = kf.stored_bits();
  EXPECT_EQ(sb.values, N * D);
  EXPECT_DOUBLE_EQ(sb.key_bits_per_value, 5.0);
  EXPECT_DOUBLE_EQ(sb.value_bits_per_value, 5.0);
  EXPECT_DOUBLE_EQ(plain8.stored_bits().key_bits_per_value, 5.0);
  // Allocated at the plain size too: 8 K rows + 8 V rows of 40 bytes per block.
  for (const Block& b : kf.blocks(0, 0)) EXPECT_EQ(b.bytes, 8 * 40 + 8 * 40u);
  EXPECT_EQ(kf.block_layout().at(0).bytes, 640u);
}

TYPED_TEST(KeyframeBytes, DeltaIntervalsCostKeyframePlusDeltas) {
  using KfCache = KVCache<Keys<Kf>, Values<Int4<>>, TypeParam>;
  const size_t extra = Kf::keyframe_bytes(D) - Kf::delta_bytes(D);  // 128 - 40 bytes per delta interval
  const auto v = kvtest::normal(static_cast<size_t>(N) * D, 2);
  const size_t plain_bytes = 8096u + kPositions + 10 * sizeof(BlockHeader);
  for (int pattern = 0; pattern < 3; ++pattern) {  // all delta, every other interval, the first three
    auto smooth = [pattern](int i) { return pattern == 0 || (pattern == 1 ? i % 2 == 0 : i < 3); };
    const auto c = filled<KfCache>(keys(smooth), v);
    const auto blocks = c.blocks(0, 0);
    ASSERT_EQ(blocks.size(), static_cast<size_t>(N / I));
    size_t n_delta = 0, allocated = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const bool delta = (blocks[i].header.flags & 2u) != 0;
      EXPECT_EQ(delta, smooth(static_cast<int>(i))) << "pattern " << pattern << " interval " << i;
      n_delta += delta;
      EXPECT_EQ(blocks[i].bytes, c.block_layout().at(blocks[i].header.flags).bytes);
      EXPECT_EQ(blocks[i].bytes, 640u + (delta ? extra : 0));
      allocated += blocks[i].bytes;
    }
    EXPECT_EQ(c.memory_bytes(), plain_bytes + n_delta * extra) << "pattern " << pattern;
    if (pattern == 0) {
      EXPECT_EQ(c.memory_bytes(), 9312u + kPositions);  // keyframe + 7 deltas in every interval
    }
    EXPECT_GE(c.allocated_bytes(), allocated);
    const StoredBits sb = c.stored_bits();
    EXPECT_DOUBLE_EQ(sb.key_bits_per_value, 5.0 + 8.0 * static_cast<double>(n_delta * extra) / (N * D));
    if (pattern == 0) {
      EXPECT_DOUBLE_EQ(sb.key_bits_per_value, Kf::delta_bits_per_value);  // 6.375
    }
    EXPECT_DOUBLE_EQ(sb.value_bits_per_value, 5.0);
  }
}

// BlockLayout::at: each keyframe role in delta mode moves what follows its stream by the keyframe
// row's extra bytes; bytes (the bound blocks are reserved with) is the all-delta size.
TEST(KeyframeBytesLayout, OffsetsFollowTheModes) {
  using KfV = Keyframe<I, Int8<>, Fp16>;
  const BlockLayout L = make_block_layout<Kf, KfV, false>(I, D);
  const size_t kx = Kf::keyframe_bytes(D) - Kf::delta_bytes(D), vx = KfV::keyframe_bytes(D) - KfV::delta_bytes(D);
  const size_t k_plain = I * Kf::delta_bytes(D), v_plain = I * KfV::delta_bytes(D);
  for (std::uint8_t f : {0, 2, 4, 6}) {
    const BlockLayout A = L.at(f);
    const size_t ks = k_plain + ((f & 2) ? kx : 0), vs = v_plain + ((f & 4) ? vx : 0);
    EXPECT_EQ(A.k_codes, 0u);
    EXPECT_EQ(A.v_codes, ks) << "flags " << int{f};
    EXPECT_EQ(A.positions, ks + vs) << "flags " << int{f};
    EXPECT_EQ(A.bytes, ks + vs + I * 4u) << "flags " << int{f};
    EXPECT_EQ(L.used_bytes(I, f), A.bytes);
    EXPECT_EQ(L.k_bytes(I, f), ks);
    EXPECT_EQ(L.v_bytes(I, f), vs);
  }
  EXPECT_EQ(L.bytes, L.at(6).bytes);
  // A row codec's layout does not depend on flags.
  const BlockLayout R = make_block_layout<Int4<>, Int8<>, false>(I, D);
  EXPECT_EQ(R.at(6).bytes, R.bytes);
  EXPECT_EQ(R.at(6).positions, R.positions);
}

}  // namespace
}  // namespace test_keyframe_bytes
