// Argument checks and kernel arguments of PagedCache (the same rules and messages as KVCache's
// append and attend), kept apart from the facade.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "kvpack/cache/input_checks.hpp"
#include "kvpack/cache/shape.hpp"
#include "kvpack/kernels/dispatch.hpp"
#include "kvpack/result.hpp"

namespace kvpack::pool_detail {

/// Checks an append of positions.size() tokens to a layer holding `held` tokens: k and v sizes,
/// capacity (shape.max_tokens per sequence and layer), negative positions, non-finite values.
[[nodiscard]] inline Status check_append(const ModelShape& shape, int layer, std::int64_t held, std::span<const float> k,
                                         std::span<const float> v, std::span<const std::int32_t> positions) {
  const auto n = static_cast<std::int64_t>(positions.size());
  const std::size_t row = static_cast<std::size_t>(shape.kv_heads) * static_cast<std::size_t>(shape.head_dim);
  const std::string at = "append: layer " + std::to_string(layer);
  if (k.size() != static_cast<std::size_t>(n) * row || v.size() != k.size())
    return fail(Errc::invalid_argument, at + ": k has " + std::to_string(k.size()) + " and v " + std::to_string(v.size()) +
                                            " floats; expected n_tokens * kv_heads * head_dim = " + std::to_string(n) + " * " +
                                            std::to_string(shape.kv_heads) + " * " + std::to_string(shape.head_dim));
  if (held + n > shape.max_tokens)
    return fail(Errc::capacity_exceeded, at + " holds " + std::to_string(held) + " tokens; " + std::to_string(n) +
                                             " more exceed max_tokens = " + std::to_string(shape.max_tokens) + " per sequence");
  for (std::size_t t = 0; t < positions.size(); ++t)
    if (positions[t] < 0)
      return fail(Errc::invalid_argument, at + ": negative position " + std::to_string(positions[t]) + " at token " +
                                              std::to_string(t) + " of the chunk");
  for (const auto& [x, name] : {std::pair{k, "K"}, std::pair{v, "V"}})
    if (Status f = cache_detail::check_finite_rows(shape, layer, held, x, name); !f) return f;
  return {};
}

using cache_detail::check_queries;  // attend / attend_batch queries: the same rules as KVCache::attend

/// Errc::non_finite when an attention output is not finite (a logit overflowed fp32).
[[nodiscard]] inline Status check_output(const ModelShape& shape, int layer, std::span<const float> out, std::int64_t seq) {
  for (std::size_t i = 0; i < out.size(); ++i)
    if (!std::isfinite(out[i]))
      return fail(Errc::non_finite, std::string(seq >= 0 ? "attend_batch: sequence " + std::to_string(seq) : "attend") +
                                        ": layer " + std::to_string(layer) + ": attention output " + std::to_string(out[i]) +
                                        " at q head " + std::to_string(i / static_cast<std::size_t>(shape.head_dim)) +
                                        " is not finite (a logit q.k * scale overflowed fp32, or K/V too large)");
  return {};
}

}  // namespace kvpack::pool_detail
