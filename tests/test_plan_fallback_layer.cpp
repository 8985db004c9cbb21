// FallbackLayer: a switch sends new tokens to another configuration without touching stored
// tokens; during a fallback the recent window is held in fp32 and attention reads it exactly;
// the window is dropped when the fallback ends; switches are logged. Attention vs float64.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <kvpack/plan/candidates.hpp>
#include <kvpack/plan/fallback_layer.hpp>
#include <kvpack/plan/layered_cache.hpp>

namespace {

namespace plan = kvpack::plan;
using Layer = plan::FallbackLayer<plan::Fp32Cache, plan::Int8Cache, plan::Int4G32Cache>;
constexpr int kQ = 4, kKV = 2, kD = 32, kFp32 = 0, kInt8 = 1, kInt4 = 2;
constexpr std::int64_t kWindow = 8;

kvpack::ModelShape shape() {
  kvpack::ModelShape s;
  s.layers = 1;
  s.q_heads = kQ;
  s.kv_heads = kKV;
  s.head_dim = kD;
  s.max_tokens = 1024;
  return s;
}

struct Tokens {
  std::vector<float> k, v, q;  // [n][kv_heads][D], [n][kv_heads][D], [n][q_heads][D]
  std::vector<int32_t> pos;
};
Tokens make(std::mt19937& g, int first, int n) {
  std::normal_distribution<float> d(0.f, 1.f);
  Tokens t;
  for (int i = 0; i < n * kKV * kD; ++i) t.k.push_back(d(g) * 2.f), t.v.push_back(d(g));
  for (int i = 0; i < n * kQ * kD; ++i) t.q.push_back(d(g));
  for (int i = 0; i < n; ++i) t.pos.push_back(first + i);
  return t;
}

// float64 attention of the last n_q rows of K/V ([T][kv_heads][D], the values attention should
// read) for queries q ([n_q][q_heads][D]), causal.
std::vector<double> reference(const std::vector<double>& K, const std::vector<double>& V, const std::vector<float>& q) {
  const std::size_t T = K.size() / (kKV * kD), nq = q.size() / (kQ * kD);
  std::vector<double> out(q.size());
  for (std::size_t i = 0; i < nq; ++i)
    for (int qh = 0; qh < kQ; ++qh) {
      const int h = qh / (kQ / kKV);
      const std::size_t see = T - nq + i + 1;
      std::vector<double> s(see);
      double mx = -1e300, z = 0;
      for (std::size_t t = 0; t < see; ++t) {
        double d = 0;
        for (int j = 0; j < kD; ++j) d += double(q[(i * kQ + std::size_t(qh)) * kD + std::size_t(j)]) * K[(t * kKV + std::size_t(h)) * kD + std::size_t(j)];
        s[t] = d / std::sqrt(double(kD));
        mx = std::max(mx, s[t]);
      }
      for (auto& x : s) z += (x = std::exp(x - mx));
      for (int j = 0; j < kD; ++j) {
        double a = 0;
        for (std::size_t t = 0; t < see; ++t) a += s[t] * V[(t * kKV + std::size_t(h)) * kD + std::size_t(j)];
        out[(i * kQ + std::size_t(qh)) * kD + std::size_t(j)] = a / z;
      }
    }
  return out;
}

// What attention must read: every stored token decoded from its own segment (read_back), the fp32
// window exact, the latest append exact.
void expected_rows(const Layer& L, const std::vector<float>& exact_k, const std::vector<float>& exact_v,
                   std::int64_t exact_from, std::int64_t last_from, std::vector<double>& K, std::vector<double>& V) {
  const std::size_t T = std::size_t(L.tokens());
  K.assign(T * kKV * kD, 0.0);
  V.assign(K.size(), 0.0);
  for (std::size_t s = 0; s < L.segments(); ++s)
    for (int h = 0; h < kKV; ++h) {
      auto hc = L.read_back(s, h);
      ASSERT_TRUE(hc);
      for (std::size_t r = 0; r < hc->indices.size(); ++r) {
        const std::size_t g = std::size_t(L.segment_first(s) + hc->indices[r]);
        for (int j = 0; j < kD; ++j) {
          K[(g * kKV + std::size_t(h)) * kD + std::size_t(j)] = hc->k[r * kD + std::size_t(j)];
          V[(g * kKV + std::size_t(h)) * kD + std::size_t(j)] = hc->v[r * kD + std::size_t(j)];
        }
      }
    }
  for (std::size_t g = std::size_t(std::min(exact_from, last_from)); g < T; ++g)
    if (std::int64_t(g) >= exact_from || std::int64_t(g) >= last_from)
      for (std::size_t i = 0; i < kKV * kD; ++i) {
        K[g * kKV * kD + i] = exact_k[g * kKV * kD + i];
        V[g * kKV * kD + i] = exact_v[g * kKV * kD + i];
      }
}

void expect_attention(Layer& L, const Tokens& last, const std::vector<float>& all_k, const std::vector<float>& all_v,
                      std::int64_t exact_from) {
  std::vector<double> K, V;
  expected_rows(L, all_k, all_v, exact_from, L.tokens() - std::int64_t(last.pos.size()), K, V);
  std::vector<float> out(last.q.size());
  ASSERT_TRUE(L.attend(last.q, out));
  const auto ref = reference(K, V, last.q);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << i;
}

TEST(FallbackLayer, NewTokensOnlyExactWindowThenDropped) {
  std::mt19937 g(9);
  auto L = Layer::create(shape(), kInt4, kWindow);
  ASSERT_TRUE(L);
  std::vector<float> all_k, all_v;
  int pos = 0;
  auto feed = [&](int n) {
    Tokens t = make(g, pos, n);
    pos += n;
    all_k.insert(all_k.end(), t.k.begin(), t.k.end());
    all_v.insert(all_v.end(), t.v.begin(), t.v.end());
    EXPECT_TRUE(L->append(t.k, t.v, t.pos));
    return t;
  };
  // 33 tokens on int4 (odd chunks), attention checked.
  feed(31);
  auto t = feed(2);
  expect_attention(*L, t, all_k, all_v, INT64_MAX);
  std::vector<kvpack::HeadContents> before;
  for (int h = 0; h < kKV; ++h) before.push_back(*L->read_back(0, h));
  const std::size_t bytes_before = L->memory_bytes();

  // Spike: new tokens on int8, exact window on.
  plan::SwitchEvent on{33, plan::Trigger::attn_norm_spike, 9.9, 9.8, true};
  ASSERT_TRUE(L->switch_to(kInt8, on));
  EXPECT_TRUE(L->in_fallback());
  EXPECT_EQ(L->memory_bytes(), bytes_before);  // nothing recompressed, nothing copied yet
  feed(5);
  EXPECT_EQ(L->exact_tokens(), 5);
  t = feed(1);  // decode step
  expect_attention(*L, t, all_k, all_v, 33);
  feed(25);
  t = feed(1);
  EXPECT_EQ(L->exact_tokens(), kWindow);  // only the recent window is held exactly
  expect_attention(*L, t, all_k, all_v, L->tokens() - kWindow);
  // The exact window costs its fp32 bytes on top of the segments.
  EXPECT_GE(L->memory_bytes(), bytes_before + std::size_t(kWindow) * 2 * kKV * kD * sizeof(float));

  // Stored int4 tokens untouched (no migration): bit-identical read back.
  for (int h = 0; h < kKV; ++h) {
    auto now = L->read_back(0, h);
    ASSERT_TRUE(now);
    EXPECT_EQ(now->k, before[std::size_t(h)].k);
    EXPECT_EQ(now->v, before[std::size_t(h)].v);
    EXPECT_EQ(now->positions, before[std::size_t(h)].positions);
  }
  ASSERT_EQ(L->segments(), 2u);
  EXPECT_EQ(L->segment_candidate(1), kInt8);
  EXPECT_EQ(L->segment_first(1), 33);

  // Quality back: new tokens on int4 again, the exact window dropped.
  const std::size_t bytes_on = L->memory_bytes();
  plan::SwitchEvent off{70, plan::Trigger::recovered, 4.2, 9.25, false};
  ASSERT_TRUE(L->switch_to(kInt4, off));
  EXPECT_FALSE(L->in_fallback());
  EXPECT_EQ(L->exact_tokens(), 0);
  EXPECT_EQ(L->memory_bytes(), bytes_on - std::size_t(kWindow) * 2 * kKV * kD * sizeof(float));
  feed(3);
  t = feed(2);
  EXPECT_EQ(L->exact_tokens(), 0);
  expect_attention(*L, t, all_k, all_v, INT64_MAX);
  ASSERT_EQ(L->segments(), 3u);
  EXPECT_EQ(L->tokens(), 33 + 32 + 5);

  ASSERT_EQ(L->log().size(), 2u);
  EXPECT_EQ(L->log()[0].event.trigger, plan::Trigger::attn_norm_spike);
  EXPECT_EQ(L->log()[0].at_token, 33);
  EXPECT_EQ(L->log()[0].from, kInt4);
  EXPECT_EQ(L->log()[0].to, kInt8);
  EXPECT_EQ(L->log()[1].event.trigger, plan::Trigger::recovered);
  EXPECT_EQ(L->log()[1].at_token, 65);
  EXPECT_EQ(L->log()[1].to, kInt4);
}

TEST(FallbackLayer, Errors) {
  EXPECT_FALSE(Layer::create(shape(), 3, 8));
  EXPECT_FALSE(Layer::create(shape(), kInt4, -1));
  auto L = Layer::create(shape(), kFp32, 4);
  ASSERT_TRUE(L);
  EXPECT_FALSE(L->switch_to(7, {}));
  std::mt19937 g(1);
  Tokens t = make(g, 0, 3);
  ASSERT_TRUE(L->append(t.k, t.v, t.pos));
  std::vector<float> q(size_t(4) * kQ * kD), out(q.size());  // 4 queries > latest append of 3
  EXPECT_FALSE(L->attend(q, out));
}

}  // namespace

