// KVCache with Keyframe<...> codecs: attention equals float64 attention over the cache's own
// dequantized K/V (odd sizes), the stream decoded by the cache equals an independent per-token
// decode of the stored bytes, token-by-token / chunked / one-shot appends give identical blocks,
// the never-expand flag is recorded, and memory_bytes is analytic (per block, by its modes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvpack/kv_cache.hpp"
#include "support/cache_harness.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

using KfA = Keyframe<64, Int4<Group<32>>, Fp16, Anchor>;
using KfC = Keyframe<64, Int4<Group<32>>, Fp16, Chained>;
using KfC16 = Keyframe<16, Int4<Group<32>>, Int8<Group<32>>, Chained>;

using CacheA = KVCache<Keys<KfA>, Values<KfA>>;
using CacheC = KVCache<Keys<KfC>, Values<KfC>>;
using CacheMixed = KVCache<Keys<Int8<Group<32>>>, Values<KfC16>, Sinks<3>, Residual<5>>;
using CacheKeyOnly = KVCache<Keys<KfA>, Values<Int4<Group<32>>>>;

static_assert(CacheA::block_tokens == 64 && CacheMixed::block_tokens == 16, "block = keyframe interval");
static_assert(CacheA::key_bits_per_value == (16.0 + 63 * 5.0) / 64);  // the delta-mode bound
static_assert(CacheMixed::value_bits_per_value == (8.5 + 15 * 5.0) / 16);

constexpr int kD = 64;
ModelShape shape() { return ModelShape{1, 6, 2, kD, 4096, 0.f}; }

// K/V that vary smoothly over tokens (where delta coding can win), plus noise.
std::vector<float> smooth_tokens(int64_t first, int64_t n, int heads, unsigned salt) {
  std::vector<float> x(static_cast<size_t>(n) * heads * kD);
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < kD; ++d) {
        const double u = static_cast<double>(first + t);
        x[(static_cast<size_t>(t) * heads + h) * kD + d] =
            static_cast<float>(2.0 * std::sin(0.3 * d + h + salt) + 0.2 * std::sin(0.05 * u * (1 + d % 5)) +
                               0.01 * std::cos(1.7 * u + d));
      }
  return x;
}

template <class Cache>
void attention_matches_ref64(bool smooth) {
  for (int64_t past : {1, 31, 33, 95, 64 * 3 + 33}) {
    kvtest::Harness<Cache> hs(shape());
    const int kvh = 2;
    auto k = smooth ? smooth_tokens(0, past, kvh, 1) : kvtest::normal(static_cast<size_t>(past) * kvh * kD, 11);
    auto v = smooth ? smooth_tokens(0, past, kvh, 2) : kvtest::normal(static_cast<size_t>(past) * kvh * kD, 12);
    hs.append(0, k, v);
    // Prefill queries over the chunk itself (exact) ...
    const auto q0 = kvtest::normal(static_cast<size_t>(past) * 6 * kD, 13, 0.5f);
    EXPECT_LT(hs.attend_error(0, q0), 2e-5) << "past " << past;
    // ... then 3 decode steps reading the committed intervals.
    for (int step = 0; step < 3; ++step) {
      hs.append(0, smooth ? smooth_tokens(past + step, 1, kvh, 1) : kvtest::normal(kvh * kD, 20u + step),
                smooth ? smooth_tokens(past + step, 1, kvh, 2) : kvtest::normal(kvh * kD, 30u + step));
      const auto q = kvtest::normal(6 * kD, 40u + step, 0.5f);
      EXPECT_LT(hs.attend_error(0, q), 2e-5) << "past " << past << " step " << step;
    }
    // A chunk of 33 queries over quantized + pending tokens.
    hs.append(0, kvtest::normal(33 * kvh * kD, 50), kvtest::normal(33 * kvh * kD, 51));
    EXPECT_LT(hs.attend_error(0, kvtest::normal(33 * 6 * kD, 52, 0.5f)), 2e-5);
    EXPECT_EQ(hs.cache().quantized_tokens(0) % Cache::block_tokens, 0);
  }
}
TEST(KeyframeCache, AttentionMatchesRef64Anchor) {
  attention_matches_ref64<CacheA>(true);
  attention_matches_ref64<CacheA>(false);
}
TEST(KeyframeCache, AttentionMatchesRef64Chained) {
  attention_matches_ref64<CacheC>(true);
  attention_matches_ref64<CacheC>(false);
}
TEST(KeyframeCache, AttentionMatchesRef64MixedCodecs) {
  attention_matches_ref64<CacheMixed>(true);
  attention_matches_ref64<CacheKeyOnly>(false);
}

