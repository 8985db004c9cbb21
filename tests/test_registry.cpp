// The runtime registry (include/kvpack/registry/): names resolve to the intended policy types,
// llama.cpp cache type names resolve to the matching codecs, type-erased caches and pools give
// the same codes and bit-identical attention as the concrete types, and bad names fail clearly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvpack/registry/registry.hpp"

namespace {

using namespace kvpack;
using registry::AnyCache;
using registry::AnyPool;

ModelShape small_shape() { return {.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64, .max_tokens = 512}; }

std::vector<float> randn(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The PolicySet a name resolves to (no cache is instantiated).
template <class Set>
bool resolves_to(std::string_view name) {
  bool same = false;
  const bool found = registry::with_policy_set(name, [&]<class S>() { same = std::is_same_v<S, Set>; });
  return found && same;
}

TEST(Registry, NamesSelectTheEvalToolsTypes) {
  using registry::PolicySet;
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>>>("int8")));
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Int4<Group<32>>, PerChannel>, Values<Int4<Group<32>>>, Residual<128>>>("kivi4")));
  EXPECT_TRUE((resolves_to<PolicySet<SinkWindowBudget<Fraction<1, 2>>>>("sink-window-50")));
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Int8<Group<32>>>, Values<Int4<Group<32>>>>>("k8v4")));
  EXPECT_FALSE((resolves_to<PolicySet<Keys<Fp16>, Values<Fp16>>>("fp32")));
}

TEST(Registry, LlamaCppTypeNamesSelectTheMatchingCodecs) {
  using registry::PolicySet;
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Fp32>, Values<Fp32>>>("f32")));
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Fp16>, Values<Fp16>>>("f16")));
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Int8<Group<32>>>, Values<Int8<Group<32>>>>>("q8_0")));  // = int8
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Int4<Group<32>, Symmetric>>, Values<Int4<Group<32>, Symmetric>>>>("q4_0")));
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Int4<Group<32>>>, Values<Int4<Group<32>>>>>("q4_1")));  // = int4-g32
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Int8<Group<32>>>, Values<Int4<Group<32>, Symmetric>>>>("q8_0/q4_0")));
  EXPECT_TRUE((resolves_to<PolicySet<Keys<Fp16>, Values<Int4<Group<32>>>>>("f16/q4_1")));
  // ggml block sizes: q8_0 8.5 bits (fp16 d + 32 x int8), q4_0 4.5 (fp16 d + 32 x 4 bits), q4_1 5.0 (fp16 d, m).
  const ModelShape s = small_shape();
  struct Case {
    const char* name;
    double k_bits, v_bits;
  };
  for (const Case c : {Case{"f32", 32, 32}, Case{"f16", 16, 16}, Case{"q8_0", 8.5, 8.5}, Case{"q4_0", 4.5, 4.5},
                       Case{"q4_1", 5.0, 5.0}, Case{"q8_0/q4_0", 8.5, 4.5}, Case{"f16/q4_1", 16, 5.0}}) {
    auto pool = registry::make_pool(c.name, {.shape = s, .byte_budget = 1 << 20, .max_sequences = 1});
    ASSERT_TRUE(pool) << c.name << ": " << pool.error().message;
    EXPECT_DOUBLE_EQ((*pool)->key_bits_per_value(), c.k_bits) << c.name;
    EXPECT_DOUBLE_EQ((*pool)->value_bits_per_value(), c.v_bits) << c.name;
    EXPECT_EQ((*pool)->policy(), c.name);
  }
  auto rare = registry::make_pool("q4_0/q8_0", {.shape = s, .byte_budget = 1 << 20});
  ASSERT_FALSE(rare);
  EXPECT_EQ(rare.error().code, Errc::unsupported);
  EXPECT_NE(rare.error().message.find("q8_0/q4_0"), std::string::npos) << rare.error().message;
}

TEST(Registry, BadNamesFailClearly) {
  const ModelShape s = small_shape();
  auto unknown = registry::make_pool("int3", {.shape = s, .byte_budget = 1 << 20});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Errc::invalid_argument);
  EXPECT_NE(unknown.error().message.find("known: fp32, fp16, int8"), std::string::npos) << unknown.error().message;
  for (const char* n : {"bf16", "q5_0", "q8_0/iq4_nl"}) {
    auto r = registry::make_pool(n, {.shape = s, .byte_budget = 1 << 20, .max_sequences = 2});
    ASSERT_FALSE(r) << n;
    EXPECT_EQ(r.error().code, Errc::unsupported) << n;
  }
  for (const char* n : {"q8_0/", "/q8_0", "q8_0/q4_0/f16", ""}) EXPECT_FALSE(registry::has_policy(n)) << n;
  auto keyframe = registry::make_pool("kf64-chained", {.shape = s, .byte_budget = 1 << 20, .max_sequences = 2});
  ASSERT_FALSE(keyframe);
  EXPECT_EQ(keyframe.error().code, Errc::unsupported);
  EXPECT_NE(keyframe.error().message.find("kf64-chained"), std::string::npos);
  auto shape_err = registry::make_pool("int8", {.shape = {.layers = 0}, .byte_budget = 1 << 20});
  ASSERT_FALSE(shape_err);
  EXPECT_EQ(shape_err.error().code, Errc::invalid_argument);
}

