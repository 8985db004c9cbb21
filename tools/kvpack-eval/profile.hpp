// kvpack-eval --profile (issue 9): the sensitivity table the per-layer planner reads. For every
// layer l and candidate c, the window runs with layer l on candidate c and every other layer on the
// fp32 cache; cost = mean KL(fp32 cache || that run) over the scored tokens. Written as JSON
// (layers x candidates), with bytes per token.
#pragma once

#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kvpack/plan/candidates.hpp>
#include <kvpack/plan/metrics.hpp>
#include <kvpack/plan/monitor.hpp>
#include <kvpack/plan/planner.hpp>

#include "scoring.hpp"

namespace kvpack_eval {

/// Bytes `candidate` of the standard set holds for one layer of `model` after `tokens` tokens
/// (memory_bytes of a one-layer cache; data-independent without eviction).
[[nodiscard]] inline kvpack::Result<uint64_t> layer_bytes_at(const kl::Model& model, int candidate, int64_t tokens) {
  kvpack::ModelShape one = model.cache_shape(tokens);
  one.layers = 1;
  auto c = PlanCache::make(candidate, one);
  if (!c) return c.error();
  const size_t row = size_t(model.cfg.kv_heads) * size_t(model.cfg.head_dim);
  std::vector<float> z(size_t(tokens) * row, 0.5f);
  std::vector<int32_t> pos(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) pos[size_t(t)] = static_cast<int32_t>(t);
  return std::visit(
      [&](auto& cache) -> kvpack::Result<uint64_t> {
        if (auto s = cache.append(0, z, z, pos); !s) return s.error();
        return static_cast<uint64_t>(cache.memory_bytes());
      },
      *c);
}

/// Index of `name` in the standard candidate set, or -1.
[[nodiscard]] inline int candidate_index(const std::string& name) {
  const auto& names = kvpack::plan::standard_candidate_names;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return -1;
}

inline int run_profile(const kl::Model& model, Evaluator& ev, Options& opt, const std::vector<Window>& windows,
                const std::string& model_name, const std::string& source) {
  const auto t0 = Clock::now();
  opt.decode_tokens = 0;
  const int L = model.cfg.layers;
  // --profile-merge: keep the columns of the existing --profile file, profile only the candidates
  // it lacks (same text slice, ctx, windows and chunk, checked), and write the merged table back.
  nlohmann::json old;
  std::vector<std::string> old_names;
  if (opt.profile_merge) {
    std::ifstream f(opt.profile);
    if (!f) return die("--profile-merge: cannot read '" + opt.profile + "'");
    try {
      f >> old;
    } catch (const std::exception& e) {
      return die("--profile-merge: '" + opt.profile + "': " + e.what());
    }
    if (old.value("layers", 0) != L || old.value("ctx", int64_t{0}) != opt.ctx ||
        old.value("first_window", -1) != opt.first_window || old.value("windows", size_t{0}) != windows.size() ||
        old.value("chunk", 0) != opt.chunk || old.value("text", std::string()) != opt.text)
      return die("--profile-merge: the existing table was measured with another text, ctx, window, chunk or model");
    for (const auto& n : old["candidates"]) old_names.push_back(n.get<std::string>());
  }
  std::vector<int> cand;
  for (const auto& n : opt.profile_candidates) {
    const int i = candidate_index(n);
    if (i < 0) return die("--profile-candidates: '" + n + "' is not in the planner's candidate set");
    if (std::find(old_names.begin(), old_names.end(), n) != old_names.end()) continue;  // already in the table
    if (i > 0) cand.push_back(i);  // fp32 is the reference: cost 0 by definition
  }
  if (cand.empty()) return die("--profile: no candidate to profile (all already in the table?)");
  const int C = static_cast<int>(cand.size());
  Progress prog((1 + int64_t(L) * C) * opt.ctx * static_cast<int64_t>(windows.size()), opt.progress);
  PolicyStats base;
  base.name = "fp32";
  std::vector<PolicyStats> st(size_t(L) * size_t(C));
  for (size_t w = 0; w < windows.size(); ++w) {
    prog.label("fp32 (reference)");
    if (auto s = ev.score<kl::cache_for<"fp32">>(base, windows[w], true, false, prog, nullptr); !s)
      return die("fp32: " + s.error().message);
    for (int l = 0; l < L; ++l)
      for (int c = 0; c < C; ++c) {
        std::vector<int> choice(size_t(L), 0);
        choice[size_t(l)] = cand[size_t(c)];
        ev.plan_factory = [choice](const kvpack::ModelShape& s) { return PlanCache::create(s, choice); };
        const std::string name = std::string(kvpack::plan::standard_candidate_names[size_t(cand[size_t(c)])]);
        prog.label("layer " + std::to_string(l) + " " + name);
        auto& ps = st[size_t(l) * size_t(C) + size_t(c)];
        if (auto s = ev.score<PlanCache>(ps, windows[w], false, false, prog, nullptr); !s)
          return die("layer " + std::to_string(l) + " " + name + ": " + s.error().message);
      }
  }
  prog.finish();
  if (opt.profile_merge && std::abs(old.value("baseline_ppl", 0.0) - base.ppl()) > 1e-6 * base.ppl())
    return die("--profile-merge: the fp32 reference perplexity differs from the table's (" + fmt("%.6f", base.ppl()) +
               " vs " + fmt("%.6f", old.value("baseline_ppl", 0.0)) + ")");
  nlohmann::json j;
  j["model"] = model_name;
  j["source"] = source;
  j["text"] = opt.text;
  j["ctx"] = opt.ctx;
  j["first_window"] = opt.first_window;
  j["windows"] = windows.size();
  j["chunk"] = opt.chunk;
  j["scored_tokens"] = base.scored;
  j["layers"] = L;
  j["baseline_ppl"] = base.ppl();
  j["cost"] = "mean KL(fp32 cache || only this layer on this candidate), nats per scored token";
  j["bytes_per_token_note"] = "memory_bytes() of one layer after ctx tokens, / ctx (all KV heads)";
  std::vector<std::string> names = old_names;
  std::vector<double> bpt;
  for (int c : cand) {
    names.emplace_back(kvpack::plan::standard_candidate_names[size_t(c)]);
    auto b = layer_bytes_at(model, c, opt.ctx);
    if (!b) return die(b.error().message);
    bpt.push_back(double(*b) / double(opt.ctx));
  }
  j["candidates"] = names;
  const size_t N = names.size();
  std::ostringstream md;
  md << "### kvpack-eval --profile: " << model_name << ", " << source << ", ctx " << opt.ctx << " x " << windows.size()
     << " window(s) from window " << opt.first_window << ", chunk " << opt.chunk << ", " << base.scored
     << " scored tokens\n\nmean KL (nats/token) vs the fp32 cache when only that layer is compressed";
  if (opt.profile_merge) md << " (" << old_names.size() << " columns from the earlier table, " << C << " profiled now)";
  md << "\n\n| layer |";
  for (const auto& n : names) md << " " << n << " |";
  md << "\n|--:|";
  for (size_t c = 0; c < N; ++c) md << "--:|";
  md << "\n";
  std::vector<double> last_b;
  for (int l = 0; l < L; ++l) {
    std::vector<double> cost, dnll, top1, b;
    if (opt.profile_merge) {
      cost = old["cost_table"][size_t(l)].get<std::vector<double>>();
      dnll = old["delta_nll"][size_t(l)].get<std::vector<double>>();
      top1 = old["top1_agreement"][size_t(l)].get<std::vector<double>>();
      b = old["bytes_per_token"][size_t(l)].get<std::vector<double>>();
    }
    for (int c = 0; c < C; ++c) {
      const auto& ps = st[size_t(l) * size_t(C) + size_t(c)];
      cost.push_back(ps.kl_mean());
      dnll.push_back((ps.nll - base.nll) / double(std::max<int64_t>(ps.scored, 1)));
      top1.push_back(double(ps.agree) / double(std::max<int64_t>(ps.scored, 1)));
      b.push_back(bpt[size_t(c)]);
    }
    md << "| " << l << " |";
    for (double x : cost) md << " " << fmt("%.2e", x) << " |";
    md << "\n";
    j["cost_table"].push_back(cost);
    j["delta_nll"].push_back(dnll);
    j["top1_agreement"].push_back(top1);
    j["bytes_per_token"].push_back(b);
    last_b = b;
  }
  md << "\nbytes per token per layer at ctx " << opt.ctx << ":";
  for (size_t c = 0; c < N; ++c) md << " " << names[c] << " " << fmt("%.1f", last_b[c]);
  md << "\n\nwall time " << Progress::fmt_time(seconds_since(t0)) << "\n";
  j["seconds"] = seconds_since(t0) + (opt.profile_merge ? old.value("seconds", 0.0) : 0.0);
  std::cout << md.str() << std::flush;
  if (!opt.markdown.empty() && !(std::ofstream(opt.markdown) << md.str()))
    return die("cannot write --markdown file '" + opt.markdown + "'");
  if (!(std::ofstream(opt.profile) << j.dump(1) << "\n")) return die("cannot write --profile file '" + opt.profile + "'");
  return 0;
}

/// Short description of a plan: count per candidate, e.g. "int8 x4, int4-g64 x26".
[[nodiscard]] inline std::string plan_summary(const std::vector<int>& choice) {
  std::map<int, int> count;
  for (int c : choice) ++count[c];
  std::string s;
  for (auto [c, k] : count)
    s += (s.empty() ? "" : ", ") + std::string(kvpack::plan::standard_candidate_names[size_t(c)]) + " x" + std::to_string(k);
  return s;
}

}  // namespace kvpack_eval
