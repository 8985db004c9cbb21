// Shared by the offloaded-KVCache tests: a small model shape, a deterministic engine loop
// (append + attend per layer, prefill chunks then decode tokens of odd sizes) and bit-level
// comparison of its outputs with the same loop on a fully resident cache.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kvpack/kvpack.hpp"
#include "kvpack/offload.hpp"

namespace kvpack::offload::testing {

/// 5 layers, GQA 6 query heads on 3 KV heads, head_dim 32 (one INT4 group of 32).
inline ModelShape offload_shape(std::int64_t max_tokens = 512, int layers = 5) {
  ModelShape s;
  s.layers = layers;
  s.q_heads = 6;
  s.kv_heads = 3;
  s.head_dim = 32;
  s.max_tokens = max_tokens;
  return s;
}

/// Chunk sizes of the engine loop: odd prefill chunks, then single-token decode steps.
inline std::vector<int> odd_chunks(int decode_steps = 20) {
  std::vector<int> c{33, 1, 31, 95, 17};
  for (int i = 0; i < decode_steps; ++i) c.push_back(1);
  return c;
}

/// Deterministic K, V and q of one chunk of one layer: [n][heads][head_dim], N(0,1) scaled per
/// channel so quantization is not trivial.
struct ChunkData {
  std::vector<float> k, v, q;
  std::vector<std::int32_t> pos;
};
inline ChunkData make_chunk(const ModelShape& s, int layer, std::int64_t first, int n) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(layer) * 1000003u + static_cast<std::uint64_t>(first) * 7919u + 17u);
  std::normal_distribution<float> nd(0.f, 1.f);
  ChunkData c;
  const auto kv = static_cast<std::size_t>(n) * static_cast<std::size_t>(s.kv_heads * s.head_dim);
  const auto qn = static_cast<std::size_t>(n) * static_cast<std::size_t>(s.q_heads * s.head_dim);
  c.k.resize(kv);
  c.v.resize(kv);
  c.q.resize(qn);
  for (std::size_t i = 0; i < kv; ++i) {
    const float ch = 1.f + static_cast<float>(i % static_cast<std::size_t>(s.head_dim)) * 0.1f;
    c.k[i] = nd(rng) * ch;
    c.v[i] = nd(rng);
  }
  for (float& x : c.q) x = nd(rng);
  for (int t = 0; t < n; ++t) c.pos.push_back(static_cast<std::int32_t>(first + t));
  return c;
}

/// Result of one attend in the loop.
struct Step {
  int chunk = 0, layer = 0;
  Status status;
  std::vector<float> out;
};

/// Runs the engine loop on `cache`: for every chunk, for every layer, append then attend.
/// `on_attend_error(cache, layer, q, out)` may retry a failed attend and return its status.
template <class Cache, class Retry>
std::vector<Step> run_loop(Cache& cache, const std::vector<int>& chunks, Retry&& retry) {
  const ModelShape& s = cache.shape();
  std::vector<Step> steps;
  std::int64_t first = 0;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    for (int l = 0; l < s.layers; ++l) {
      const ChunkData d = make_chunk(s, l, first, chunks[c]);
      Step st;
      st.chunk = static_cast<int>(c);
      st.layer = l;
      st.status = cache.append(l, d.k, d.v, d.pos);
      if (!st.status) {
        steps.push_back(std::move(st));
        continue;
      }
      st.out.assign(d.q.size(), 0.f);
      st.status = cache.attend(l, d.q, st.out);
      if (!st.status) st.status = retry(cache, l, std::span<const float>(d.q), std::span<float>(st.out), st.status);
      steps.push_back(std::move(st));
    }
    first += chunks[c];
  }
  return steps;
}

template <class Cache>
std::vector<Step> run_loop(Cache& cache, const std::vector<int>& chunks) {
  return run_loop(cache, chunks, [](Cache&, int, std::span<const float>, std::span<float>, const Status& s) { return s; });
}

/// Whether two float vectors are bit-identical.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace kvpack::offload::testing
