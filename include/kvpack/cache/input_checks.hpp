// Argument checks that KVCache and PagedCache share, so each bad input gets one rule and one
// message whichever cache receives it: non-finite K/V rows of an append, and the queries of an
// attend (sizes, n_q within the latest append, finite values). Also KVCache::append's K/V sizes
// and positions.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvpack/cache/shape.hpp"
#include "kvpack/result.hpp"

namespace kvpack::cache_detail {

/// Errc::invalid_argument unless k and v each hold n_tokens rows of [kv_heads][head_dim] floats
/// (KVCache::append; nothing appended).
[[nodiscard]] inline Status check_append_sizes(const ModelShape& shape, int layer, std::span<const float> k,
                                               std::span<const float> v, std::size_t n_tokens) {
  const std::size_t row = static_cast<std::size_t>(shape.kv_heads) * static_cast<std::size_t>(shape.head_dim);
  if (k.size() == n_tokens * row && v.size() == k.size()) return {};
  return fail(Errc::invalid_argument, "append: layer " + std::to_string(layer) + ": k has " + std::to_string(k.size()) +
                                          " and v " + std::to_string(v.size()) +
                                          " floats; expected n_tokens * kv_heads * head_dim = " + std::to_string(n_tokens) +
                                          " * " + std::to_string(shape.kv_heads) + " * " + std::to_string(shape.head_dim));
}

/// Errc::invalid_argument for the first negative position of an append's chunk (KVCache::append;
/// nothing appended).
[[nodiscard]] inline Status check_append_positions(int layer, std::span<const std::int32_t> positions) {
  for (std::size_t t = 0; t < positions.size(); ++t)
    if (positions[t] < 0)
      return fail(Errc::invalid_argument, "append: layer " + std::to_string(layer) + ": negative position " +
                                              std::to_string(positions[t]) + " at token " + std::to_string(t) + " of the chunk");
  return {};
}

/// Whether every value of x is finite: a branch-free pass over the exponent bits (all ones for
/// NaN and Inf) that compilers vectorize; an append checks its whole chunk with it at close to
/// memory speed, and only a failing chunk is searched again for the first bad value.
[[nodiscard]] inline bool all_finite(std::span<const float> x) noexcept {
  // |x| as bits is at least 0x7F800000 exactly for NaN and Inf. Fixed 16-value steps: GCC's -O2
  // cost model vectorizes a loop only when its trip count needs no epilogue.
  constexpr std::uint32_t magnitude = 0x7FFFFFFFu, first_non_finite = 0x7F800000u;
  std::uint32_t top = 0;
  std::size_t i = 0;
  for (; i + 16 <= x.size(); i += 16) {
    std::uint32_t step = 0;
    for (std::size_t j = 0; j < 16; ++j) step = std::max(step, std::bit_cast<std::uint32_t>(x[i + j]) & magnitude);
    top = std::max(top, step);
  }
  for (; i < x.size(); ++i) top = std::max(top, std::bit_cast<std::uint32_t>(x[i]) & magnitude);
  return top < first_non_finite;
}

/// Errc::non_finite for the first NaN/Inf in `x` ([n][kv_heads][head_dim] K or V rows of an
/// append, `what` = "K" or "V"), naming layer, KV head, token of the chunk, cache index
/// (first_index + token) and channel; nothing appended. OK when every value is finite.
[[nodiscard]] inline Status check_finite_rows(const ModelShape& shape, int layer, std::int64_t first_index,
                                              std::span<const float> x, const char* what) {
  if (all_finite(x)) return {};
  const std::size_t D = static_cast<std::size_t>(shape.head_dim), row = static_cast<std::size_t>(shape.kv_heads) * D;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i]))
      return fail(Errc::non_finite, std::string("append: non-finite ") + what + " value " + std::to_string(x[i]) +
                                        " at layer " + std::to_string(layer) + ", kv head " + std::to_string((i % row) / D) +
                                        ", token " + std::to_string(i / row) + " of the chunk (cache index " +
                                        std::to_string(first_index + static_cast<std::int64_t>(i / row)) + "), channel " +
                                        std::to_string(i % D) + "; nothing was appended");
  return {};
}

/// Checks the queries of one sequence (`seq` >= 0 names it in a batch): whole tokens, sizes,
/// n_q within the latest append (chunk_tokens), finite values.
[[nodiscard]] inline Status check_queries(const ModelShape& shape, int layer, std::int64_t chunk_tokens,
                                          std::span<const float> q, std::span<const float> out, std::int64_t seq) {
  // The message prefix is built only on an error: a batched decode checks every sequence, and a
  // std::string of this length is a heap allocation each time.
  auto who = [seq] {
    return seq >= 0 ? "attend_batch: sequence " + std::to_string(seq) + " of the batch" : std::string("attend");
  };
  const std::size_t D = static_cast<std::size_t>(shape.head_dim), qrow = static_cast<std::size_t>(shape.q_heads) * D;
  if (q.empty() || q.size() % qrow != 0 || out.size() != q.size())
    return fail(Errc::invalid_argument, who() + ": q has " + std::to_string(q.size()) + " floats and out " +
                                            std::to_string(out.size()) + "; both must be n_q * q_heads * head_dim with n_q >= 1");
  const auto n_q = static_cast<std::int64_t>(q.size() / qrow);
  if (n_q > chunk_tokens)
    return fail(Errc::invalid_argument, who() + ": layer " + std::to_string(layer) + ": " + std::to_string(n_q) +
                                            " queries but the latest append held " + std::to_string(chunk_tokens) + " tokens");
  for (std::size_t i = 0; i < q.size(); ++i)
    if (!std::isfinite(q[i]))
      return fail(Errc::non_finite, who() + ": non-finite q value " + std::to_string(q[i]) + " at layer " + std::to_string(layer) +
                                        ", query " + std::to_string(i / qrow) + ", q head " + std::to_string((i % qrow) / D) +
                                        ", channel " + std::to_string(i % D));
  return {};
}

/// Errc::invalid_argument (naming `what`) unless 0 <= layer < shape.layers.
[[nodiscard]] inline Status check_layer(const ModelShape& shape, const char* what, int layer) {
  if (layer >= 0 && layer < shape.layers) return {};
  return fail(Errc::invalid_argument, std::string(what) + ": layer " + std::to_string(layer) + " out of range [0, " +
                                          std::to_string(shape.layers) + ")");
}

}  // namespace kvpack::cache_detail
