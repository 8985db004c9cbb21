// A deterministic stand-in for a model in the remote-tier tests: the K/V rows of a token depend
// only on (token id, position, layer, KV head, channel), so a cache that imported some pages and
// appended the rest must equal, bit for bit, a cache that appended the whole prompt. That is the
// "correct answer" every fault case checks. Also counts the tokens "run through the model".
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <kvpack/kvpack.hpp>

namespace kvpack_remote_test {

/// INT4-g32 keys and values, 32-token pages: the codec the remote tests share.
using SynthCache = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>,
                                   kvpack::Values<kvpack::Int4<kvpack::Group<32>>>, kvpack::Blocks<32>>;
/// Same shape, INT8: a "foreign codec" for the forged-key tests.
using SynthCacheInt8 = kvpack::KVCache<kvpack::Keys<kvpack::Int8<kvpack::Group<32>>>,
                                       kvpack::Values<kvpack::Int8<kvpack::Group<32>>>, kvpack::Blocks<32>>;

/// 4 layers, 4 query heads over 2 KV heads, head_dim 64, up to 4096 tokens.
inline kvpack::ModelShape synth_shape() {
  kvpack::ModelShape s;
  s.layers = 4;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.max_tokens = 4096;
  return s;
}

/// A prompt of `n` token ids drawn from `seed` (deterministic).
inline std::vector<int32_t> synth_prompt(int n, uint32_t seed) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  uint32_t x = seed * 2654435761u + 12345u;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<int32_t>(x >> 17);
  }
  return t;
}

/// Appends prompt[from, to) to every layer of `cache` at positions from..to-1, as a model would
/// (K/V from the token and its position). Adds the tokens to *computed. Returns false on error.
template <class Cache>
bool synth_append(Cache& cache, std::span<const int32_t> prompt, int64_t from, int64_t to, int64_t* computed = nullptr) {
  if (to <= from) return true;
  const auto& s = cache.shape();
  const auto n = static_cast<std::size_t>(to - from), row = static_cast<std::size_t>(s.kv_heads * s.head_dim);
  std::vector<float> k(n * row), v(n * row);
  std::vector<int32_t> pos(n);
  for (int l = 0; l < s.layers; ++l) {
    for (std::size_t t = 0; t < n; ++t) {
      const auto tok = static_cast<double>(prompt[static_cast<std::size_t>(from) + t]);
      pos[t] = static_cast<int32_t>(from) + static_cast<int32_t>(t);
      for (std::size_t c = 0; c < row; ++c) {
        const double a = tok * 0.0137 + pos[t] * 0.011 + l * 1.3 + static_cast<double>(c) * 0.173;
        k[t * row + c] = static_cast<float>(std::sin(a) * (1.0 + 0.5 * std::cos(tok * 0.003 + c)));
        v[t * row + c] = static_cast<float>(std::cos(a * 0.7) * 2.0);
      }
    }
    if (!cache.append(l, k, v, pos)) return false;
  }
  if (computed) *computed += to - from;
  return true;
}

/// True when both caches hold the same tokens and every layer/head decodes to identical bits.
template <class Cache>
bool synth_same(const Cache& a, const Cache& b, std::string* why = nullptr) {
  const auto& s = a.shape();
  for (int l = 0; l < s.layers; ++l) {
    if (a.tokens(l) != b.tokens(l)) {
      if (why) *why = "layer " + std::to_string(l) + " tokens " + std::to_string(a.tokens(l)) + " vs " + std::to_string(b.tokens(l));
      return false;
    }
    for (int h = 0; h < s.kv_heads; ++h) {
      auto x = a.read_back(l, h), y = b.read_back(l, h);
      if (!x || !y || x->k != y->k || x->v != y->v || x->positions != y->positions) {
        if (why) *why = "layer " + std::to_string(l) + " head " + std::to_string(h) + " differs";
        return false;
      }
    }
  }
  return true;
}

}  // namespace kvpack_remote_test
