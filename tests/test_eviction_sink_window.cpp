// SinkWindow (StreamingLLM): CASES C7 (positions after eviction, RoPE) and C8 (sinks survive the
// ring wrapping, reset), plus constant memory over 1,000,000 tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"
#include "support/sweep.hpp"

namespace {

using namespace kvpack;  // NOLINT: test file

// RoPE (adjacent pairs) at position pos with base theta, in float64.
std::vector<double> rope64(const std::vector<float>& x, int D, int pos, double theta) {
  std::vector<double> y(x.begin(), x.end());
  for (int i = 0; i < D / 2; ++i) {
    const double a = pos * std::pow(theta, -2.0 * i / D);
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    y[2 * i] = x0 * std::cos(a) - x1 * std::sin(a);
    y[2 * i + 1] = x0 * std::sin(a) + x1 * std::cos(a);
  }
  return y;
}

TEST(CaseC7, OriginalPositionsAreKeptAfterEviction) {
  constexpr int D = 64;
  // Window 9 = the 8 tokens before the query plus the query's own token (20), which attends itself.
  using Cache = KVCache<SinkWindow<4, 9>>;
  auto c = Cache::create({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 64}).value();
  std::vector<std::vector<float>> raw_k, raw_v;
  std::vector<double> K64, V64;
  for (int t = 0; t <= 20; ++t) {
    raw_k.push_back(kvtest::normal(D, 100 + t));
    raw_v.push_back(kvtest::normal(D, 200 + t));
    const auto kr = rope64(raw_k.back(), D, t, 10000.0);
    std::vector<float> kf(kr.begin(), kr.end());
    ASSERT_TRUE(c.append(0, kf, raw_v.back(), std::vector<int32_t>{t}));
  }
  const auto rb = c.read_back(0, 0).value();
  EXPECT_EQ(rb.positions, (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15, 16, 17, 18, 19, 20}));
  // ref64: keys rotated at their ORIGINAL positions {0..3, 12..20}, query rotated at 20.
  const auto qraw = kvtest::normal(D, 999);
  const auto q64 = rope64(qraw, D, 20, 10000.0);
  std::vector<float> q(q64.begin(), q64.end()), out(D);
  ASSERT_TRUE(c.attend(0, q, out));
  std::vector<double> K, V;
  for (int t : {0, 1, 2, 3, 12, 13, 14, 15, 16, 17, 18, 19, 20}) {
    const auto kr = rope64(raw_k[static_cast<size_t>(t)], D, t, 10000.0);
    K.insert(K.end(), kr.begin(), kr.end());
    V.insert(V.end(), raw_v[static_cast<size_t>(t)].begin(), raw_v[static_cast<size_t>(t)].end());
  }
  const auto ref = kvtest::attention_ref64(K, V, 13, q, 1, 1, 1, D, 1.0 / 8.0, 12);
  EXPECT_LE(kvtest::max_rel_error(out, ref, D), 1e-4);
  // Renumbering the kept keys to positions 0..12 would give a different answer.
  std::vector<double> Kre;
  for (int i = 0; i < 13; ++i) {
    const int t = i < 4 ? i : i + 8;
    const auto kr = rope64(raw_k[static_cast<size_t>(t)], D, i, 10000.0);
    Kre.insert(Kre.end(), kr.begin(), kr.end());
  }
  const auto q_re = rope64(qraw, D, 12, 10000.0);
  std::vector<float> qre(q_re.begin(), q_re.end());
  const auto renumbered = kvtest::attention_ref64(Kre, V, 13, qre, 1, 1, 1, D, 1.0 / 8.0, 12);
  EXPECT_GT(kvtest::max_rel_error(out, renumbered, D), 1e-3) << "the test must tell the two conventions apart";
}

template <class Cache>
void run_c8(int sinks, int window, int T, const std::vector<int64_t>& expected) {
  constexpr int D = 16;
  auto c = Cache::create({.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = D, .max_tokens = 64}).value();
  std::vector<float> first_sinks;
  size_t full_bytes = 0, full_blocks = 0;
  for (int t = 0; t < T; ++t) {
    std::vector<float> kv(D, 0.f);
    kv[0] = static_cast<float>(t);
    ASSERT_TRUE(c.append(0, kv, kv, std::vector<int32_t>{t}));
    if (t == sinks + window) {
      auto rb = c.read_back(0, 0).value();
      first_sinks.assign(rb.k.begin(), rb.k.begin() + sinks * D);
      full_bytes = c.memory_bytes();
      full_blocks = c.blocks(0, 0).size();
    }
    EXPECT_LE(c.held_tokens(0), sinks + window) << "t=" << t;
    // Storage stays at sinks + window rows once full: no growth of bytes or blocks over the wraps.
    if (t > sinks + window) {
      EXPECT_EQ(c.memory_bytes(), full_bytes) << "t=" << t;
      EXPECT_EQ(c.blocks(0, 0).size(), full_blocks) << "t=" << t;
    }
  }
  EXPECT_EQ(kvtest::kept_indices(c, 0, 0), expected);
  auto rb = c.read_back(0, 0).value();
  // Each row holds its own token (within one INT4 step of t for the quantized variants).
  for (size_t i = 0; i < rb.indices.size(); ++i)
    EXPECT_NEAR(rb.k[i * D], static_cast<double>(rb.indices[i]), 0.07 * static_cast<double>(rb.indices[i]) + 1e-6);
  if (!first_sinks.empty()) {
    EXPECT_EQ(std::vector<float>(rb.k.begin(), rb.k.begin() + sinks * D), first_sinks) << "sinks changed";
  }
  std::vector<float> q(2 * D, 0.f);
  q[0] = 1.f;
  q[D] = 1.f;
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, q), 1e-5);
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> r(static_cast<size_t>(b - a));
  std::iota(r.begin(), r.end(), a);
  return r;
}
std::vector<int64_t> cat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(CaseC8, SinksSurviveTheRingWrapping) {
  const auto expected = cat(range(0, 4), range(92, 100));
  run_c8<KVCache<SinkWindow<4, 8>>>(4, 8, 100, expected);                                      // fp32
  run_c8<KVCache<Keys<Int4<Group<16>>>, Values<Int8<Group<16>>>, SinkWindow<4, 8>>>(4, 8, 100, expected);  // quantized
  run_c8<KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, Sinks<4>, SinkWindow<4, 8>>>(4, 8, 100, expected);
  run_c8<KVCache<Keys<Int8<Group<16>>>, Values<Int8<Group<16>>>, Residual<3>, SinkWindow<4, 8>>>(4, 8, 100, expected);
}

