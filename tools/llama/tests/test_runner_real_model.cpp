// Real-model smoke tests of the runner on SmolLM2-135M-Instruct (Q4_1 GGUF) and WikiText-2:
// the forward pass against an independent numpy reference, perplexity in the sane range, int8
// within 1 % of the fp32 cache, a destructive cache that must wreck perplexity, and models with
// wrong weights that must fail the same checks.
// Model: $KVPACK_MODEL_PATH, else $KVPACK_MODEL_DIR or ~/.cache/kvpack/models (tools/fetch_model.sh).
// Text: $KVPACK_WIKITEXT_PATH, else ../shared/data/wikitext-2-raw/wiki.test.raw beside the project.
// Both absent: the tests skip and say why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "eval.hpp"
#include "model.hpp"
#include "policies.hpp"
#include "tokenizer.hpp"

namespace {

namespace kl = kvpack::llama;

std::string model_path() {
  if (const char* p = std::getenv("KVPACK_MODEL_PATH")) return p;
  const char* dir = std::getenv("KVPACK_MODEL_DIR");
  const char* home = std::getenv("HOME");
  return (dir ? std::string(dir) : std::string(home ? home : ".") + "/.cache/kvpack/models") +
         "/SmolLM2-135M-Instruct.Q4_1.gguf";
}
std::string wikitext_path() {
  if (const char* p = std::getenv("KVPACK_WIKITEXT_PATH")) return p;
  // WikiText-2 test from the shared data beside the project, else its in-repo 7.8 KB head.
  const std::string shared = std::string(KVPACK_SOURCE_DIR) + "/../shared/data/wikitext-2-raw/wiki.test.raw";
  if (std::ifstream(shared).good()) return shared;
  return std::string(KVPACK_SOURCE_DIR) + "/tools/llama/tests/data/wikitext2_test_head.raw";
}

constexpr int64_t kCtx = 256;   // 2 windows of 256 tokens: 254 scored tokens
constexpr int kWindows = 2;
constexpr int kChunk = 32;

struct Shared {
  kl::Model model;
  std::vector<int32_t> tokens;  // the first kCtx * kWindows tokens of WikiText-2
  double fp32_ppl = 0;
};
std::unique_ptr<Shared> g;
std::string g_skip, g_text_skip;

// Skips a test that scores WikiText-2 when the file is absent.
#define NEED_WIKITEXT() \
  if (!g_text_skip.empty()) GTEST_SKIP() << g_text_skip

class RealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (g || !g_skip.empty()) return;
    const std::string mp = model_path(), tp = wikitext_path();
    if (!std::filesystem::exists(mp)) {
      g_skip = "model not found at " + mp + " (run tools/fetch_model.sh or set KVPACK_MODEL_PATH)";
      return;
    }
    auto file = kl::GgufFile::open(mp);
    ASSERT_TRUE(file) << file.error().message;
    auto model = kl::Model::from_gguf(*file, mp);
    ASSERT_TRUE(model) << model.error().message;
    auto tok = kl::Tokenizer::from_gguf(*file);
    ASSERT_TRUE(tok) << tok.error().message;
    std::vector<int32_t> ids;
    if (std::filesystem::exists(tp)) {
      std::ifstream in(tp, std::ios::binary);
      std::string text(64 * 1024, '\0');  // enough text for 512 tokens
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<size_t>(in.gcount()));
      ids = tok->encode(text);
      ASSERT_GE(static_cast<int64_t>(ids.size()), kCtx * kWindows);
      ids.resize(size_t(kCtx * kWindows));
    } else {
      g_text_skip = "WikiText-2 not found at " + tp + " (set KVPACK_WIKITEXT_PATH)";
    }
    g = std::make_unique<Shared>(Shared{std::move(model).value(), std::move(ids), 0});
  }
  void SetUp() override {
    if (!g_skip.empty()) GTEST_SKIP() << g_skip;
    ASSERT_TRUE(g);
  }
  template <class Cache>
  static double ppl(const kl::Model& m) {
    auto cache = Cache::create(m.cache_shape(kCtx));
    EXPECT_TRUE(cache);
    auto p = kl::perplexity(m, *cache, g->tokens, kCtx, kWindows, kChunk);
    EXPECT_TRUE(p) << p.error().message;
    EXPECT_EQ(p->scored, kWindows * (kCtx / 2 - 1));
    return p->ppl;
  }
  static double fp32_ppl() {
    if (g->fp32_ppl == 0) g->fp32_ppl = ppl<kl::cache_for<"fp32">>(g->model);
    return g->fp32_ppl;
  }
};

