// LayeredCache: per-layer configurations in a std::variant, runtime re-plan with lazy
// recompression. Attention is checked against a float64 reference over the cache's own
// dequantized K/V (read_back) plus the exact latest chunk, before and across a re-plan.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <kvpack/kvpack.hpp>
#include <kvpack/plan/candidates.hpp>
#include <kvpack/plan/layered_cache.hpp>

namespace test_plan_layered_cache {  // own scope: compiled in one unity file with other tests
namespace {

using namespace kvpack;  // NOLINT: test file
using plan::LayeredCache;

using F16 = KVCache<Keys<Fp16>, Values<Fp16>>;
using I8 = KVCache<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>>;
using K8V4 = KVCache<Keys<Int8<Group<32>>>, Values<Int4<Group<32>>>>;
using I4 = KVCache<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>;
using Kivi = KVCache<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<16>>;
using Layered = LayeredCache<F16, I8, K8V4, I4, Kivi>;

constexpr int kLayers = 3, kQ = 4, kKV = 2, kD = 32;

ModelShape shape() {
  ModelShape s;
  s.layers = kLayers;
  s.q_heads = kQ;
  s.kv_heads = kKV;
  s.head_dim = kD;
  s.max_tokens = 1024;
  return s;
}

struct Chunk {
  std::vector<float> k, v, q;
  std::vector<int32_t> pos;
};

Chunk make_chunk(std::mt19937& rng, int n, int32_t pos0) {
  std::normal_distribution<float> nd(0.f, 1.f);
  Chunk c;
  c.k.resize(size_t(n) * kKV * kD);
  c.v.resize(c.k.size());
  c.q.resize(size_t(n) * kQ * kD);
  for (auto& x : c.k) x = nd(rng);
  for (size_t i = 0; i < c.k.size(); ++i) c.k[i] += (i % kD == 7) ? 6.f : 0.f;  // an outlier channel
  for (auto& x : c.v) x = nd(rng);
  for (auto& x : c.q) x = nd(rng);
  for (int t = 0; t < n; ++t) c.pos.push_back(pos0 + t);
  return c;
}

/// float64 causal attention of the chunk's n queries over `rows` (per KV head: read_back of the
/// cache), whose last n rows are replaced by the chunk's exact K/V.
std::vector<double> ref64(const std::vector<HeadContents>& heads, const Chunk& c) {
  const int n = int(c.pos.size());
  const double scale = 1.0 / std::sqrt(double(kD));
  std::vector<double> out(size_t(n) * kQ * kD, 0.0);
  for (int h = 0; h < kQ; ++h) {
    const int g = h / (kQ / kKV);
    const HeadContents& H = heads[size_t(g)];
    const int total = int(H.positions.size());
    auto key = [&](int r, int d) -> double {
      const int t = r - (total - n);
      return t >= 0 ? c.k[(size_t(t) * kKV + size_t(g)) * kD + size_t(d)] : H.k[size_t(r) * kD + size_t(d)];
    };
    auto val = [&](int r, int d) -> double {
      const int t = r - (total - n);
      return t >= 0 ? c.v[(size_t(t) * kKV + size_t(g)) * kD + size_t(d)] : H.v[size_t(r) * kD + size_t(d)];
    };
    for (int i = 0; i < n; ++i) {
      const int last = total - n + i;
      std::vector<double> s(size_t(last) + 1);
      double mx = -1e300;
      for (int r = 0; r <= last; ++r) {
        double dot = 0;
        for (int d = 0; d < kD; ++d) dot += double(c.q[(size_t(i) * kQ + size_t(h)) * kD + size_t(d)]) * key(r, d);
        s[size_t(r)] = dot * scale;
        mx = std::max(mx, s[size_t(r)]);
      }
      double z = 0;
      for (auto& x : s) z += (x = std::exp(x - mx));
      for (int d = 0; d < kD; ++d) {
        double acc = 0;
        for (int r = 0; r <= last; ++r) acc += s[size_t(r)] * val(r, d);
        out[(size_t(i) * kQ + size_t(h)) * kD + size_t(d)] = acc / z;
      }
    }
  }
  return out;
}

/// Appends `c` to layer l, attends, and checks the output against ref64 over read_back.
void step_and_check(Layered& cache, int l, const Chunk& c, const char* what) {
  ASSERT_TRUE(cache.append(l, c.k, c.v, c.pos)) << what;
  std::vector<float> out(c.q.size());
  ASSERT_TRUE(cache.attend(l, c.q, out)) << what;
  std::vector<HeadContents> heads;
  for (int h = 0; h < kKV; ++h) {
    auto hc = cache.read_back(l, h);
    ASSERT_TRUE(hc);
    heads.push_back(std::move(*hc));
  }
  const auto ref = ref64(heads, c);
  const auto norms = cache.last_attn_norms(l);
  ASSERT_EQ(norms.size(), c.pos.size());
  for (size_t t = 0; t < norms.size(); ++t) {
    double n2 = 0;
    for (size_t i = 0; i < size_t(kQ * kD); ++i) n2 += ref[t * kQ * kD + i] * ref[t * kQ * kD + i];
    EXPECT_NEAR(norms[t], std::sqrt(n2), 1e-4 * (1 + std::sqrt(n2))) << what;
  }
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - ref[i]) / (1.0 + std::abs(ref[i])));
  EXPECT_LE(worst, 2e-5) << what << " layer " << l << " stored config " << cache.stored(l);
}

