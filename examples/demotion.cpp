// What it shows: demotion instead of deletion (issue 24). Four caches hold the same 1024-token
// prompt and 64 decode steps on one layer; the three eviction caches keep a quarter of the prompt
// at INT4 (H2O, fixed budget). One deletes what H2O drops; one re-codes all of it into an INT4
// low tier; one re-codes it into INT4 keys / INT2 values within a byte budget of 12.5 % of an
// fp16 cache (both tiers), deleting the oldest demoted rows beyond it. Each decode query looks
// back at one old token (as a retrieval question does), so a deleted token is an error the cache
// cannot undo. Printed per cache: bytes held as a share of an fp16 cache of the same tokens,
// tokens held high / low per KV head, and the attention error against the fp32 cache (the
// budgeted cache holds more than 12.5 %: rows wait in fp32 until a block of 32 fills, outside the
// budget of coded rows; and its FIFO deletes most old tokens, so it recovers little here). On a
// real model the same comparison is README's equal-memory table: examples/equal_memory.sh remakes it.
// Run it:  cmake --build build/gcc-release --target kvpack-example-demotion && build/gcc-release/examples/kvpack-example-demotion
#include <kvpack/kvpack.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace kv = kvpack;
using Int4 = kv::Int4<kv::Group<32>>;
using Int2 = kv::Int2<kv::Group<32>>;
using QuarterH2O = kv::Protocol<kv::H2OBudget<kv::Fraction<1, 4>>, kv::FixedBudget>;

using Full = kv::KVCache<>;                                                  // fp32, every token
using Deleting = kv::KVCache<kv::Keys<Int4>, kv::Values<Int4>, QuarterH2O>;  // 25 % of the prompt, the rest deleted
using Demoting = kv::KVCache<kv::Keys<Int4>, kv::Values<Int4>, QuarterH2O,   // the same high tier, plus
                             kv::Demote<kv::Keys<Int4>, kv::Values<Int4>>>;   // every dropped token at INT4
using Budgeted = kv::KVCache<kv::Keys<Int4>, kv::Values<Int4>, QuarterH2O,   // the same, both tiers within
                             kv::Demote<kv::Keys<Int4>, kv::Values<Int2>, kv::Fp16Share<1, 8>>>;  // 12.5 % of fp16

constexpr int kPrompt = 1024, kSteps = 64;
const kv::ModelShape kShape{.layers = 1, .q_heads = 8, .kv_heads = 2, .head_dim = 64, .max_tokens = kPrompt + kSteps};

// Deterministic K/V for tokens [first, first + n): [n][kv_heads][head_dim], unit-variance normals.
std::vector<float> rows(std::int64_t first, int n, unsigned salt) {
  std::vector<float> x(static_cast<std::size_t>(n) * kShape.kv_heads * kShape.head_dim);
  for (int t = 0; t < n; ++t) {
    std::mt19937 g(static_cast<unsigned>(first + t) * 2654435761u + salt);
    std::normal_distribution<float> d;
    for (std::size_t i = 0; i < x.size() / static_cast<std::size_t>(n); ++i) x[static_cast<std::size_t>(t) * (x.size() / static_cast<std::size_t>(n)) + i] = d(g);
  }
  return x;
}

// Decode step s's query: for every head, 2x the key of an old token (step-dependent), so its
// attention concentrates there.
std::vector<float> query(int s) {
  const int D = kShape.head_dim, group = kShape.q_heads / kShape.kv_heads;
  const std::int64_t old = (s * 389) % (kPrompt - 64);
  const auto k = rows(old, 1, 1);
  std::vector<float> q(static_cast<std::size_t>(kShape.q_heads) * D);
  for (int h = 0; h < kShape.q_heads; ++h)
    for (int d = 0; d < D; ++d) q[static_cast<std::size_t>(h * D + d)] = 2.f * k[static_cast<std::size_t>((h / group) * D + d)];
  return q;
}

// Runs the prompt (attended, so H2O has its scores) and the decode steps; returns the decode
// outputs, or an empty vector after printing the error.
template <class Cache>
std::vector<float> run(Cache& c) {
  std::vector<std::int32_t> pos(kPrompt);
  for (int i = 0; i < kPrompt; ++i) pos[static_cast<std::size_t>(i)] = i;
  std::vector<float> q(static_cast<std::size_t>(kPrompt) * kShape.q_heads * kShape.head_dim, 0.05f), out(q.size());
  if (auto s = c.append(0, rows(0, kPrompt, 1), rows(0, kPrompt, 2), pos); !s) return std::fprintf(stderr, "%s\n", s.error().message.c_str()), std::vector<float>{};
  if (auto s = c.attend(0, q, out); !s) return std::fprintf(stderr, "%s\n", s.error().message.c_str()), std::vector<float>{};
  std::vector<float> all;
  for (int s = 0; s < kSteps; ++s) {
    const std::int32_t p = kPrompt + s;
    const auto qs = query(s);
    std::vector<float> o(qs.size());
    if (auto st = c.append(0, rows(p, 1, 1), rows(p, 1, 2), std::span<const std::int32_t>(&p, 1)); !st) return std::fprintf(stderr, "%s\n", st.error().message.c_str()), std::vector<float>{};
    if (auto st = c.attend(0, qs, o); !st) return std::fprintf(stderr, "%s\n", st.error().message.c_str()), std::vector<float>{};
    all.insert(all.end(), o.begin(), o.end());
  }
  return all;
}

template <class Cache>
void report(const char* name, Cache& c, const std::vector<float>& out, const std::vector<float>& ref) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) err += (out[i] - ref[i]) * double(out[i] - ref[i]), norm += double(ref[i]) * ref[i];
  const double fp16 = double(c.tokens(0)) * kShape.kv_heads * kShape.head_dim * 2 * 2;  // K and V, 2 bytes per value
  std::int64_t high = 0, low = 0;
  for (int h = 0; h < kShape.kv_heads; ++h) {
    if constexpr (Cache::evicts) high += c.held_tokens(0, h);
    else high += c.tokens(0);
    if constexpr (requires { c.demoted_tokens(0, h); }) low += c.demoted_tokens(0, h);
  }
  std::printf("%-10s %8.1f %% %10.1f %10.1f %12.4f\n", name, 100.0 * double(c.memory_bytes()) / fp16, double(high) / kShape.kv_heads,
              double(low) / kShape.kv_heads, std::sqrt(err / norm));
}

int main() {
  auto full = Full::create(kShape);
  auto del = Deleting::create(kShape);
  auto dem = Demoting::create(kShape);
  auto bud = Budgeted::create(kShape);
  if (!full || !del || !dem || !bud) return std::fprintf(stderr, "create failed\n"), 1;
  const auto ref = run(*full), od = run(*del), om = run(*dem), ob = run(*bud);
  if (ref.empty() || od.empty() || om.empty() || ob.empty()) return 1;
  std::printf("%-10s %10s %10s %10s %12s\n", "cache", "of fp16", "high/head", "low/head", "rel. error");
  report("fp32", *full, ref, ref);
  report("deleting", *del, od, ref);
  report("demoting", *dem, om, ref);
  report("budgeted", *bud, ob, ref);
  return 0;
}
