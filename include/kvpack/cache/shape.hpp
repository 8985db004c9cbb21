// ModelShape (what a KVCache is created for), its validation, and HeadContents (what read_back
// returns). Shared by the single-sequence KVCache and anything that holds many sequences.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvpack/result.hpp"

namespace kvpack {

/// Shape of the model whose KV cache this is.
struct ModelShape {
  int layers = 0;            ///< transformer layers
  int q_heads = 0;           ///< query heads; a multiple of kv_heads (GQA group = q_heads / kv_heads)
  int kv_heads = 0;          ///< key/value heads
  int head_dim = 0;          ///< channels per head; a multiple of every per-token group size, even
  std::int64_t max_tokens = 0;  ///< capacity per layer, tokens (<= 2^31 - 1)
  float attn_scale = 0.f;    ///< softmax scale; 0 selects 1/sqrt(head_dim)
  /// RoPE of the model, read only by PreRope<> caches (kernels/rope.hpp): base (theta, > 0,
  /// llama.cpp's rope_freq_base), rotated channels (even, <= head_dim; 0 = head_dim), and the
  /// pairing: NeoX (i, i + dims / 2) when rope_neox, else adjacent (2i, 2i + 1).
  float rope_base = 10000.f;
  int rope_dims = 0;
  bool rope_neox = false;
};

/// What one (layer, kv_head) holds, decoded: K and V as attention reads them ([n][head_dim]
/// row-major, quantized tokens dequantized, full-precision tokens exact) and original positions.
struct HeadContents {
  std::vector<float> k, v;
  std::vector<std::int32_t> positions;
  std::vector<std::int64_t> indices;  ///< cache index (order of arrival) of each row
};

/// Checks `shape` for a cache whose key rows are grouped in `key_group` channels (0: keys are not
/// grouped along head_dim) and value rows in `value_group` channels (0: not grouped).
/// Errc::invalid_argument (message prefixed "KVCache::create: "): non-positive sizes, q_heads not
/// a multiple of kv_heads, head_dim odd, above 65535 (BlockHeader's 16-bit field) or not a
/// multiple of a group size, max_tokens above 2^31 - 1, attn_scale negative or not finite.
[[nodiscard]] inline Status validate_shape(const ModelShape& shape, int key_group, int value_group) {
  auto bad = [](std::string m) { return fail(Errc::invalid_argument, "KVCache::create: " + std::move(m)); };
  if (shape.layers <= 0 || shape.q_heads <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 || shape.max_tokens <= 0)
    return bad("layers, q_heads, kv_heads, head_dim and max_tokens must all be positive");
  if (shape.q_heads % shape.kv_heads != 0)
    return bad("q_heads (" + std::to_string(shape.q_heads) + ") must be a multiple of kv_heads (" +
               std::to_string(shape.kv_heads) + ")");
  if (shape.head_dim % 2 != 0) return bad("head_dim must be even");
  if (shape.head_dim > 65535) return bad("head_dim exceeds 65535 (the 16-bit head_dim of BlockHeader)");
  if (key_group > 0 && shape.head_dim % key_group != 0)
    return bad("head_dim " + std::to_string(shape.head_dim) + " is not a multiple of the key group size " +
               std::to_string(key_group));
  if (value_group > 0 && shape.head_dim % value_group != 0)
    return bad("head_dim " + std::to_string(shape.head_dim) + " is not a multiple of the value group size " +
               std::to_string(value_group));
  if (shape.max_tokens > std::numeric_limits<std::int32_t>::max()) return bad("max_tokens exceeds 2^31 - 1");
  if (!(shape.attn_scale >= 0.f) || std::isinf(shape.attn_scale)) return bad("attn_scale must be finite and >= 0");
  return {};
}

/// Checks the RoPE fields of `shape` for a PreRope<> cache. Errc::invalid_argument (prefixed
/// "<what>: "): rope_base not finite and > 0, rope_dims odd, negative or above head_dim.
[[nodiscard]] inline Status validate_rope(const ModelShape& shape, const std::string& what = "KVCache::create") {
  if (!(shape.rope_base > 0.f) || std::isinf(shape.rope_base))
    return fail(Errc::invalid_argument, what + ": PreRope<>: rope_base must be finite and > 0");
  if (shape.rope_dims < 0 || shape.rope_dims % 2 != 0 || shape.rope_dims > shape.head_dim)
    return fail(Errc::invalid_argument, what + ": PreRope<>: rope_dims (" + std::to_string(shape.rope_dims) +
                                            ") must be even and in [0, head_dim]; 0 rotates every channel");
  return {};
}

}  // namespace kvpack