// The cache's decode (read_back, the kernel's reader) equals the codec's random-access decode of
// the stored bytes, token by token; flags bit 1 / 2 are the modes; smooth data picks delta mode,
// i.i.d. noise plain mode.
template <class Cache, class KC>
void read_back_equals_random_access(bool smooth, bool expect_delta) {
  const int64_t n = 64 * 3 + 7;
  auto c = Cache::create(shape());
  ASSERT_TRUE(c);
  const auto k = smooth ? smooth_tokens(0, n, 2, 1) : kvtest::normal(static_cast<size_t>(n) * 2 * kD, 61);
  const auto v = smooth ? smooth_tokens(0, n, 2, 2) : kvtest::normal(static_cast<size_t>(n) * 2 * kD, 62);
  ASSERT_TRUE(c->append(0, k, v, kvtest::iota_positions(0, n)));
  ASSERT_EQ(c->quantized_tokens(0), 192);
  for (int h = 0; h < 2; ++h) {
    auto rb = c->read_back(0, h);
    ASSERT_TRUE(rb);
    const auto blocks = c->blocks(0, h);
    ASSERT_EQ(blocks.size(), 3u);
    std::vector<float> one(kD);
    for (size_t b = 0; b < blocks.size(); ++b) {
      const BlockLayout L = c->block_layout().at(blocks[b].header.flags);  // V follows K's stored size
      EXPECT_EQ(blocks[b].bytes, L.bytes) << "a committed block is allocated at its own size";
      const bool kd = (blocks[b].header.flags & 2u) != 0, vd = (blocks[b].header.flags & 4u) != 0;
      EXPECT_EQ(kd, expect_delta) << "block " << b;
      EXPECT_EQ(vd, expect_delta) << "block " << b;
      for (int t = 0; t < 64; ++t) {
        const size_t row = (b * 64 + static_cast<size_t>(t)) * kD;
        KC::decode_token(blocks[b].data.get() + L.k_codes, kd, t, kD, one.data());
        for (int d = 0; d < kD; ++d) ASSERT_EQ(one[d], rb->k[row + d]);
        KC::decode_token(blocks[b].data.get() + L.v_codes, vd, t, kD, one.data());
        for (int d = 0; d < kD; ++d) ASSERT_EQ(one[d], rb->v[row + d]);
      }
    }
  }
}
TEST(KeyframeCache, ReadBackEqualsRandomAccessAndFlags) {
  read_back_equals_random_access<CacheA, KfA>(true, true);
  read_back_equals_random_access<CacheA, KfA>(false, false);
  read_back_equals_random_access<CacheC, KfC>(true, true);
  read_back_equals_random_access<CacheC, KfC>(false, false);
}