// With a fixed plan, each layer is bit-identical to a uniform KVCache of its configuration.
TEST(LayeredCache, FixedPlanIsBitIdenticalToUniformCaches) {
  const std::vector<int> choice{0, 3, 4};
  auto lc = Layered::create(shape(), choice);
  ASSERT_TRUE(lc) << lc.error().message;
  auto f16 = F16::create(shape());
  auto i4 = I4::create(shape());
  auto kv = Kivi::create(shape());
  ASSERT_TRUE(f16 && i4 && kv);
  std::mt19937 rng(5);
  int32_t p = 0;
  for (int n : {31, 33, 1, 95, 1, 1}) {
    for (int l = 0; l < kLayers; ++l) {
      const Chunk c = make_chunk(rng, n, p);
      std::vector<float> a(c.q.size()), b(c.q.size());
      ASSERT_TRUE(lc->append(l, c.k, c.v, c.pos));
      ASSERT_TRUE(lc->attend(l, c.q, a));
      auto run = [&](auto& u) {
        ASSERT_TRUE(u.append(l, c.k, c.v, c.pos));
        ASSERT_TRUE(u.attend(l, c.q, b));
      };
      if (l == 0) run(*f16);
      if (l == 1) run(*i4);
      if (l == 2) run(*kv);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "layer " << l << " n " << n;
    }
    p += n;
  }
  EXPECT_EQ(lc->memory_bytes(), lc->memory_bytes(0) + lc->memory_bytes(1) + lc->memory_bytes(2));
  EXPECT_EQ(lc->memory_bytes(1), i4->memory_bytes());  // i4 holds only layer 1
}

