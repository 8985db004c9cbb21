// SnapKV's pooling kernel (the Kernel template parameter) end to end through KVCache, against a
// float64 brute-force reference of the rule documented on kvpack::SnapKV: causal softmax of each
// observation-window query over the prompt, summed over the window, mean over the query heads of
// a KV head (GQA), centred 1-D max pool of width Kernel (edges use what exists), top Budget by
// (pooled desc, raw desc, older first), plus the window. Wider kernels (7, 9) matter on the real
// model: SmolLM2-135M spells a 5-digit pass key as 6 tokens and kernel 5 evicts its last digits
// (docs/RESULTS-snapkv-needle.md). Odd sizes: 9 query / 3 KV heads, head_dim 34 (KVCache needs
// an even head_dim), a 95-token prompt in chunks of 33, 33, 29, observation window 7, budget 31.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "support/eviction_check.hpp"

namespace snapkv_kernel_test {  // named: in a unity build its names must not meet another file's (kD, Prompt)
namespace {

constexpr int kQ = 9, kKV = 3, kD = 34, kN = 95, kWin = 7, kBudget = 31;

struct Prompt {
  std::vector<float> k, v, q;  // [kN][kKV][kD], [kN][kKV][kD], [kN][kQ][kD]
};

Prompt make_prompt() {
  Prompt p;
  p.k = kvtest::normal(static_cast<size_t>(kN) * kKV * kD, 11);
  p.v = kvtest::normal(static_cast<size_t>(kN) * kKV * kD, 12);
  p.q = kvtest::normal(static_cast<size_t>(kN) * kQ * kD, 13, 2.f);  // sharp enough to separate scores
  return p;
}

/// Float64 reference: the kept cache indices of KV head g, ascending, and the ranking margin at
/// the budget boundary (pooled score gap, or the raw gap when the pooled scores tie), so the test
/// can check that float32 rounding cannot flip the choice.
std::vector<int64_t> reference_kept(const Prompt& p, int g, int kernel, double& margin) {
  const int group = kQ / kKV, n_cand = kN - kWin;
  std::vector<double> raw(static_cast<size_t>(n_cand), 0.0);
  for (int j = 0; j < group; ++j) {
    const int h = g * group + j;
    for (int i = kN - kWin; i < kN; ++i) {
      std::vector<double> s(static_cast<size_t>(i) + 1);
      double mx = -1e300, l = 0;
      for (int t = 0; t <= i; ++t) {
        double dot = 0;
        for (int d = 0; d < kD; ++d)
          dot += double{p.q[(static_cast<size_t>(i) * kQ + static_cast<size_t>(h)) * kD + static_cast<size_t>(d)]} *
                 double{p.k[(static_cast<size_t>(t) * kKV + static_cast<size_t>(g)) * kD + static_cast<size_t>(d)]};
        s[static_cast<size_t>(t)] = dot / std::sqrt(double{kD});
        mx = std::max(mx, s[static_cast<size_t>(t)]);
      }
      for (double x : s) l += std::exp(x - mx);
      for (int t = 0; t < n_cand; ++t) raw[static_cast<size_t>(t)] += std::exp(s[static_cast<size_t>(t)] - mx) / l / group;
    }
  }
  std::vector<double> pooled(raw.size());
  for (int t = 0; t < n_cand; ++t) {
    double m = raw[static_cast<size_t>(t)];
    for (int u = std::max(0, t - kernel / 2); u <= std::min(n_cand - 1, t + kernel / 2); ++u) m = std::max(m, raw[static_cast<size_t>(u)]);
    pooled[static_cast<size_t>(t)] = m;
  }
  std::vector<int64_t> order(static_cast<size_t>(n_cand));
  std::iota(order.begin(), order.end(), int64_t{0});
  auto before = [&](int64_t a, int64_t b) {
    const auto ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
    if (pooled[ua] != pooled[ub]) return pooled[ua] > pooled[ub];
    if (raw[ua] != raw[ub]) return raw[ua] > raw[ub];
    return a < b;
  };
  std::sort(order.begin(), order.end(), before);
  const auto a = static_cast<size_t>(order[kBudget - 1]), b = static_cast<size_t>(order[kBudget]);
  margin = pooled[a] != pooled[b] ? pooled[a] - pooled[b] : raw[a] - raw[b];
  std::vector<int64_t> kept(order.begin(), order.begin() + kBudget);
  for (int64_t w = kN - kWin; w < kN; ++w) kept.push_back(w);
  std::sort(kept.begin(), kept.end());
  return kept;
}

template <int Kernel>
std::vector<std::vector<int64_t>> run_cache(const Prompt& p) {
  using Cache = kvpack::KVCache<kvpack::SnapKV<kBudget, kWin, Kernel>>;
  auto c = Cache::create({.layers = 1, .q_heads = kQ, .kv_heads = kKV, .head_dim = kD, .max_tokens = 128}).value();
  const size_t row = static_cast<size_t>(kKV) * kD, qrow = static_cast<size_t>(kQ) * kD;
  int t0 = 0;
  for (int n : {33, 33, 29}) {
    auto cut = [&](const std::vector<float>& x, size_t r) {
      return std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(t0) * r),
                                x.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(t0 + n) * r));
    };
    EXPECT_TRUE(c.append(0, cut(p.k, row), cut(p.v, row), kvtest::iota_positions(t0, n)));
    std::vector<float> out(static_cast<size_t>(n) * qrow);
    EXPECT_TRUE(c.attend(0, cut(p.q, qrow), out));
    t0 += n;
  }
  EXPECT_TRUE(c.compress_prompt(0));
  std::vector<std::vector<int64_t>> kept;
  for (int g = 0; g < kKV; ++g) kept.push_back(kvtest::kept_indices(c, 0, g));
  return kept;
}