TEST(Registry, PolicyListMatchesTheTable) {
  const auto all = registry::policies();
  std::vector<std::string> defaults;
  for (const auto& p : all)
    if (p.in_defaults) defaults.push_back(p.name);
  EXPECT_EQ(defaults, (std::vector<std::string>{"fp32", "fp16", "int8", "int4-g32", "int4-g64", "k8v4", "kivi4", "fp8-e4m3"}));
  for (const auto& p : all) {
    EXPECT_TRUE(registry::has_policy(p.name)) << p.name;
    // Every eviction name (sink-window, h2o, snapkv, block-sparse) is pool-capable; keyframes are not.
    const bool rejected = p.name.find("kf64") != std::string::npos;
    EXPECT_EQ(p.pool_capable, !rejected) << p.name;
    // Eviction names: sink-window, h2o, snapkv, tova, block-sparse (with or without a codec prefix).
    bool evicting = false;
    for (const char* e : {"sink-window", "h2o", "snapkv", "tova", "block-sparse"})
      evicting = evicting || p.name.find(e) != std::string::npos;
    EXPECT_EQ(p.evicts, evicting) << p.name;
  }
}

// Every pool-capable name: a pooled sequence and the single-sequence cache of the same name,
// (make_single) fed the same chunks (31 + 33 + 1 tokens: odd sizes across group and block
// boundaries) hold the same block bytes and attend bit-identically. Evicting names (sink-window,
// h2o, snapkv, block-sparse) included: the same attends feed the same scores, SnapKV compresses
// on the 1. Block-sparse names get max_tokens 1024: 25 % of 512 cannot hold their three
// protected 64-token blocks (create's invalid_argument, tested in test_eviction_block_sparse).
TEST(Registry, ErasedPoolAndCacheAgreeBitForBit) {
  for (const auto& p : registry::policies()) {
    if (!p.pool_capable) continue;
    SCOPED_TRACE(p.name);
    ModelShape s = small_shape();
    if (p.name.find("block-sparse") != std::string::npos) s.max_tokens = 1024;
    const std::size_t row = static_cast<std::size_t>(s.kv_heads) * s.head_dim, qrow = static_cast<std::size_t>(s.q_heads) * s.head_dim;
    auto pool = registry::make_pool(p.name, {.shape = s, .byte_budget = 4 << 20, .max_sequences = 2});
    ASSERT_TRUE(pool) << pool.error().message;
    auto solo = (*pool)->make_single(s);
    ASSERT_TRUE(solo) << solo.error().message;
    EXPECT_EQ((*solo)->policy(), p.name);
    auto id = (*pool)->create_sequence();
    ASSERT_TRUE(id);
    Workspace ws;
    std::int32_t pos = 0;
    std::uint32_t seed = 1;
    for (const int n : {31, 33, 1}) {
      const auto k = randn(n * row, seed++), v = randn(n * row, seed++), q = randn(n * qrow, seed++);
      std::vector<std::int32_t> positions(static_cast<std::size_t>(n));
      for (auto& x : positions) x = pos++;
      for (int l = 0; l < s.layers; ++l) {
        ASSERT_TRUE((*pool)->append(*id, l, k, v, positions));
        ASSERT_TRUE((*solo)->append(l, k, v, positions));
        std::vector<float> a(q.size()), b(q.size());
        ASSERT_TRUE((*pool)->attend(*id, l, q, a, ws));
        ASSERT_TRUE((*solo)->attend(l, q, b));
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "chunk of " << n << ", layer " << l;
      }
    }
    for (int h = 0; h < s.kv_heads; ++h) {
      auto pages = (*pool)->pages(*id, 1, h);
      ASSERT_TRUE(pages);
      const auto blocks = (*solo)->blocks(1, h);
      ASSERT_EQ(pages->size(), blocks.size());
      for (std::size_t i = 0; i < blocks.size(); ++i)
        EXPECT_EQ(std::memcmp((*pages)[i].data, blocks[i].data.get(), (*solo)->block_layout().bytes), 0);
    }
    EXPECT_EQ(*(*pool)->length(*id), 65);
  }
}

