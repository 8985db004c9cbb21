// SnapKV over a PreRope<OriginalPositions> cache (eviction/snapkv.hpp compress: the observation
// window's queries turn at their tokens' positions, the keys at theirs):
//  * with fp32 K/V, a PreRope SnapKV cache fed pre-RoPE keys and queries keeps exactly the tokens
//    a post-RoPE SnapKV cache keeps when fed the same keys and queries rotated in double (every
//    layer and KV head, positions 5 + 3t with a jump, mean and max GQA aggregation), and decodes
//    to the same outputs after compression (within fp32 rounding);
//  * the same holds for an explicit compress_prompt();
//  * decoding after compression is checked against float64 in tests/test_pre_rope.cpp
//    (PreRopeVsRef64 with SnapKV<48, 8>).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/reference.hpp"
#include "support/rope_ref.hpp"

namespace snapkv_pre_rope_test {

using namespace kvpack;  // NOLINT: test file

/// x ([tokens][heads][D]) with row (t, h) rotated to position pos[t].
std::vector<float> rotated(std::vector<float> x, const ModelShape& s, int heads, const std::vector<std::int32_t>& pos) {
  const int D = s.head_dim;
  for (std::size_t t = 0; t < pos.size(); ++t)
    for (int h = 0; h < heads; ++h) {
      float* r = x.data() + (t * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h)) * static_cast<std::size_t>(D);
      std::vector<double> d(r, r + D);
      kvtest::rope_rotate64(d.data(), s, pos[t]);
      for (int i = 0; i < D; ++i) r[i] = static_cast<float>(d[static_cast<std::size_t>(i)]);
    }
  return x;
}

std::int32_t position(std::int64_t t) { return static_cast<std::int32_t>(5 + 3 * t + (t >= 40 ? 200 : 0)); }

/// Runs a prompt of `prompt` tokens (chunks of 50), attends its last `window` queries, then ends
/// the prompt with one decode token (compression, or compress_prompt() first when `explicit_call`)
/// and attends it, on a PreRope cache and on its post-RoPE twin; expects the same held tokens
/// and outputs.
template <class Snap>
void expect_same_selection(bool neox, bool explicit_call) {
  using Pre = KVCache<Snap, PreRope<>>;
  using Post = KVCache<Snap>;
  ModelShape s{.layers = 2, .q_heads = 8, .kv_heads = 2, .head_dim = 64, .max_tokens = 512};
  s.rope_base = 10000.f, s.rope_neox = neox;
  auto pre = Pre::create(s);
  auto post = Post::create(s);
  ASSERT_TRUE(pre && post);
  const int prompt = 150, window = Snap::window;
  const auto row = static_cast<std::size_t>(s.kv_heads) * s.head_dim, qrow = static_cast<std::size_t>(s.q_heads) * s.head_dim;
  std::uint32_t seed = neox ? 100 : 1;
  for (int l = 0; l < s.layers; ++l) {
    for (int first = 0; first < prompt; first += 50) {
      const int n = std::min(50, prompt - first);
      std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
      for (int t = 0; t < n; ++t) pos[static_cast<std::size_t>(t)] = position(first + t);
      const auto k = kvtest::normal(static_cast<std::size_t>(n) * row, ++seed, 1.5f), v = kvtest::normal(k.size(), ++seed);
      ASSERT_TRUE(pre->append(l, k, v, pos));
      ASSERT_TRUE(post->append(l, rotated(k, s, s.kv_heads, pos), v, pos));
      if (first + n == prompt) {  // the observation window: the prompt's last queries
        const auto q = kvtest::normal(static_cast<std::size_t>(window) * qrow, ++seed);
        const std::vector<std::int32_t> qpos(pos.end() - window, pos.end());
        std::vector<float> a(q.size()), b(q.size());
        const Status sa = pre->attend(l, q, a);
        ASSERT_TRUE(sa) << sa.error().message;
        ASSERT_TRUE(post->attend(l, rotated(q, s, s.q_heads, qpos), b));
      }
    }
    if (explicit_call) {
      ASSERT_TRUE(pre->compress_prompt(l));
      ASSERT_TRUE(post->compress_prompt(l));
    }
    const std::vector<std::int32_t> dpos{position(prompt)};
    const auto k = kvtest::normal(row, ++seed, 1.5f), v = kvtest::normal(row, ++seed);
    ASSERT_TRUE(pre->append(l, k, v, dpos));
    ASSERT_TRUE(post->append(l, rotated(k, s, s.kv_heads, dpos), v, dpos));
    for (int h = 0; h < s.kv_heads; ++h) {
      auto a = pre->read_back(l, h), b = post->read_back(l, h);
      ASSERT_TRUE(a && b);
      EXPECT_LT(a->indices.size(), static_cast<std::size_t>(prompt)) << "the prompt was compressed";
      EXPECT_EQ(a->indices, b->indices) << "layer " << l << " head " << h << " kept other tokens";
      EXPECT_EQ(a->positions, b->positions);
    }
    const auto q = kvtest::normal(qrow, ++seed);
    std::vector<float> a(q.size()), b(q.size());
    ASSERT_TRUE(pre->attend(l, q, a));
    ASSERT_TRUE(post->attend(l, rotated(q, s, s.q_heads, dpos), b));
    for (std::size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-5f * (1.f + std::abs(b[i]))) << i;
  }
}

TEST(SnapKVPreRope, KeepsWhatPostRopeKeeps) { expect_same_selection<SnapKV<48, 16>>(false, false); }
TEST(SnapKVPreRope, KeepsWhatPostRopeKeepsNeoxMax) {
  expect_same_selection<SnapKV<40, 8, 3, GroupAggregate::max>>(true, false);
}
TEST(SnapKVPreRope, ExplicitCompressPrompt) { expect_same_selection<SnapKV<48, 16>>(false, true); }

}  // namespace snapkv_pre_rope_test
