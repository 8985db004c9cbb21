// Scoring helpers shared by kvpack-eval and the real-model tests: chunked runs of a token sequence
// through a model and a KV cache, log-softmax, and llama-perplexity-style windowed perplexity.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include <kvpack/result.hpp>

#include "model.hpp"

namespace kvpack::llama {

/// Log-softmax of one row of logits, in place (max-subtracted, sum in double).
inline void log_softmax(Eigen::Ref<Eigen::RowVectorXf> row) {
  const float mx = row.maxCoeff();
  double s = 0;
  for (Eigen::Index i = 0; i < row.size(); ++i) s += std::exp(double(row[i] - mx));
  row.array() -= mx + static_cast<float>(std::log(s));
}

/// Runs tokens[begin..end) at positions begin..end-1 through `model` and `cache` in chunks of
/// `chunk` tokens (the cache must already hold tokens[0..begin)); on_logits/on_chunk as run_chunked.
template <class Cache, class OnLogits, class OnChunk>
Status run_range(const Model& model, Cache& cache, std::span<const int32_t> tokens, int64_t begin, int64_t end,
                 int64_t first_row, int chunk, OnLogits&& on_logits, OnChunk&& on_chunk, const KvTap& tap = {}) {
  RowMat logits;
  for (int64_t s = begin; s < end; s += chunk) {
    const int64_t e = std::min(end, s + chunk);
    const int64_t from = std::clamp<int64_t>(first_row - s, 0, e - s);
    if (auto st = model.forward(cache, tokens.subspan(size_t(s), size_t(e - s)), static_cast<int32_t>(s), from, logits, tap);
        !st)
      return st;
    if (logits.rows() > 0) on_logits(s + from, logits);
    on_chunk(e);
  }
  return {};
}

/// Runs tokens[0..n) at positions 0..n-1 through `model` and `cache` in chunks of `chunk` tokens
/// (each chunk attends to all earlier chunks through the cache, to itself exactly). For every
/// chunk holding token indices >= first_row, calls on_logits(i0, logits) where logits row r is
/// the raw next-token logits after token i0 + r. on_chunk(tokens_done) follows every chunk.
/// The cache is expected empty (positions restart at 0). Errors: those of Model::forward.
template <class Cache, class OnLogits, class OnChunk>
Status run_chunked(const Model& model, Cache& cache, std::span<const int32_t> tokens, int64_t first_row, int chunk,
                   OnLogits&& on_logits, OnChunk&& on_chunk, const KvTap& tap = {}) {
  return run_range(model, cache, tokens, 0, static_cast<int64_t>(tokens.size()), first_row, chunk, on_logits, on_chunk, tap);
}

/// Compresses a SnapKV cache's prompt on every layer (KVCache::compress_prompt); a no-op for
/// caches without compress_prompt and for layers already compressed or without queries.
template <class Cache>
void compress_prompt_if_snapkv(Cache& cache, int layers) {
  if constexpr (requires { cache.compress_prompt(0); })
    for (int l = 0; l < layers; ++l) (void)cache.compress_prompt(l);
  else
    (void)cache, (void)layers;
}

/// Prefill-then-score protocol shared by every policy: tokens [0, split) run as the context
/// (chunked), then compress_prompt_if_snapkv, then tokens [split, n) chunked; on_logits/on_chunk
/// as run_chunked (first_row >= split selects the scored rows). SnapKV compresses exactly once, at
/// the end of the context's prefill, as in the paper; other policies see the same chunk
/// boundaries as one run_chunked over [0, n) when split is a multiple of `chunk`.
template <class Cache, class OnLogits, class OnChunk>
Status run_prefill_then_score(const Model& model, Cache& cache, std::span<const int32_t> tokens, int64_t split,
                              int64_t first_row, int chunk, OnLogits&& on_logits, OnChunk&& on_chunk,
                              const KvTap& tap = {}) {
  if (auto st = run_range(model, cache, tokens, 0, split, first_row, chunk, on_logits, on_chunk, tap); !st) return st;
  compress_prompt_if_snapkv(cache, model.cfg.layers);
  return run_range(model, cache, tokens, split, static_cast<int64_t>(tokens.size()), first_row, chunk, on_logits,
                   on_chunk, tap);
}

/// Perplexity result: exp(mean negative log-likelihood) over `scored` tokens.
struct Perplexity {
  double ppl = 0, mean_nll = 0;
  int64_t scored = 0;
};

/// llama-perplexity protocol: `windows` non-overlapping windows of `ctx` tokens from the start
/// of `tokens`, each run through a fresh `cache` in chunks of `chunk`, scored on its second half
/// (logits after token ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1). The first half is the
/// context: prefilled, then compressed by SnapKV caches (run_prefill_then_score).
/// Errors: too few tokens (Errc::invalid_argument), or those of the forward pass.
template <class Cache>
Result<Perplexity> perplexity(const Model& model, Cache& cache, std::span<const int32_t> tokens, int64_t ctx,
                              int windows, int chunk) {
  if (ctx < 4 || windows < 1 || chunk < 1 || static_cast<int64_t>(tokens.size()) < ctx * windows)
    return fail(Errc::invalid_argument, "perplexity: need ctx >= 4, windows >= 1, chunk >= 1 and ctx * windows tokens");
  double nll = 0;
  int64_t scored = 0;
  for (int w = 0; w < windows; ++w) {
    cache.reset();
    auto win = tokens.subspan(size_t(w * ctx), size_t(ctx));
    auto st = run_prefill_then_score(
        model, cache, win, ctx / 2, ctx / 2, chunk,
        [&](int64_t i0, RowMat& lg) {
          for (Eigen::Index r = 0; r < lg.rows() && i0 + r + 1 < ctx; ++r) {
            log_softmax(lg.row(r));
            nll -= lg(r, win[size_t(i0 + r + 1)]);
            ++scored;
          }
        },
        [](int64_t) {});
    if (!st) return st.error();
  }
  Perplexity p;
  p.scored = scored;
  p.mean_nll = nll / double(scored);
  p.ppl = std::exp(p.mean_nll);
  return p;
}

}  // namespace kvpack::llama
