// The pieces of examples/engine/engine.cpp that are not the scheduler: the runner's cache
// adapters over a page pool (one sequence; a decode batch of many), token choice (greedy and
// seeded top-k sampling), the solo twin of a request, and the checks the engine reports
// (rollback identity, a sequence's contents).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include <kvpack/registry/registry.hpp>

#include "llama/model.hpp"

namespace engine {

namespace kl = kvpack::llama;
using kvpack::SeqId;
using kvpack::Status;
using kvpack::registry::AnyCache;
using kvpack::registry::AnyPool;

/// One sequence of a pool as the runner's cache: prefill chunks and single-sequence decode go
/// through PagedCache::append / attend with the caller's workspace.
struct SeqCache {
  AnyPool& pool;
  SeqId id;
  kvpack::Workspace& ws;
  Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const int32_t> pos) {
    return pool.append(id, layer, k, v, pos);
  }
  Status attend(int layer, std::span<const float> q, std::span<float> out) { return pool.attend(id, layer, q, out, ws); }
};

/// A decode batch as the runner's cache: row i of the runner's matrices is the next token of
/// seqs[i]. Its K/V row goes to seqs[i]; the N queries are attended in ONE attend_batch call,
/// spread over the executor (one workspace per worker). An append that fails part-way leaves the
/// earlier sequences one token ahead: the engine stops on any error.
struct BatchCache {
  AnyPool& pool;
  std::span<const SeqId> seqs;
  const kvpack::Executor& exec;
  std::span<kvpack::Workspace> workspaces;
  Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const int32_t> pos) {
    const std::size_t n = seqs.size(), row = k.size() / n;
    for (std::size_t i = 0; i < n; ++i)
      if (Status s = pool.append(seqs[i], layer, k.subspan(i * row, row), v.subspan(i * row, row), pos.subspan(i, 1)); !s)
        return s;
    return {};
  }
  Status attend(int layer, std::span<const float> q, std::span<float> out) {
    return pool.attend_batch(layer, seqs, q, out, exec, workspaces);
  }
};

/// Picks the next token from one row of logits [vocab]: greedy (rng == nullptr: the highest
/// logit, the lowest id on ties) or top-k sampling at `temperature` with a 53-bit uniform draw
/// from `rng` (std::mt19937_64, whose sequence the standard fixes, so a seeded run repeats on
/// every platform).
inline int32_t pick_token(std::span<const float> logits, std::mt19937_64* rng, double temperature = 0.8, int top_k = 40) {
  const int vocab = static_cast<int>(logits.size());
  if (!rng) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> ids(static_cast<std::size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int k = std::min(top_k, vocab);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[std::size_t(a)] != logits[std::size_t(b)] ? logits[std::size_t(a)] > logits[std::size_t(b)] : a < b;
  });
  std::vector<double> p(static_cast<std::size_t>(k));
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    const auto ii = std::size_t(i);
    p[ii] = std::exp((double(logits[std::size_t(ids[ii])]) - double(logits[std::size_t(ids[0])])) / temperature);
    sum += p[ii];
  }
  const double u = double((*rng)() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[std::size_t(i)];
    if (u < acc) return ids[std::size_t(i)];
  }
  return ids[std::size_t(k - 1)];
}

/// What a request asks for, enough to replay it alone.
struct RequestSpec {
  std::vector<int32_t> prompt;  ///< the request's own tokens after the shared prefix
  int max_new = 0;              ///< tokens to generate
  bool sample = false;          ///< seeded top-k sampling instead of greedy
  std::uint64_t seed = 0;       ///< the sampler's seed (sample only)
  /// Speculative only: the tokens each verify step kept (accepted drafts + the first), in order.
  /// The solo run feeds the engine's tokens in these chunks and predicts every next token.
  std::vector<int> chunks;
};