template <int Kernel>
void check_kernel() {
  const Prompt p = make_prompt();
  const auto kept = run_cache<Kernel>(p);
  for (int g = 0; g < kKV; ++g) {
    double margin = 0;
    const auto want = reference_kept(p, g, Kernel, margin);
    ASSERT_GT(margin, 1e-5) << "kernel " << Kernel << " KV head " << g << ": the input must not leave a near-tie at the budget";
    EXPECT_EQ(kept[static_cast<size_t>(g)], want) << "kernel " << Kernel << " KV head " << g;
    EXPECT_EQ(kept[static_cast<size_t>(g)].size(), static_cast<size_t>(kBudget + kWin));
  }
}

TEST(SnapKVKernel, Kernel1MatchesFloat64Reference) { check_kernel<1>(); }
TEST(SnapKVKernel, Kernel5MatchesFloat64Reference) { check_kernel<5>(); }
TEST(SnapKVKernel, Kernel7MatchesFloat64Reference) { check_kernel<7>(); }
TEST(SnapKVKernel, Kernel9MatchesFloat64Reference) { check_kernel<9>(); }

TEST(SnapKVKernel, WiderKernelKeepsTheTokensAfterAPeak) {
  // The needle mechanism in miniature (eviction::snapkv_select on hand-written scores): the window
  // attends to token 10 (a key's first digit); tokens 11-14 (the next digits) get little mass of
  // their own, and token 20 is a second, weaker peak. Budget 9: kernel 9 keeps 6..14 (the peak's
  // +-4 share its pooled score), kernel 5 keeps only 8..12 and spends the rest on token 20's
  // neighbourhood, so tokens 13 and 14 are evicted.
  std::vector<float> raw(30);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = 0.001f * static_cast<float>(i % 7);
  raw[10] = 1.f;
  raw[20] = 0.5f;
  raw[25] = 0.4f;
  EXPECT_EQ(kvpack::eviction::snapkv_select(raw, 9, 9), (std::vector<int64_t>{6, 7, 8, 9, 10, 11, 12, 13, 14}));
  EXPECT_EQ(kvpack::eviction::snapkv_select(raw, 5, 9), (std::vector<int64_t>{8, 9, 10, 11, 12, 18, 19, 20, 22}));
}

}  // namespace
}  // namespace snapkv_kernel_test