// Evicting names through AnyPool, past their budgets (a quarter of max_tokens = 512, half for
// block-sparse, whose sink, recent and open 64-token blocks need 192): a 200-token prompt (320
// for block-sparse) and 24 decode steps, every step attended, equal the single-sequence cache of
// the same name bit for bit (outputs; pages too where the single cache holds no masked-out
// block), read_back lists the held rows; a fork then evicts on its own; truncate is unsupported.
TEST(Registry, EvictingNamesEvictAsTheirSingleCache) {
  const ModelShape s = small_shape();
  const std::size_t row = static_cast<std::size_t>(s.kv_heads) * s.head_dim, qrow = static_cast<std::size_t>(s.q_heads) * s.head_dim;
  for (const char* name : {"sink-window-25", "h2o-25", "snapkv-25", "int4-g32+h2o-25", "int4-g32+snapkv-25-k9", "block-sparse-50",
                           "int4-g32+block-sparse-50"}) {
    SCOPED_TRACE(name);
    const bool blocks = std::string_view(name).find("block-sparse") != std::string_view::npos;
    const int prompt = blocks ? 320 : 200;
    auto pool = registry::make_pool(name, {.shape = s, .byte_budget = 8 << 20, .max_sequences = 2});
    ASSERT_TRUE(pool) << pool.error().message;
    auto solo = (*pool)->make_single(s);
    ASSERT_TRUE(solo);
    const SeqId id = *(*pool)->create_sequence();
    Workspace ws;
    std::uint32_t seed = 100;
    std::int32_t pos = 0;
    for (int step = 0; step < 25; ++step) {
      const int n = step == 0 ? prompt : 1, n_q = std::min(n, 32);
      const auto k = randn(n * row, seed++), v = randn(n * row, seed++), q = randn(n_q * qrow, seed++);
      std::vector<std::int32_t> positions(static_cast<std::size_t>(n));
      for (auto& x : positions) x = pos++;
      for (int l = 0; l < s.layers; ++l) {
        ASSERT_TRUE((*pool)->append(id, l, k, v, positions));
        ASSERT_TRUE((*solo)->append(l, k, v, positions));
        std::vector<float> a(q.size()), b(q.size());
        ASSERT_TRUE((*pool)->attend(id, l, q, a, ws));
        ASSERT_TRUE((*solo)->attend(l, q, b));
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "step " << step << ", layer " << l;
      }
    }
    for (int h = 0; h < s.kv_heads; ++h) {
      auto pages = (*pool)->pages(id, 1, h);
      ASSERT_TRUE(pages);
      const auto solo_blocks = (*solo)->blocks(1, h);
      if (!blocks) {  // (the single BlockSparse cache keeps masked-out blocks until it compacts; the pool drops them)
        ASSERT_EQ(pages->size(), solo_blocks.size());
        for (std::size_t i = 0; i < solo_blocks.size(); ++i)
          EXPECT_EQ(std::memcmp((*pages)[i].data, solo_blocks[i].data.get(), (*solo)->block_layout().bytes), 0);
      }
      EXPECT_LT(pages->size() * static_cast<std::size_t>((*pool)->block_tokens()), static_cast<std::size_t>(prompt));  // evicted
      const auto held = (*pool)->read_back(id, 1, h);  // the held rows, by cache index (positions = indices here)
      ASSERT_TRUE(held) << held.error().message;
      EXPECT_LT(held->indices.size(), static_cast<std::size_t>(prompt + 25));
      if (blocks) {
        EXPECT_LE(held->indices.size(), 256u);  // the budget
      }
      EXPECT_TRUE(std::is_sorted(held->indices.begin(), held->indices.end()));
      for (std::size_t i = 0; i < held->indices.size(); ++i) EXPECT_EQ(held->positions[i], held->indices[i]);
    }
    auto child = (*pool)->fork(id);
    ASSERT_TRUE(child);
    const auto k = randn(row, 1), q = randn(qrow, 2);
    for (int l = 0; l < s.layers; ++l) {
      ASSERT_TRUE((*pool)->append(*child, l, k, k, std::vector<std::int32_t>{pos}));
      std::vector<float> out(qrow);
      ASSERT_TRUE((*pool)->attend(*child, l, q, out, ws));
    }
    EXPECT_EQ(*(*pool)->length(*child), *(*pool)->length(id) + 1);
    auto t = (*pool)->truncate(id, 10);
    ASSERT_FALSE(t);
    EXPECT_EQ(t.error().code, Errc::unsupported);
    ASSERT_TRUE((*pool)->free_sequence(*child));
    ASSERT_TRUE((*pool)->free_sequence(id));
    EXPECT_EQ((*pool)->stats().pages_free, (*pool)->stats().pages_total);
  }
}

}  // namespace
