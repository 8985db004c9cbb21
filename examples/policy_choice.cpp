// What it shows: choosing the KV-cache policy at compile time. The engine code is one template
// over the cache type; each policy is a type alias, and a bad combination does not compile
// (e.g. KVCache<Keys<Int4<Group<32>>, PerChannel>, SinkWindow<4, 60>> stops with a
// static_assert: token-level eviction needs per-token keys). The program runs the same
// 200-token sequence through four caches and prints their size and their error against fp32.
// Run it:  cmake --build build/gcc-release --target kvpack-example-policy-choice && build/gcc-release/examples/kvpack-example-policy-choice
#include <kvpack/kvpack.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace kv = kvpack;
using Fp32 = kv::KVCache<>;                                                          // the reference
using Int8 = kv::KVCache<kv::Keys<kv::Int8<kv::Group<32>>>, kv::Values<kv::Int8<kv::Group<32>>>>;
using Kivi4 = kv::KVCache<kv::Keys<kv::Int4<kv::Group<32>>, kv::PerChannel>,  // KIVI: per-channel keys,
                          kv::Values<kv::Int4<kv::Group<32>>>, kv::Residual<32>>;  // newest 32 tokens fp32
using Window = kv::KVCache<kv::Keys<kv::Int4<kv::Group<32>>>, kv::Values<kv::Int4<kv::Group<32>>>,
                           kv::SinkWindow<4, 60>>;  // StreamingLLM: 4 sinks + the last 60 tokens

constexpr kv::ModelShape kShape{.layers = 1, .q_heads = 4, .kv_heads = 1, .head_dim = 64, .max_tokens = 256};

/// Feeds 200 tokens one at a time and returns the attention output of every step
/// ([200][q_heads][head_dim]), or an empty vector after printing the error.
template <class Cache>
std::vector<float> run(const char* name) {
  auto cache = Cache::create(kShape);
  if (!cache) return std::fprintf(stderr, "%s: %s\n", name, cache.error().message.c_str()), std::vector<float>{};
  std::vector<float> all, k(64), v(64), q(4 * 64), out(q.size());
  for (std::int32_t t = 0; t < 200; ++t) {
    for (int c = 0; c < 64; ++c) k[size_t(c)] = std::sin(0.37f * float(t * 64 + c)), v[size_t(c)] = std::cos(0.11f * float(t + c));
    for (int c = 0; c < 4 * 64; ++c) q[size_t(c)] = std::sin(0.05f * float(c + t));
    const std::int32_t pos = t;
    if (auto s = cache->append(0, k, v, std::span(&pos, 1)); !s) return std::fprintf(stderr, "%s\n", s.error().message.c_str()), std::vector<float>{};
    if (auto s = cache->attend(0, q, out); !s) return std::fprintf(stderr, "%s\n", s.error().message.c_str()), std::vector<float>{};
    all.insert(all.end(), out.begin(), out.end());
  }
  std::printf("%-7s %5.2f bits/key value  %6zu bytes  holds %3lld of 200 tokens", name, Cache::key_bits_per_value,
              cache->memory_bytes(), static_cast<long long>(cache->held_tokens(0)));
  if constexpr (Cache::evicts) std::printf(" (evicts)");
  return all;
}

int main() {
  const auto ref = run<Fp32>("fp32");
  std::printf("\n");
  auto report = [&](const std::vector<float>& o) {
    double err = 0;
    for (size_t i = 0; i < o.size() && i < ref.size(); ++i) err = std::max(err, double(std::abs(o[i] - ref[i])));
    std::printf("  max |out - fp32| = %.4f\n", err);
    return o.empty() ? 1 : 0;
  };
  return report(run<Int8>("int8")) | report(run<Kivi4>("kivi4")) | report(run<Window>("window")) | (ref.empty() ? 1 : 0);
}