// Across re-plans (down and up in precision, every candidate), attention equals the float64
// reference over the cache's own dequantized K/V, every token survives with its position, and
// migration happens at the layer's next append, not before.
TEST(LayeredCache, ReplanKeepsEveryTokenAndAttendsLikeReference) {
  auto lc = Layered::create(shape(), std::vector<int>{0, 1, 4});
  ASSERT_TRUE(lc);
  std::mt19937 rng(11);
  int32_t p = 1000;  // positions are stored as given, never renumbered
  auto run = [&](std::initializer_list<int> sizes, const char* what) {
    for (int n : sizes) {
      for (int l = 0; l < kLayers; ++l) step_and_check(*lc, l, make_chunk(rng, n, p), what);
      p += n;
    }
  };
  run({31, 33, 1}, "before re-plan");
  const std::vector<std::vector<int>> plans{{3, 4, 0}, {2, 2, 1}, {4, 0, 3}, {1, 3, 2}};
  for (const auto& plan : plans) {
    const std::size_t before = lc->memory_bytes();
    std::vector<int> old_stored;
    for (int l = 0; l < kLayers; ++l) old_stored.push_back(lc->stored(l));
    ASSERT_TRUE(lc->replan(plan));
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(lc->stored(l), old_stored[size_t(l)]) << "lazy: nothing migrates before the next append";
      EXPECT_EQ(lc->planned(l), plan[size_t(l)]);
    }
    EXPECT_EQ(lc->memory_bytes(), before);
    run({1}, "first decode step after re-plan");
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(lc->stored(l), plan[size_t(l)]);
      ASSERT_EQ(lc->tokens(l), p - 1000);
      for (int h = 0; h < kKV; ++h) {
        auto hc = lc->read_back(l, h);
        ASSERT_TRUE(hc);
        ASSERT_EQ(hc->positions.size(), size_t(p - 1000));
        for (size_t t = 0; t < hc->positions.size(); ++t) ASSERT_EQ(hc->positions[t], int32_t(1000 + t));
      }
    }
    run({33, 1, 95}, "after re-plan");
  }
  EXPECT_EQ(lc->replans(), 4);
  EXPECT_EQ(lc->migrations(), 12);  // every layer changed configuration at every re-plan
}

// Migration re-appends exactly what attention read: the new storage equals a fresh cache of the
// new type fed the old dequantized K/V (bit-identical), and going down in precision frees memory.
TEST(LayeredCache, MigrationRequantizesTheDecodedTokens) {
  auto lc = Layered::create(shape(), std::vector<int>{0, 0, 0});
  ASSERT_TRUE(lc);
  std::mt19937 rng(3);
  int32_t p = 0;
  for (int n : {33, 31, 1}) {
    for (int l = 0; l < kLayers; ++l) step_and_check(*lc, l, make_chunk(rng, n, p), "fp16");
    p += n;
  }
  const int l = 1;
  std::vector<HeadContents> old;
  for (int h = 0; h < kKV; ++h) old.push_back(*lc->read_back(l, h));
  const std::size_t fp16_bytes = lc->memory_bytes(l);
  ASSERT_TRUE(lc->replan(std::vector<int>{0, 3, 0}));
  ASSERT_TRUE(lc->migrate(l));
  EXPECT_EQ(lc->stored(l), 3);
  EXPECT_EQ(lc->stored(0), 0);
  EXPECT_LT(lc->memory_bytes(l), fp16_bytes / 2);
  EXPECT_EQ(lc->recompressed_tokens(), p);
  // A fresh INT4 cache fed the old decoded rows.
  ModelShape one = shape();
  one.layers = 1;
  auto ref = I4::create(one);
  ASSERT_TRUE(ref);
  std::vector<float> k(size_t(p) * kKV * kD), v(k.size());
  std::vector<int32_t> pos(old[0].positions);
  for (int h = 0; h < kKV; ++h)
    for (int t = 0; t < p; ++t)
      for (int d = 0; d < kD; ++d) {
        k[(size_t(t) * kKV + size_t(h)) * kD + size_t(d)] = old[size_t(h)].k[size_t(t) * kD + size_t(d)];
        v[(size_t(t) * kKV + size_t(h)) * kD + size_t(d)] = old[size_t(h)].v[size_t(t) * kD + size_t(d)];
      }
  ASSERT_TRUE(ref->append(0, k, v, pos));
  EXPECT_EQ(ref->memory_bytes(), lc->memory_bytes(l));
  for (int h = 0; h < kKV; ++h) {
    auto a = lc->read_back(l, h), b = ref->read_back(0, h);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->k, b->k);
    EXPECT_EQ(a->v, b->v);
    EXPECT_EQ(a->positions, b->positions);
  }
  // Back up to fp16: the INT4 values carry over (fp16 holds them to its rounding), nothing lost.
  std::vector<HeadContents> q4;
  for (int h = 0; h < kKV; ++h) q4.push_back(*lc->read_back(l, h));
  ASSERT_TRUE(lc->replan(std::vector<int>{0, 0, 0}));
  step_and_check(*lc, l, make_chunk(rng, 1, p), "back to fp16");
  for (int h = 0; h < kKV; ++h) {
    auto a = lc->read_back(l, h);
    ASSERT_TRUE(a);
    for (size_t i = 0; i < q4[size_t(h)].k.size(); ++i) {
      EXPECT_NEAR(a->k[i], q4[size_t(h)].k[i], std::abs(q4[size_t(h)].k[i]) * 0x1p-11 + 1e-7);
      EXPECT_NEAR(a->v[i], q4[size_t(h)].v[i], std::abs(q4[size_t(h)].v[i]) * 0x1p-11 + 1e-7);
    }
  }
}