// Logits of "The capital of France is Paris. The city has a population" against
// tools/llama/tests/reference_forward.py (float64 numpy, weights dequantized by gguf-py),
// for prefill chunks of 12, 5 and 1 tokens (1 = token-by-token decode through the cache).
TEST_F(RealModel, LogitsMatchIndependentNumpyReference) {
  const std::vector<int32_t> ids = {504, 3575, 282, 4649, 314, 7042, 30, 378, 2240, 553, 253, 2155};
  struct Golden {
    int pos;
    int32_t token;
    float logit;
  };
  const Golden golden[] = {{0, 29, 27.35336f},   {0, 28, 25.56559f},    {0, 198, 25.06730f},
                           {4, 7042, 17.37126f}, {4, 260, 14.88859f},   {4, 4528, 13.24497f},
                           {8, 314, 23.96246f},  {8, 282, 23.41729f},   {11, 282, 30.83281f},
                           {11, 23269, 24.41382f}, {11, 8553, 23.92871f}};
  for (int chunk : {12, 5, 1}) {
    auto cache = kl::cache_for<"fp32">::create(g->model.cache_shape(16));
    ASSERT_TRUE(cache);
    kl::RowMat all(static_cast<Eigen::Index>(ids.size()), g->model.cfg.vocab);
    auto st = kl::run_chunked(
        g->model, *cache, ids, 0, chunk, [&](int64_t i0, kl::RowMat& lg) { all.middleRows(i0, lg.rows()) = lg; },
        [](int64_t) {});
    ASSERT_TRUE(st) << st.error().message;
    for (const Golden& x : golden) {
      EXPECT_NEAR(all(x.pos, x.token), x.logit, 2e-3) << "chunk " << chunk << " pos " << x.pos << " token " << x.token;
    }
    for (auto [pos, top1] : {std::pair{0, 29}, std::pair{4, 7042}, std::pair{8, 314}, std::pair{11, 282}}) {
      Eigen::Index top = 0;
      all.row(pos).maxCoeff(&top);
      EXPECT_EQ(top, top1) << "chunk " << chunk << " pos " << pos;
    }
  }
}

// SmolLM2-135M scores ~24 at this length (llama.cpp-style windows); a broken forward pass gives
// hundreds or thousands.
TEST_F(RealModel, Fp32CachePerplexityIsSane) {
  NEED_WIKITEXT();
  const double p = fp32_ppl();
  RecordProperty("fp32_ppl", std::to_string(p));
  EXPECT_GT(p, 12.0);
  EXPECT_LT(p, 35.0);
}

TEST_F(RealModel, Int8WithinOnePercentOfFp32) {
  NEED_WIKITEXT();
  const double p = ppl<kl::cache_for<"int8">>(g->model);
  EXPECT_LT(std::abs(p / fp32_ppl() - 1), 0.01) << "int8 " << p << " vs fp32 " << fp32_ppl();
}

// The engine's own cache (no kvpack) and kvpack's Fp32 cache compute the same attention.
TEST_F(RealModel, ReferenceCacheMatchesKvpackFp32) {
  NEED_WIKITEXT();
  EXPECT_NEAR(ppl<kl::ReferenceCache>(g->model), fp32_ppl(), 1e-3 * fp32_ppl());
}

// Every V zeroed in the cache: attention outputs vanish. If perplexity did not collapse, the
// scored tokens would not be reading the cache.
TEST_F(RealModel, DestructiveCacheWrecksPerplexity) {
  NEED_WIKITEXT();
  EXPECT_GT(ppl<kl::cache_for<"zero-v">>(g->model), 10 * fp32_ppl());
}

// Wrong weights must fail the sane-range check: layers in reverse order, and each layer's Q
// projection swapped with its output projection (same shape: a "wrong tensor" mix-up).
TEST_F(RealModel, WrongWeightsFailTheSaneRange) {
  NEED_WIKITEXT();
  kl::Model reversed = g->model;
  std::reverse(reversed.layers.begin(), reversed.layers.end());
  EXPECT_GT(ppl<kl::cache_for<"fp32">>(reversed), 100.0);

  kl::Model mixed = g->model;
  for (auto& w : mixed.layers) std::swap(w.wq, w.wo);
  EXPECT_GT(ppl<kl::cache_for<"fp32">>(mixed), 100.0);
}

}  // namespace
