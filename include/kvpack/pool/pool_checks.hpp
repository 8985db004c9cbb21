// Argument checks and kernel arguments of PagedCache (the same rules and messages as KVCache's
// append and attend, and the masks of a batched decode), kept apart from the facade.
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
#include "kvpack/pool/pool_types.hpp"
#include "kvpack/result.hpp"

namespace kvpack::pool_detail {

/// Fails to compile, naming the policy, when KVCache type Single cannot live on a page pool
/// without eviction (BasicPagedCache); returns true otherwise.
template <class Single>
consteval bool check_basic_pool() {
  static_assert(!Single::evicts, "kvpack::BasicPagedCache<...>: evicting policies use EvictingPagedCache (name PagedCache<...>)");
  static_assert(!Single::offloads, "kvpack::PagedCache<...>: Offload<> is not supported on the page pool yet");
  static_assert(!Single::pre_rope || !Single::rope_cache_relative,
                "kvpack::PagedCache<...>: PreRope<CacheRelative> is not supported on the page pool (without eviction a "
                "token's rank is its cache index: use PreRope<OriginalPositions> with positions 0, 1, ...)");
  static_assert(!Single::codec_hook::interval_blocks,
                "kvpack::PagedCache<...>: Keyframe<...> codecs are not supported on the page pool yet");
  return true;
}

/// Checks an append of positions.size() tokens to a layer holding `held` tokens: k and v sizes,
/// capacity (shape.max_tokens per sequence and layer), negative positions (and, rope_table,
/// positions >= max_tokens: a PreRope<> pool's table); non-finite values too unless `values` is
/// false (PagedCache checks them while staging the rows: ChunkStage).
[[nodiscard]] inline Status check_append(const ModelShape& shape, int layer, std::int64_t held, std::span<const float> k,
                                         std::span<const float> v, std::span<const std::int32_t> positions,
                                         bool values = true, bool rope_table = false) {
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
    else if (rope_table && positions[t] >= shape.max_tokens)
      return fail(Errc::invalid_argument, at + ": position " + std::to_string(positions[t]) + " at token " + std::to_string(t) +
                                              " is outside the PreRope<> pool's RoPE table [0, max_tokens = " +
                                              std::to_string(shape.max_tokens) + ")");
  if (values)
    for (const auto& [x, name] : {std::pair{k, "K"}, std::pair{v, "V"}})
      if (Status f = cache_detail::check_finite_rows(shape, layer, held, x, name); !f) return f;
  return {};
}

using cache_detail::check_queries;
using cache_detail::check_layer;  // one layer check for KVCache and both pools

/// A sequence handle's check, as both pools' calls make it: Errc::invalid_argument when the
/// handle is not live (freed, stale or never created), Errc::not_present when the sequence is
/// swapped out and the call needs its pages; messages name `what` and the handle.
[[nodiscard]] inline Status check_handle(const char* what, SeqId id, bool live, bool swapped_out) {
  if (live && !swapped_out) return {};
  return fail(live ? Errc::not_present : Errc::invalid_argument,
              std::string(what) + ": sequence {" + std::to_string(id.index) + ", " + std::to_string(id.generation) + "} " +
                  (live ? "is swapped out (swap_in first)" : "is not live (freed, stale or never created)"));
}  // attend / attend_batch queries: the same rules as KVCache::attend

/// Errc::invalid_argument unless attend_batch got N >= 1 sequences, q and out of N * qrow floats
/// (qrow = q_heads * head_dim) and at least one workspace.
[[nodiscard]] inline Status check_batch_sizes(std::size_t N, std::size_t qrow, std::size_t q, std::size_t out,
                                              std::size_t workspaces) {
  if (N > 0 && q == N * qrow && out == q && workspaces > 0) return {};
  return fail(Errc::invalid_argument, "attend_batch: need N >= 1 sequences, q and out of N * q_heads * head_dim = " +
                                          std::to_string(N * qrow) + " floats (got " + std::to_string(q) + ", " +
                                          std::to_string(out) + ") and at least one workspace");
}

/// Runs task(0) ... task(W - 1) through the caller's executor, or in turn on this thread without one.
template <class Executor, class Task>
void run_tasks(int W, const Executor& exec, Task&& task) {
  if (exec) exec(W, task);
  else
    for (int w = 0; w < W; ++w) task(w);
}

/// Checks the masks of a batched decode (BatchMask, pool_types.hpp) against the batch: N + 1
/// non-decreasing offsets within values (Errc::invalid_argument); mask i of exactly tokens[i]
/// entries (Errc::invalid_argument naming both lengths); no NaN or +inf entry (Errc::non_finite
/// naming the sequence and the index); not every entry -inf (Errc::invalid_argument).
[[nodiscard]] inline Status check_masks(int layer, const BatchMask& m, std::span<const std::int64_t> tokens) {
  const std::size_t N = tokens.size();
  const std::string who = "attend_batch (masked): layer " + std::to_string(layer);
  if (m.offsets.size() != N + 1)
    return fail(Errc::invalid_argument, who + ": mask offsets hold " + std::to_string(m.offsets.size()) +
                                            " entries; a batch of " + std::to_string(N) + " sequences needs N + 1 = " +
                                            std::to_string(N + 1));
  for (std::size_t i = 0; i <= N; ++i)
    if (m.offsets[i] < (i == 0 ? 0 : m.offsets[i - 1]) || static_cast<std::uint64_t>(m.offsets[i]) > m.values.size())
      return fail(Errc::invalid_argument, who + ": mask offset " + std::to_string(i) + " = " + std::to_string(m.offsets[i]) +
                                              " is negative, below the previous one or beyond the " +
                                              std::to_string(m.values.size()) + " mask values");
  for (std::size_t i = 0; i < N; ++i) {
    const std::string seq = who + ": sequence " + std::to_string(i) + " of the batch";
    const std::int64_t len = m.offsets[i + 1] - m.offsets[i];
    if (len != tokens[i])
      return fail(Errc::invalid_argument, seq + ": mask of " + std::to_string(len) + " entries, but the sequence holds " +
                                              std::to_string(tokens[i]) + " tokens in the layer (one entry per token)");
    const float* x = m.values.data() + m.offsets[i];
    bool any = false;
    for (std::int64_t t = 0; t < len; ++t) {
      if (std::isnan(x[t]) || x[t] == std::numeric_limits<float>::infinity())
        return fail(Errc::non_finite, seq + ": mask entry " + std::to_string(t) + " is " + std::to_string(x[t]) +
                                          " (entries must be finite, or -inf to drop the key)");
      any |= x[t] != -std::numeric_limits<float>::infinity();
    }
    if (!any)
      return fail(Errc::invalid_argument, seq + ": every one of its " + std::to_string(len) +
                                              " mask entries is -inf (the query would attend to nothing)");
  }
  return {};
}

/// Checks a batched decode's queries and masks and finds each sequence's layer: Ls[i] =
/// layer_of(seqs[i]) (a Result; its error gains "(sequence i of the batch)"), each query checked
/// as attend's (check_queries), the masks as check_masks (when given).
template <class Layer, class LayerOf>
[[nodiscard]] Status batch_layers(const ModelShape& shape, int layer, std::span<const SeqId> seqs, std::span<const float> q,
                                  std::span<float> out, const BatchMask* masks, LayerOf&& layer_of, std::vector<const Layer*>& Ls) {
  const std::size_t N = seqs.size(), qrow = static_cast<std::size_t>(shape.q_heads) * static_cast<std::size_t>(shape.head_dim);
  for (std::size_t i = 0; i < N; ++i) {
    auto L = layer_of(seqs[i]);
    if (!L) return fail(L.error().code, L.error().message + " (sequence " + std::to_string(i) + " of the batch)");
    Ls[i] = *L;
    if (Status c = check_queries(shape, layer, Ls[i]->chunk_tokens, q.subspan(i * qrow, qrow), out.subspan(i * qrow, qrow),
                                 static_cast<std::int64_t>(i));
        !c)
      return c;
  }
  if (!masks) return {};
  std::vector<std::int64_t> tokens(N);
  for (std::size_t i = 0; i < N; ++i) tokens[i] = Ls[i]->total;
  return check_masks(layer, *masks, tokens);
}

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