TEST(LayeredCache, Errors) {
  EXPECT_EQ(Layered::create(shape(), std::vector<int>{0, 1}).error().code, Errc::invalid_argument);
  EXPECT_EQ(Layered::create(shape(), std::vector<int>{0, 1, 5}).error().code, Errc::invalid_argument);
  ModelShape odd = shape();
  odd.head_dim = 48;  // not a multiple of group 32: the INT8 candidate refuses it
  EXPECT_EQ(Layered::create(odd, std::vector<int>{1, 1, 1}).error().code, Errc::invalid_argument);
  auto lc = Layered::create(shape(), std::vector<int>{0, 1, 2});
  ASSERT_TRUE(lc);
  EXPECT_FALSE(lc->replan(std::vector<int>{0, -1, 2}));
  EXPECT_FALSE(lc->replan(std::vector<int>{0, 1}));
  EXPECT_EQ(lc->planned(1), 1);
  EXPECT_EQ(lc->replans(), 0);
  std::vector<float> k(kKV * kD), q(kQ * kD), out(q.size());
  std::vector<int32_t> pos{0};
  EXPECT_FALSE(lc->append(3, k, k, pos));
  EXPECT_FALSE(lc->attend(-1, q, out));
  EXPECT_FALSE(lc->read_back(3, 0));
  // reset: empty, on the planned configuration.
  ASSERT_TRUE(lc->append(0, k, k, pos));
  ASSERT_TRUE(lc->replan(std::vector<int>{4, 1, 2}));
  lc->reset();
  EXPECT_EQ(lc->tokens(0), 0);
  EXPECT_EQ(lc->stored(0), 4);
  EXPECT_EQ(lc->memory_bytes(), 0u);
}

// The standard set compiles and names its candidates.
TEST(LayeredCache, StandardSet) {
  ModelShape s = shape();
  s.head_dim = 64;
  auto lc = plan::StandardLayeredCache::create(s, std::vector<int>{0, 3, 5});
  ASSERT_TRUE(lc) << lc.error().message;
  EXPECT_EQ(plan::StandardLayeredCache::candidates, int(plan::standard_candidate_names.size()));
  EXPECT_EQ(plan::standard_candidate_names[4], "kivi4");
}