namespace {

// LayeredCache in segment mode: after switch_new_tokens, stored tokens stay as they were, new
// tokens go to the new candidate, replan is refused, and attention equals a FallbackLayer fed the
// same tokens with the same switch.
TEST(FallbackLayer, LayeredCacheSegmentMode) {
  using LC = plan::LayeredCache<plan::Fp32Cache, plan::Int8Cache, plan::Int4G32Cache>;
  kvpack::ModelShape s2 = shape();
  s2.layers = 2;
  auto lc = LC::create(s2, std::vector<int>{kInt4, kInt8});
  auto fl = Layer::create(shape(), kInt4, 4);
  ASSERT_TRUE(lc && fl);
  std::mt19937 g(5);
  int pos = 0;
  auto feed = [&](int n) {
    Tokens t = make(g, pos, n);
    pos += n;
    for (int l = 0; l < 2; ++l) EXPECT_TRUE(lc->append(l, t.k, t.v, t.pos));
    EXPECT_TRUE(fl->append(t.k, t.v, t.pos));
    return t;
  };
  feed(33);
  const auto before = *lc->read_back(0, 1);
  plan::SwitchEvent on{33, plan::Trigger::entropy_spike, 9.5, 9.25, true};
  ASSERT_TRUE(lc->switch_new_tokens(std::vector<int>{kInt8, kFp32}, on, 4));
  ASSERT_TRUE(fl->switch_to(kInt8, on));
  EXPECT_FALSE(lc->replan(std::vector<int>{kInt4, kInt4}));
  feed(6);
  auto t = feed(1);
  EXPECT_EQ(lc->tokens(0), 40);
  EXPECT_EQ(lc->stored(0), kInt8);
  EXPECT_EQ(lc->stored(1), kFp32);
  EXPECT_EQ(lc->exact_tokens(0), 4);
  EXPECT_EQ(lc->fallback_switches(1), 1u);
  EXPECT_EQ(lc->memory_bytes(0), fl->memory_bytes());
  auto after = lc->read_back(0, 1);
  ASSERT_TRUE(after);
  ASSERT_EQ(after->k.size(), std::size_t(40) * kD);
  EXPECT_TRUE(std::equal(before.k.begin(), before.k.end(), after->k.begin()));  // old tokens untouched
  std::vector<float> a(t.q.size()), b(t.q.size());
  ASSERT_TRUE(lc->attend(0, t.q, a));
  ASSERT_TRUE(fl->attend(t.q, b));
  EXPECT_EQ(a, b);
  EXPECT_EQ(lc->last_attn_norms(0).size(), 1u);
  lc->reset();
  EXPECT_EQ(lc->tokens(0), 0);
  EXPECT_EQ(lc->exact_tokens(0), 0);
  EXPECT_TRUE(lc->replan(std::vector<int>{kInt4, kInt4}));
}

}  // namespace