// Token-by-token, chunked and one-shot appends store identical blocks (codes, flags).
template <class Cache>
void token_by_token_equals_one_shot() {
  const int64_t n = 300;
  const auto k = smooth_tokens(0, n, 2, 3), v = smooth_tokens(0, n, 2, 4);
  const size_t row = 2 * kD;
  auto one = Cache::create(shape());
  auto tok = Cache::create(shape());
  auto chunked = Cache::create(shape());
  ASSERT_TRUE(one && tok && chunked);
  ASSERT_TRUE(one->append(0, k, v, kvtest::iota_positions(0, n)));
  for (int64_t t = 0; t < n; ++t)
    ASSERT_TRUE(tok->append(0, std::span(k).subspan(t * row, row), std::span(v).subspan(t * row, row),
                            kvtest::iota_positions(t, 1)));
  int64_t at = 0;
  for (int64_t len : {64, 1, 100, 135}) {
    ASSERT_TRUE(chunked->append(0, std::span(k).subspan(at * row, len * row), std::span(v).subspan(at * row, len * row),
                                kvtest::iota_positions(at, len)));
    at += len;
  }
  ASSERT_EQ(at, n);
  for (int h = 0; h < 2; ++h) {
    const auto a = one->blocks(0, h), b = tok->blocks(0, h), c = chunked->blocks(0, h);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.size(), c.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].header.flags, b[i].header.flags);
      ASSERT_EQ(a[i].header.flags, c[i].header.flags);
      const size_t bytes = one->block_layout().at(a[i].header.flags).bytes;
      ASSERT_EQ(a[i].bytes, bytes);
      ASSERT_EQ(b[i].bytes, bytes);
      ASSERT_EQ(c[i].bytes, bytes);
      EXPECT_EQ(0, std::memcmp(a[i].data.get(), b[i].data.get(), bytes)) << "block " << i;
      EXPECT_EQ(0, std::memcmp(a[i].data.get(), c[i].data.get(), bytes)) << "block " << i;
    }
  }
  EXPECT_EQ(one->memory_bytes(), tok->memory_bytes());
}
TEST(KeyframeCache, TokenByTokenEqualsOneShot) {
  token_by_token_equals_one_shot<CacheA>();
  token_by_token_equals_one_shot<CacheC>();
  token_by_token_equals_one_shot<CacheMixed>();
}

// memory_bytes is analytic: per full interval, K and V streams by their modes (delta: keyframe row
// + 63 delta rows; plain: 64 rows), positions, one header per block, plus the fp32 pending tokens.
// Smooth data is stored in delta mode, noise in plain mode (exactly the plain codec's bytes).
TEST(KeyframeCache, MemoryBytesAnalytic) {
  for (const bool smooth : {true, false}) {
    auto c = CacheA::create(shape());
    ASSERT_TRUE(c);
    const int64_t n = 64 * 2 + 10;
    ASSERT_TRUE(c->append(0, smooth ? smooth_tokens(0, n, 2, 1) : kvtest::normal(n * 2 * kD, 1),
                          smooth ? smooth_tokens(0, n, 2, 2) : kvtest::normal(n * 2 * kD, 2), kvtest::iota_positions(0, n)));
    const size_t interval = KfA::interval_bytes(kD, smooth);  // delta 128 + 63 * 40, plain 64 * 40
    const size_t per_block = 2 * interval + sizeof(BlockHeader);  // K and V streams (no slot positions)
    const size_t blocks = 2 /*kv heads*/ * 2 /*full intervals*/;
    const size_t pending = 10 * (2 * kD * 2 * 4 + 4);
    static_assert(!CacheA::slot_positions);  // the layer keeps them: one run of consecutive positions
    for (int h = 0; h < 2; ++h)
      for (const Block& b : c->blocks(0, h)) ASSERT_EQ(b.header.flags, smooth ? 6 : 0);
    EXPECT_EQ(c->memory_bytes(), blocks * per_block + pending + sizeof(PositionRuns::Run));
    const StoredBits sb = c->stored_bits();
    EXPECT_EQ(sb.values, 2 * 2 * 64 * kD);
    EXPECT_DOUBLE_EQ(sb.key_bits_per_value, smooth ? KfA::delta_bits_per_value : 5.0);
    EXPECT_DOUBLE_EQ(sb.value_bits_per_value, smooth ? KfA::delta_bits_per_value : 5.0);
  }
}

}  // namespace