// The candidates added for the INT8 budget (kivi8, k16v8, k8v16, kc4v8) run in a
// StandardLayeredCache bit-identically to uniform caches of their types, and their bytes are what
// the planner must be charged: kivi8 holds int8's bytes once its per-channel key groups close, and
// its open group (up to 31 tokens) in fp32 until then; k16v8 and k8v16 lie between int8 and fp16.
TEST(LayeredCache, StandardSetInt8BudgetCandidates) {
  ModelShape s = shape();
  s.head_dim = 64;
  s.layers = 4;
  const std::vector<int> choice{8, 9, 10, 11};
  ASSERT_EQ(plan::standard_candidate_names[8], "kivi8");
  ASSERT_EQ(plan::standard_candidate_names[9], "k16v8");
  ASSERT_EQ(plan::standard_candidate_names[10], "k8v16");
  ASSERT_EQ(plan::standard_candidate_names[11], "kc4v8");
  auto lc = plan::StandardLayeredCache::create(s, choice);
  ASSERT_TRUE(lc) << lc.error().message;
  auto u8 = plan::Kivi8Cache::create(s);
  auto u9 = plan::K16V8Cache::create(s);
  auto u10 = plan::K8V16Cache::create(s);
  auto u11 = plan::Kc4V8Cache::create(s);
  ASSERT_TRUE(u8 && u9 && u10 && u11);
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t kv_row = size_t(kKV) * 64, q_row = size_t(kQ) * 64;
  int32_t p = 0;
  for (int n : {31, 33, 1, 95, 1}) {
    for (int l = 0; l < s.layers; ++l) {
      std::vector<float> k(size_t(n) * kv_row), v(k.size()), q(size_t(n) * q_row), a(q.size()), b(q.size());
      for (auto& x : k) x = nd(rng);
      for (size_t i = 0; i < k.size(); ++i) k[i] += (i % 64 == 5) ? 8.f : 0.f;  // an outlier channel
      for (auto& x : v) x = nd(rng);
      for (auto& x : q) x = nd(rng);
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int t = 0; t < n; ++t) pos[size_t(t)] = p + t;
      ASSERT_TRUE(lc->append(l, k, v, pos));
      ASSERT_TRUE(lc->attend(l, q, a));
      auto run = [&](auto& u) {
        ASSERT_TRUE(u.append(l, k, v, pos));
        ASSERT_TRUE(u.attend(l, q, b));
        EXPECT_EQ(lc->memory_bytes(l), u.memory_bytes()) << "layer " << l;  // u holds only layer l
      };
      if (l == 0) run(*u8);
      if (l == 1) run(*u9);
      if (l == 2) run(*u10);
      if (l == 3) run(*u11);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "layer " << l << " n " << n;
    }
    p += n;
  }
  // Bytes of one layer after t tokens (same data for every candidate).
  auto bytes_at = [&](int cand, int t) {
    ModelShape one = s;
    one.layers = 1;
    auto c = plan::StandardLayeredCache::create(one, std::vector<int>{cand});
    EXPECT_TRUE(c);
    std::vector<float> k(size_t(t) * kv_row), v(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    std::vector<int32_t> pos(static_cast<size_t>(t));
    for (int i = 0; i < t; ++i) pos[size_t(i)] = i;
    EXPECT_TRUE(c->append(0, k, v, pos));
    return c->memory_bytes();
  };
  const size_t fp32_row = kv_row * 2 * sizeof(float) + sizeof(int32_t);  // K + V in fp32 + position
  for (int t : {64, 128, 256}) {
    EXPECT_EQ(bytes_at(8, t), bytes_at(2, t)) << t;  // kivi8 == int8 once the key groups close
    EXPECT_GT(bytes_at(9, t), bytes_at(2, t));
    EXPECT_LT(bytes_at(9, t), bytes_at(1, t));
    EXPECT_EQ(bytes_at(9, t), bytes_at(10, t));  // fp16 K + int8 V == int8 K + fp16 V
    EXPECT_LT(bytes_at(11, t), bytes_at(2, t));
  }
  for (int open : {1, 17, 31}) {
    EXPECT_EQ(bytes_at(8, 64 + open), bytes_at(8, 64) + size_t(open) * fp32_row) << open;  // open group in fp32
    EXPECT_EQ(bytes_at(11, 64 + open), bytes_at(11, 64) + size_t(open) * fp32_row) << open;
  }
}

}  // namespace
}  // namespace test_plan_layered_cache
