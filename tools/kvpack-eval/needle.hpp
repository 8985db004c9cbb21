// kvpack-eval's needle test: passkey prompts (llama/needle_prompt.hpp, shared with
// kvpack-snapkv-diag) run with every policy; greedy exact match and log p(answer) per case.
#pragma once

#include <string>
#include <vector>

#include <omp.h>

#include "llama/needle_prompt.hpp"
#include "evaluator.hpp"
#include "policy_dispatch.hpp"

namespace kvpack_eval {

/// One needle case: the prompt and answer of kl::make_passkey_prompt at a length and depth.
using NeedleCase = kl::PasskeyPrompt;

/// Every (--needle-lengths x --needle-depths) case up to `max_ctx` tokens that fits `filler`;
/// cases that do not fit are left out (the table shows the cases that ran).
[[nodiscard]] inline std::vector<NeedleCase> make_needles(const kl::Tokenizer& tok, const std::vector<int32_t>& filler,
                                                          const Options& opt, int64_t max_ctx) {
  std::vector<NeedleCase> out;
  for (int64_t len : opt.needle_lengths) {
    if (len > max_ctx) continue;
    for (int depth : opt.needle_depths)
      if (auto c = kl::make_passkey_prompt(tok, filler, len, depth)) out.push_back(std::move(*c));
  }
  return out;
}

template <class Cache>
kvpack::Result<NeedleResult> Evaluator::needle(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                                               int64_t context, Progress& prog, const std::string& label) const {
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), answer.begin(), answer.end() - 1);
  auto cache = Cache::create(m_.cache_shape(capacity<Cache>(context, static_cast<int64_t>(seq.size()))));
  if (!cache) return cache.error();
  NeedleResult r;
  r.exact = true;
  const auto first = static_cast<int64_t>(prompt.size()) - 1;
  // The prompt is prefilled in chunks and compressed at its end (SnapKV; a no-op for the other
  // policies); the answer is then fed one token at a time, as generation would.
  auto on_logits = [&](int64_t i0, RowMat& lg) {
    for (Eigen::Index k = 0; k < lg.rows(); ++k) {
      const auto a = static_cast<size_t>(i0 + k - first);
      auto lp = lg.row(k);
      kl::log_softmax(lp);
      Eigen::Index top = 0;
      lp.maxCoeff(&top);
      r.logp += lp[answer[a]];
      r.exact = r.exact && top == answer[a];
    }
  };
  int64_t done = 0;
  auto on_chunk = [&](int64_t e) {
    prog.advance(e - done, &label);
    done = e;
  };
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  auto s = kl::run_range(m_, *cache, seq, 0, n_prompt, first, opt_.chunk, on_logits, on_chunk);
  if (!s) return s.error();
  kl::compress_prompt_if_snapkv(*cache, m_.cfg.layers);
  s = kl::run_range(m_, *cache, seq, n_prompt, static_cast<int64_t>(seq.size()), first, 1, on_logits, on_chunk);
  if (!s) return s.error();
  return r;
}

/// Runs every needle case with every policy in `names` and appends the results to `stats` (same
/// order as `names`). Errors: the first failing run's, prefixed with its policy name.
inline kvpack::Status run_needles(const Evaluator& ev, const std::vector<NeedleCase>& needles,
                                  const std::vector<std::string>& names, std::vector<PolicyStats>& stats,
                                  Progress& prog) {
  // Needle cases are independent runs: one per thread (KVCache attention is single-threaded, so
  // two runs side by side keep both cores busy), each run's matrix work on its own thread.
  const auto jobs = static_cast<int64_t>(needles.size() * names.size());
  std::vector<NeedleResult> nres(static_cast<size_t>(jobs));
  std::vector<std::string> nerr(static_cast<size_t>(jobs));
  omp_set_max_active_levels(1);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t j = 0; j < jobs; ++j) {
    const NeedleCase& c = needles[size_t(j) / names.size()];
    const std::string& name = names[size_t(j) % names.size()];
    auto r = needle_policy(ev, name, c.prompt, c.answer, c.length, prog,
                           name + " needle " + std::to_string(c.length) + "@" + std::to_string(c.depth) + "%");
    if (!r) {
      nerr[size_t(j)] = name + ": " + r.error().message;
      continue;
    }
    nres[size_t(j)] = *r;
    nres[size_t(j)].length = c.length;
    nres[size_t(j)].depth = c.depth;
  }
  for (int64_t j = 0; j < jobs; ++j) {
    if (!nerr[size_t(j)].empty()) return kvpack::fail(kvpack::Errc::invalid_argument, nerr[size_t(j)]);
    stats[size_t(j) % names.size()].needle.push_back(nres[size_t(j)]);
  }
  return {};
}

}  // namespace kvpack_eval