TEST(CaseC8, EdgeShapes) {
  run_c8<KVCache<SinkWindow<4, 8>>>(4, 8, 7, range(0, 7));    // T < 12: nothing evicted
  run_c8<KVCache<SinkWindow<4, 8>>>(4, 8, 4, range(0, 4));    // T == 4
  run_c8<KVCache<SinkWindow<4, 8>>>(4, 8, 12, range(0, 12));  // exactly full
  run_c8<KVCache<SinkWindow<4, 1>>>(4, 1, 30, cat(range(0, 4), {29}));  // window 1
  run_c8<KVCache<SinkWindow<0, 8>>>(0, 8, 50, range(42, 50));           // zero sinks
}

TEST(CaseC8, ResetMakesNewTokensTheSinks) {
  constexpr int D = 16;
  auto c = KVCache<Keys<Int8<Group<16>>>, SinkWindow<4, 8>>::create(
               {.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 64})
               .value();
  for (int t = 0; t < 30; ++t) {
    std::vector<float> kv(D, 0.f);
    kv[0] = static_cast<float>(t);
    ASSERT_TRUE(c.append(0, kv, kv, std::vector<int32_t>{t}));
  }
  c.reset();
  EXPECT_EQ(c.memory_bytes(), 0u);
  for (int t = 0; t < 5; ++t) {
    std::vector<float> kv(D, 0.f);
    kv[0] = 1000.f + static_cast<float>(t);
    ASSERT_TRUE(c.append(0, kv, kv, std::vector<int32_t>{t}));
  }
  auto rb = c.read_back(0, 0).value();
  ASSERT_EQ(rb.indices, range(0, 5));
  ASSERT_EQ(rb.positions, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  for (int t = 0; t < 5; ++t) {
    EXPECT_NEAR(rb.v[static_cast<size_t>(t) * D], 1000.f + static_cast<float>(t), 0.1f);
    EXPECT_NEAR(rb.k[static_cast<size_t>(t) * D], 1000.f + static_cast<float>(t), 1000.f / 127.f) << "int8 key step";
  }
  // Attention with q = e0 reads exactly those rows (not zeros, not the tokens before reset).
  std::vector<float> q(D, 0.f);
  q[0] = 1.f;
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, q), 1e-5);
  // And the ring wraps again around the new sinks.
  for (int t = 5; t < 100; ++t) {
    std::vector<float> kv(D, 0.f);
    kv[0] = 1000.f + static_cast<float>(t);
    ASSERT_TRUE(c.append(0, kv, kv, std::vector<int32_t>{t}));
  }
  EXPECT_EQ(kvtest::kept_indices(c, 0, 0), cat(range(0, 4), range(92, 100)));
  rb = c.read_back(0, 0).value();
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(rb.v[static_cast<size_t>(t) * D], 1000.f + static_cast<float>(t), 0.1f);
  EXPECT_LE(kvtest::evicting_attend_error(c, 0, q), 1e-5);
}

TEST(SinkWindowMemory, ConstantOverAMillionTokens) {
  constexpr int D = 16;
  auto c = KVCache<Keys<Int4<Group<16>>>, Values<Int4<Group<16>>>, SinkWindow<4, 256>>::create(
               {.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = D, .max_tokens = 1024})
               .value();
  std::vector<float> kv = kvtest::normal(D, 5);
  size_t steady = 0;
  const int total = kvtest::short_sweep() ? 250'000 : 1'000'000;  // short: sanitizers, qemu
  for (int t = 0; t < total; ++t) {
    kv[1] = static_cast<float>(t % 977);
    ASSERT_TRUE(c.append(0, kv, kv, std::vector<int32_t>{t}));
    if (t == 4 + 256 + 10) steady = c.memory_bytes();
    if (t > 4 + 256 + 10 && t % 4096 == 0) {
      ASSERT_EQ(c.memory_bytes(), steady) << "t=" << t;
    }
  }
  EXPECT_EQ(c.memory_bytes(), steady);
  EXPECT_EQ(c.held_tokens(0), 260);
  EXPECT_EQ(c.tokens(0), total);
}

}  // namespace
