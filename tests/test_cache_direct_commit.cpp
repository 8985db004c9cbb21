// Tokens an append quantizes within the same call go from the caller's rows straight into blocks
// (SequenceStore::direct_tokens), also while a residual window's rows are pending: those are
// encoded first (commit_pending), so the blocks hold the tokens in order. A cache fed in chunks
// of odd sizes (1, 31, 33, 95, 130, ...) holds exactly the blocks, exact rows and outputs of one
// fed token by token, which never takes that path: residual windows with per-token and
// per-channel (KIVI) keys, with and without sinks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

template <class T>
class CacheDirectCommit : public ::testing::Test {};

using DirectCommitTypes =
    ::testing::Types<KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>, Residual<48>, Blocks<32>>,
                     KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<64>, Blocks<32>>,
                     KVCache<Keys<Int8<Group<32>>>, Values<Int4<Group<32>>>, Sinks<4>, Residual<40>>,
                     KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int8<Group<32>>>, Sinks<3>, Residual<32>>,
                     KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Blocks<64>>>;
TYPED_TEST_SUITE(CacheDirectCommit, DirectCommitTypes);

TYPED_TEST(CacheDirectCommit, ChunkedAppendsHoldWhatTokenByTokenAppendsHold) {
  using Cache = TypeParam;
  constexpr int kHeads = 2, kD = 64, kTokens = 700;
  const ModelShape shape{.layers = 1, .q_heads = 4, .kv_heads = kHeads, .head_dim = kD, .max_tokens = kTokens + 1};
  const std::size_t row = static_cast<std::size_t>(kHeads) * kD;
  const auto k = kvtest::normal(static_cast<std::size_t>(kTokens + 1) * row, 5);
  const auto v = kvtest::normal(static_cast<std::size_t>(kTokens + 1) * row, 6);
  const auto pos = kvtest::iota_positions(0, kTokens + 1);
  auto chunked = Cache::create(shape).value();
  auto single = Cache::create(shape).value();
  auto feed = [&](Cache& c, int t0, int n) {
    ASSERT_TRUE(c.append(0, std::span<const float>(k.data() + t0 * row, n * row), std::span<const float>(v.data() + t0 * row, n * row),
                         std::span<const std::int32_t>(pos.data() + t0, static_cast<std::size_t>(n))));
  };
  const int sizes[] = {1, 31, 130, 33, 95, 64, 2, 46, 200};
  int t = 0;
  for (int i = 0; t < kTokens; ++i) {
    const int n = std::min(sizes[i % 9], kTokens - t);
    feed(chunked, t, n);
    for (int j = 0; j < n; ++j) feed(single, t + j, 1);
    t += n;
    ASSERT_EQ(chunked.quantized_tokens(0), single.quantized_tokens(0)) << "after " << t << " tokens";
    for (int h = 0; h < kHeads; ++h) {
      const auto a = chunked.blocks(0, h), b = single.blocks(0, h);
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t x = 0; x < a.size(); ++x) {
        ASSERT_EQ(a[x].header.count, b[x].header.count);
        EXPECT_EQ(std::memcmp(a[x].data.get(), b[x].data.get(), chunked.block_layout().bytes), 0)
            << "after " << t << " tokens, head " << h << " block " << x;
      }
      const auto ra = chunked.read_back(0, h).value(), rb = single.read_back(0, h).value();
      EXPECT_EQ(ra.indices, rb.indices) << "after " << t << " tokens, head " << h;
      EXPECT_EQ(ra.positions, rb.positions) << "after " << t << " tokens, head " << h;
      EXPECT_EQ(ra.k, rb.k) << "after " << t << " tokens, head " << h;
      EXPECT_EQ(ra.v, rb.v) << "after " << t << " tokens, head " << h;
    }
  }
  // One decode step on both: the same latest chunk, so bit-identical outputs.
  feed(chunked, kTokens, 1);
  feed(single, kTokens, 1);
  const auto q = kvtest::normal(4 * kD, 7);
  std::vector<float> oa(q.size()), ob(q.size());
  ASSERT_TRUE(chunked.attend(0, q, oa));
  ASSERT_TRUE(single.attend(0, q, ob));
  EXPECT_EQ(oa, ob);
}

}  // namespace
