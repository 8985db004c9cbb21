// kvpack-eval: the Evaluator, which runs the model on kvpack caches: how a policy's cache is made
// and sized, greedy generation of the default passage, and the hooks the planner attaches.
// Scoring a window (scoring.hpp) and a needle case (needle.hpp) are its other two members.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "llama/eval.hpp"
#include "llama/policies.hpp"
#include "llama/tokenizer.hpp"
#include "kv_dump.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace kvpack_eval {

/// Runs the model with one policy's cache at a time. Not thread-safe except needle(), which is
/// const and may run concurrently for different cases.
class Evaluator {
 public:
  Evaluator(const kl::Model& model, const kl::Tokenizer& tok, const Options& opt) : m_(model), tok_(tok), opt_(opt) {}

  /// Scores window `w` with the policy `Cache`; the baseline policy fills base_, the others are
  /// compared with it. The first window also times a token-by-token decode and records KV bytes.
  template <class Cache>
  kvpack::Status score(PolicyStats& st, const Window& w, bool baseline, bool first_window, Progress& prog,
                       KvDump* dump);

  /// Policies whose raw logits are kept per window (the twins of "+offload" policies).
  void set_twins(std::set<std::string> names) { twins_ = std::move(names); }

  /// Runs one needle case (prompt + answer) with `Cache`: log-probability of the answer tokens
  /// and whether greedy decoding reproduces them exactly (every answer token is the argmax).
  /// `context`: the case's declared length (--needle-lengths), see capacity().
  template <class Cache>
  kvpack::Result<NeedleResult> needle(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                                      int64_t context, Progress& prog, const std::string& label) const;

  /// Greedy generation with the fp32 cache: prompt prefilled in chunks, then one token at a time
  /// until `max_new` tokens or an end-of-sequence token.
  kvpack::Result<std::vector<int32_t>> generate(const std::vector<int32_t>& prompt, int max_new, Progress& prog) {
    using Cache = kl::cache_for<"fp32">;
    auto cache = Cache::create(m_.cache_shape(static_cast<int64_t>(prompt.size()) + max_new));
    if (!cache) return cache.error();
    std::vector<int32_t> seq = prompt;
    Eigen::Index next = 0;
    auto s = kl::run_chunked(
        m_, *cache, prompt, static_cast<int64_t>(prompt.size()) - 1, opt_.chunk,
        [&](int64_t, RowMat& lg) { lg.row(lg.rows() - 1).maxCoeff(&next); },
        [&, done = int64_t{0}](int64_t e) mutable {
          prog.advance(e - done);
          done = e;
        });
    if (!s) return s.error();
    RowMat lg;
    for (int i = 0; i < max_new; ++i) {
      const auto t = static_cast<int32_t>(next);
      if (t == tok_.eos() || t == im_end_) break;
      seq.push_back(t);
      if (auto e = m_.forward(*cache, std::span(&t, 1), static_cast<int32_t>(seq.size() - 1), 0, lg); !e) return e.error();
      lg.row(0).maxCoeff(&next);
      prog.advance(1);
    }
    return seq;
  }

  void set_im_end(int32_t id) { im_end_ = id; }

  /// How score<PlanCache> builds its cache (the plan), and what it does after each chunk
  /// (tokens done, window length): a re-plan mid-sequence.
  std::function<kvpack::Result<PlanCache>(const kvpack::ModelShape&)> plan_factory;
  std::function<kvpack::Status(PlanCache&, int64_t, int64_t)> plan_hook;
  /// Called by score<PlanCache> with each chunk's scored rows, log-softmaxed (the quality monitor).
  std::function<void(PlanCache&, const RowMat&)> row_hook;
  /// Sees the K/V every layer appends in score<PlanCache> (quantization-error sampling).
  kl::KvTap kv_tap;

  /// ModelShape::max_tokens for a `Cache` that will see `appended` tokens of a run whose context
  /// is `context` tokens (--ctx for WikiText windows, the needle length for a needle case). Caches
  /// that evict as they go (SinkWindow, H2O, BlockSparse; not SnapKV, which grows back after its
  /// one compression) get `context`: their Fraction<> budgets resolve against max_tokens, so
  /// "50 %" means half of the context, not of context + decode tokens; they never hold more than
  /// budget + one chunk. If that budget leaves no room for a chunk under `context` (e.g. a Tokens<N>
  /// budget above a short --ctx), or the cache cannot be created so, they get `appended`, as
  /// every other cache does.
  template <class Cache>
  [[nodiscard]] int64_t capacity(int64_t context, int64_t appended) const {
    if constexpr (requires { requires Cache::evicts_continuously; }) {
      if (auto c = Cache::create(m_.cache_shape(context)); c && c->eviction_budget() + opt_.chunk <= context)
        return context;
    }
    (void)context;
    return appended;
  }

  template <class Cache>
  kvpack::Result<Cache> make_cache(const kvpack::ModelShape& s, int64_t tokens = 0,
                                    kl::OffloadReport* report = nullptr) const {
    if constexpr (std::is_same_v<Cache, PlanCache>) {
      if (!plan_factory) return kvpack::fail(kvpack::Errc::invalid_argument, "no plan set");
      return plan_factory(s);
    } else {
      return kl::make_eval_cache<Cache>(s, tokens, opt_.offload, report);
    }
  }

 private:
  const kl::Model& m_;
  const kl::Tokenizer& tok_;
  const Options& opt_;
  Baseline base_;
  int32_t im_end_ = -1;
  std::set<std::string> twins_;
  std::map<std::string, RowMat> twin_logits_;  // [scored rows][vocab] raw logits, current window
};

}  // namespace kvpack_eval