/// The "solo" twin of a request: a fresh single-sequence KVCache of the pool's policy
/// (AnyPool::make_single), the shared prefix prefilled in one chunk and the prompt in another
/// (the engine's chunking), then plain decoding one token at a time: greedy, or sampling with the
/// same seed. A speculative request is replayed as greedy decoding over the chunks its verify
/// steps kept (r.chunks), feeding `engine_out`'s tokens and predicting each next one, so it sees
/// exactly the tokens the engine kept and none it rolled back. Returns the generated (predicted)
/// tokens, at least r.max_new; errors of the cache or the model.
inline kvpack::Result<std::vector<int32_t>> run_solo(const kl::Model& model, const AnyPool& pool,
                                                     const kvpack::ModelShape& shape, std::span<const int32_t> prefix,
                                                     const RequestSpec& r, std::span<const int32_t> engine_out) {
  auto solo = pool.make_single(shape);
  if (!solo) return solo.error();
  AnyCache& cache = **solo;
  kl::RowMat logits;
  const auto P = static_cast<int32_t>(prefix.size());
  if (Status s = model.forward(cache, prefix, 0, static_cast<int64_t>(prefix.size()), logits); !s) return s.error();
  if (Status s = model.forward(cache, r.prompt, P, static_cast<int64_t>(r.prompt.size()) - 1, logits); !s) return s.error();
  std::mt19937_64 rng(r.seed);
  std::vector<int32_t> out;
  int32_t pos = P + static_cast<int32_t>(r.prompt.size());
  if (!r.chunks.empty()) {
    out.push_back(pick_token({logits.data(), std::size_t(logits.cols())}, nullptr));
    std::size_t fed = 0;
    for (const int c : r.chunks) {
      if (fed + std::size_t(c) > engine_out.size()) break;
      if (Status s = model.forward(cache, engine_out.subspan(fed, std::size_t(c)), pos, 0, logits); !s) return s.error();
      for (Eigen::Index i = 0; i < logits.rows(); ++i)
        out.push_back(pick_token({logits.row(i).data(), std::size_t(logits.cols())}, nullptr));
      fed += std::size_t(c), pos += c;
    }
    return out;
  }
  for (;;) {
    out.push_back(pick_token({logits.data(), std::size_t(logits.cols())}, r.sample ? &rng : nullptr));
    if (static_cast<int>(out.size()) >= r.max_new) break;
    if (Status s = model.forward(cache, std::span<const int32_t>(&out.back(), 1), pos++, 0, logits); !s) return s.error();
  }
  return out;
}

/// A copy of what a sequence holds: for every layer and KV head the decoded rows, positions and
/// arrival indices (read_back), and each page's token count and bytes. Two sequences (or one
/// sequence at two times) hold the same contents when their snapshots are equal.
struct Snapshot {
  std::vector<std::vector<float>> rows;
  std::vector<std::vector<int64_t>> where;  // positions and indices
  std::vector<std::vector<std::byte>> pages;
  bool operator==(const Snapshot&) const = default;
};

inline kvpack::Result<Snapshot> snapshot(const AnyPool& pool, SeqId seq) {
  const kvpack::ModelShape& s = pool.shape();
  const std::size_t payload = pool.block_layout().bytes;
  Snapshot out;
  for (int l = 0; l < s.layers; ++l)
    for (int h = 0; h < s.kv_heads; ++h) {
      auto r = pool.read_back(seq, l, h);
      if (!r) return r.error();
      out.rows.push_back(std::move(r->k));
      out.rows.push_back(std::move(r->v));
      out.where.emplace_back(r->positions.begin(), r->positions.end());
      out.where.push_back(std::move(r->indices));
      auto pg = pool.pages(seq, l, h);
      if (!pg) return pg.error();
      for (const kvpack::PageView& p : *pg) {
        std::vector<std::byte> bytes(p.data, p.data + payload);
        bytes.push_back(static_cast<std::byte>(p.header.count & 0xFFu));  // tokens in the page
        bytes.push_back(static_cast<std::byte>(p.header.count >> 8));
        out.pages.push_back(std::move(bytes));
      }
    }
  return out;
}

/// K/V rows of one forward chunk, captured per layer through the runner's KvTap:
/// k[l], v[l] are [n][kv_heads * head_dim] (keys after RoPE, as appended).
struct ChunkKv {
  std::vector<std::vector<float>> k, v;
  kl::KvTap tap() {
    return [this](int layer, std::span<const float>, std::span<const float> kr, std::span<const float> vr) {
      if (k.size() <= std::size_t(layer)) k.resize(std::size_t(layer) + 1), v.resize(std::size_t(layer) + 1);
      k[std::size_t(layer)].assign(kr.begin(), kr.end());
      v[std::size_t(layer)].assign(vr.begin(), vr.end());
    };
  }
};

/// Appends rows [0, rows) of a captured chunk to `seq` at positions pos0, pos0 + 1, ... in every
/// layer: the state of a sequence that received only those tokens of the chunk.
inline Status append_rows(AnyPool& pool, SeqId seq, const ChunkKv& kv, int rows, int32_t pos0) {
  const std::size_t row = std::size_t(pool.shape().kv_heads) * std::size_t(pool.shape().head_dim);
  std::vector<int32_t> pos(static_cast<std::size_t>(rows));
  std::iota(pos.begin(), pos.end(), pos0);
  for (std::size_t l = 0; l < kv.k.size(); ++l)
    if (Status s = pool.append(seq, int(l), std::span<const float>(kv.k[l]).first(row * std::size_t(rows)),
                               std::span<const float>(kv.v[l]).first(row * std::size_t(rows)), pos);
        !s)
      return s;
  return {};
}

}  // namespace engine
