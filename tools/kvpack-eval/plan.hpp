// kvpack-eval --plan (issue 9): reads a --profile table, measures each candidate's bytes per
// layer at --ctx tokens, plans at the bytes of uniform --plan-budgets policies, and scores uniform
// vs planned; then a run whose budget (bytes of uniform --replan-from) halves at mid-window:
// re-plan, the layers migrate lazily, the run continues. --fallback adds the quality monitor.
#pragma once

#include <set>

#include "policy_dispatch.hpp"
#include "profile.hpp"

namespace kvpack_eval {


inline int run_plan(const kl::Model& model, Evaluator& ev, Options& opt, const std::vector<Window>& windows,
             const std::string& model_name, const std::string& source) {
  const auto t0 = Clock::now();
  for (const auto* list : {&opt.plan_budgets, &opt.plan_uniform})  // before any window is scored
    for (const auto& n : *list)
      if (auto s = require_compiled(n); !s) return die(s.error().message);
  opt.decode_tokens = 0;
  nlohmann::json pj;
  {
    std::ifstream f(opt.plan);
    if (!f) return die("cannot read --plan file '" + opt.plan + "'");
    try {
      f >> pj;
    } catch (const std::exception& e) {
      return die("--plan file '" + opt.plan + "': " + e.what());
    }
  }
  const int L = model.cfg.layers;
  if (pj.value("layers", 0) != L) return die("--plan: the table has another layer count than the model");
  // Planner table: fp32 (cost 0) plus the profiled candidates; bytes measured at --ctx.
  kvpack::plan::SensitivityTable t;
  t.model = pj.value("model", "");
  t.layers = L;
  std::vector<int> idx{0};
  for (const auto& n : pj["candidates"]) {
    const int i = candidate_index(n.get<std::string>());
    if (i < 0) return die("--plan: unknown candidate " + n.get<std::string>());
    idx.push_back(i);
  }
  for (int i : idx) t.candidates.emplace_back(kvpack::plan::standard_candidate_names[size_t(i)]);
  std::vector<uint64_t> layer_bytes;
  for (int i : idx) {
    auto b = layer_bytes_at(model, i, opt.ctx);
    if (!b) return die(b.error().message);
    layer_bytes.push_back(*b);
  }
  for (int l = 0; l < L; ++l)
    for (size_t c = 0; c < idx.size(); ++c) {
      t.cost.push_back(c == 0 ? 0.0 : pj["cost_table"][size_t(l)][c - 1].get<double>());
      t.bytes_per_token.push_back(double(layer_bytes[c]) / double(opt.ctx));
    }
  auto uniform_bytes = [&](const std::string& name) -> kvpack::Result<uint64_t> {
    const int i = candidate_index(name);
    if (i < 0) return kvpack::fail(kvpack::Errc::invalid_argument, "'" + name + "' is not a planner candidate");
    auto b = layer_bytes_at(model, i, opt.ctx);
    if (!b) return b.error();
    return *b * uint64_t(L);
  };
  auto to_std = [&](const kvpack::plan::Plan& p) {
    std::vector<int> c;
    for (int x : p.choice) c.push_back(idx[size_t(x)]);
    return c;
  };

  struct Run {
    std::string name, uniform;  // uniform: registry policy name, else planned
    std::vector<int> choice, after;  // planned choice (standard indices); after: re-plan at mid-window
    uint64_t budget = 0, budget_after = 0;
    double predicted = 0;
    std::string note;
    PolicyStats st;
    bool monitored = false;
  };
  std::vector<Run> runs;
  runs.push_back({"fp32", "fp32", {}, {}, 0, 0, 0, "reference", {}});
  std::ostringstream log;
  for (const auto& b : opt.plan_budgets) {
    auto ub = uniform_bytes(b);
    if (!ub) return die("--plan-budgets: " + ub.error().message);
    auto p = kvpack::plan::plan_layers(t, *ub, opt.ctx);
    if (!p) return die("plan at the bytes of uniform " + b + ": " + p.error().message);
    double upred = 0;
    const int ui = static_cast<int>(std::find(idx.begin(), idx.end(), candidate_index(b)) - idx.begin());
    if (ui < static_cast<int>(idx.size()))
      for (int l = 0; l < L; ++l) upred += t.cost_at(l, ui);
    runs.push_back({"uniform " + b, b, {}, {}, *ub, 0, upred, "", {}});
    runs.push_back({"planned @ " + b + " bytes", "", to_std(*p), {}, *ub, 0, p->cost,
                    "granularity " + std::to_string(p->granularity) + " B, " + (p->exact ? "exact" : "conservative"), {}});
  }
  // Extra uniform baselines (--plan-uniform), after the budgets so runs[2] stays the first plan.
  for (const auto& u : opt.plan_uniform) {
    if (!kl::has_policy(u)) return die("--plan-uniform: no policy '" + u + "' in kvpack-eval's registry");
    auto ub = uniform_bytes(u);
    if (!ub) return die("--plan-uniform: " + ub.error().message);
    double upred = 0;
    const int ui = static_cast<int>(std::find(idx.begin(), idx.end(), candidate_index(u)) - idx.begin());
    if (ui < static_cast<int>(idx.size()))
      for (int l = 0; l < L; ++l) upred += t.cost_at(l, ui);
    runs.push_back({"uniform " + u, u, {}, {}, *ub, 0, upred, "", {}});
  }
  // Budget halving mid-window (skipped with --replan-from none).
  if (opt.replan_from != "none") {
  auto b0 = uniform_bytes(opt.replan_from);
  if (!b0) return die("--replan-from: " + b0.error().message);
  auto p0 = kvpack::plan::plan_layers(t, *b0, opt.ctx);
  auto p1 = kvpack::plan::plan_layers(t, *b0 / 2, opt.ctx);
  if (!p0 || !p1) return die("re-plan budgets: " + (!p0 ? p0.error().message : p1.error().message));
  runs.push_back({"planned @ " + opt.replan_from + " bytes, halved at mid-window", "", to_std(*p0), to_std(*p1), *b0,
                  *b0 / 2, p1->cost, "", {}});
  runs.push_back({"planned @ half " + opt.replan_from + " bytes from the start", "", to_std(*p1), {}, *b0 / 2, 0, p1->cost,
                  "", {}});
  }

  // Quality fallback: thresholds from the fp32 run of the calibration slice, then the first
  // planned budget again with the monitor raising precision for new tokens on a spike.
  kvpack::plan::MonitorThresholds thr{};
  std::vector<double> cal_e, cal_n;
  auto signals = [L](PlanCache& c, const RowMat& lp, std::vector<double>& ent, std::vector<double>& nrm) {
    for (Eigen::Index r = 0; r < lp.rows(); ++r) {
      ent.push_back(kvpack::plan::entropy_of_logits(std::span<const float>(lp.row(r).data(), size_t(lp.cols()))));
      double s = 0;
      for (int l = 0; l < L; ++l) {
        const auto nl = c.last_attn_norms(l);
        const size_t off = nl.size() - size_t(lp.rows());
        s += nl[off + size_t(r)];
      }
      nrm.push_back(s / L);
    }
  };
  // One step up per candidate (standard index -> index): int4 -> k8v4 -> int8 -> fp16 -> fp32;
  // int8-g64, kivi8, k16v8, k8v16 -> fp16; kc4v8 -> int8.
  const std::vector<int> raise{0, 0, 1, 2, 2, 3, 3, 1, 1, 1, 1, 2};
  static_assert(kvpack::plan::standard_candidate_names.size() == 12, "extend `raise` with the candidate set");
  kvpack::plan::CacheMetrics fb_metrics;
  size_t fb_peak = 0;
  std::vector<kvpack::plan::SwitchEvent> fb_events;
  std::vector<int64_t> fb_tokens;
  std::vector<size_t> fb_windows;
  if (opt.fallback) {
    if (opt.calib.tokens.empty()) return die("--fallback: the text is shorter than --calib-ctx");
    if (runs.size() < 3) return die("--fallback needs a --plan-budgets entry");
    Progress cprog(opt.calib_ctx, opt.progress);
    PolicyStats cst;
    ev.plan_factory = [L](const kvpack::ModelShape& sh) { return PlanCache::create(sh, std::vector<int>(size_t(L), 0)); };
    ev.row_hook = [&](PlanCache& c, const RowMat& lp) { signals(c, lp, cal_e, cal_n); };
    if (auto s = ev.score<PlanCache>(cst, opt.calib, true, false, cprog, nullptr); !s) return die("calibration: " + s.error().message);
    ev.row_hook = nullptr;
    cprog.finish();
    auto t2 = kvpack::plan::calibrate(cal_e, cal_n, opt.fallback_k);
    if (!t2) return die("calibration: " + t2.error().message);
    thr = *t2;
    Run fb = runs[2];
    fb.name += " + fallback monitor";
    fb.monitored = true;
    fb.st = {};
    runs.push_back(fb);
  }

  Progress prog(int64_t(runs.size()) * opt.ctx * static_cast<int64_t>(windows.size()), opt.progress);
  for (size_t w = 0; w < windows.size(); ++w)
    for (size_t r = 0; r < runs.size(); ++r) {
      Run& run = runs[r];
      prog.label(run.name);
      kvpack::Status s;
      if (!run.uniform.empty()) {
        s = score_policy(ev, run.uniform, run.st, windows[w], r == 0, w == 0, prog, nullptr);
      } else {
        ev.plan_factory = [&run](const kvpack::ModelShape& sh) { return PlanCache::create(sh, run.choice); };
        ev.plan_hook = nullptr;
        ev.row_hook = nullptr;
        std::optional<kvpack::plan::QualityMonitor> mon;
        kvpack::plan::QuantErrorSampler sampler(61);
        std::vector<int64_t> appended(size_t(L), 0);
        if (run.monitored) {
          if (opt.fallback_norm == "running")  // attention norm against a running baseline (follows its drift)
            mon.emplace(thr, kvpack::plan::NormBaseline{1.0 / 32, opt.fallback_k, 0.01, 16}, opt.fallback_calm);
          else
            mon.emplace(thr, opt.fallback_calm);
          ev.kv_tap = [&](int layer, std::span<const float>, std::span<const float> k, std::span<const float> v) {
            sampler.record(layer, appended[size_t(layer)], model.cfg.kv_heads, model.cfg.head_dim, k, v);
            appended[size_t(layer)] += int64_t(k.size()) / (int64_t(model.cfg.kv_heads) * model.cfg.head_dim);
          };
          ev.row_hook = [&](PlanCache& c, const RowMat& lp) {
            std::vector<double> e, nv;
            signals(c, lp, e, nv);
            for (size_t r = 0; r < e.size(); ++r)
              if (auto evn = mon->observe(e[r], nv[r])) {
                fb_events.push_back(*evn);
                fb_tokens.push_back(c.tokens(0) - int64_t(e.size()) + int64_t(r));
                fb_windows.push_back(w);
                if (opt.fallback_mode == "segments")  // new tokens only, fp32 recent window during the fallback
                  (void)c.switch_new_tokens(evn->fallback ? kvpack::plan::raised_plan(run.choice, raise) : run.choice, *evn,
                                            opt.fallback_window);
                else  // re-plan: every stored token migrates
                  (void)c.replan(evn->fallback ? kvpack::plan::raised_plan(run.choice, raise) : run.choice);
              }
            fb_peak = std::max(fb_peak, c.memory_bytes());
            kvpack::plan::collect(c, fb_metrics);
            fb_metrics.fallbacks = uint64_t(std::count_if(fb_events.begin(), fb_events.end(),
                                                          [](const auto& x) { return x.fallback; }));
            if (c.tokens(0) == static_cast<int64_t>(windows[w].tokens.size()))  // last chunk: sample the error
              if (auto q = sampler.measure(c, L, model.cfg.kv_heads, model.cfg.head_dim)) {
                fb_metrics.quant_error_rel_rms = q->first;
                fb_metrics.quant_error_samples = q->second;
              }
          };
        }
        if (!run.after.empty())
          ev.plan_hook = [&run, &log, w, replanned = false](PlanCache& c, int64_t done, int64_t n) mutable -> kvpack::Status {
            if (replanned || done < n / 2) return {};
            replanned = true;
            const size_t held = c.memory_bytes();
            if (auto st = c.replan(run.after); !st) return st;
            log << "window " << w << ": budget " << run.budget << " -> " << run.budget_after << " B after " << done
                << " tokens (held " << held << " B): re-plan " << plan_summary(run.choice) << " -> "
                << plan_summary(run.after) << "\n";
            return {};
          };
        s = ev.score<PlanCache>(run.st, windows[w], false, w == 0, prog, nullptr);
        ev.plan_hook = nullptr;
        ev.row_hook = nullptr;
        ev.kv_tap = nullptr;
      }
      if (!s) return die(run.name + ": " + s.error().message);
    }
  prog.finish();

  const PolicyStats& base = runs[0].st;
  std::ostringstream md;
  md << "### kvpack-eval --plan: " << model_name << ", " << source << ", ctx " << opt.ctx << " x " << windows.size()
     << " window(s) from window " << opt.first_window << " (held out from the profile), chunk " << opt.chunk << ", "
     << base.scored << " scored tokens; profile " << std::filesystem::path(opt.plan).filename().string()
     << " (ctx " << pj.value("ctx", 0) << ")\n\n";
  md << "| run | configuration | budget MiB | KV MiB held @ " << opt.ctx
     << " | bits/value | predicted Σ KL | PPL | ΔPPL % | KL mean | KL p99 | top-1 agree % |\n";
  md << "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n";
  nlohmann::json j;
  j["model"] = model_name;
  j["source"] = source;
  j["ctx"] = opt.ctx;
  j["first_window"] = opt.first_window;
  j["windows"] = windows.size();
  j["chunk"] = opt.chunk;
  j["profile"] = opt.plan;
  for (const auto& r : runs) {
    const auto& s = r.st;
    const std::string conf = !r.uniform.empty() ? r.uniform + " x" + std::to_string(L)
                             : r.after.empty()  ? plan_summary(r.choice)
                                                : plan_summary(r.choice) + " → " + plan_summary(r.after);
    const uint64_t budget = r.budget_after ? r.budget_after : r.budget;
    md << "| " << r.name << " | " << conf << " | " << (budget ? fmt("%.3f", double(budget) / (1 << 20)) : "-") << " | "
       << fmt("%.3f", double(s.kv_bytes) / (1 << 20)) << " | " << fmt("%.2f", s.bits_per_value()) << " | "
       << (r.name == "fp32" ? "0" : fmt("%.4f", r.predicted)) << " | " << fmt("%.4f", s.ppl()) << " | "
       << fmt("%+.3f", 100 * (s.ppl() / base.ppl() - 1)) << " | " << fmt("%.5f", s.kl_mean()) << " | "
       << fmt("%.4f", s.kl_p99()) << " | " << fmt("%.2f", 100.0 * double(s.agree) / double(std::max<int64_t>(s.scored, 1)))
       << " |\n";
    nlohmann::json jr = {{"name", r.name},
                         {"budget_bytes", r.budget},
                         {"budget_after_bytes", r.budget_after},
                         {"kv_bytes", s.kv_bytes},
                         {"within_budget", budget == 0 || s.kv_bytes <= budget},
                         {"predicted_cost", r.predicted},
                         {"ppl", s.ppl()},
                         {"delta_ppl_percent", 100 * (s.ppl() / base.ppl() - 1)},
                         {"kl_mean", s.kl_mean()},
                         {"kl_p99", s.kl_p99()},
                         {"top1_agreement", double(s.agree) / double(std::max<int64_t>(s.scored, 1))}};
    std::vector<std::string> ch, af;
    for (int c : r.choice) ch.emplace_back(kvpack::plan::standard_candidate_names[size_t(c)]);
    for (int c : r.after) af.emplace_back(kvpack::plan::standard_candidate_names[size_t(c)]);
    if (!ch.empty()) jr["plan"] = ch;
    if (!af.empty()) jr["plan_after"] = af;
    j["runs"].push_back(jr);
  }
  md << "\nPer-layer plans (layer 0 first):\n\n";
  for (const auto& r : runs) {
    if (r.choice.empty()) continue;
    md << "- " << r.name << ":";
    for (int c : r.choice) md << " " << kvpack::plan::standard_candidate_names[size_t(c)];
    if (!r.after.empty()) {
      md << "\n  after halving:";
      for (int c : r.after) md << " " << kvpack::plan::standard_candidate_names[size_t(c)];
    }
    if (!r.note.empty()) md << " (" << r.note << ")";
    md << "\n";
  }
 if (opt.fallback) {
    md << "\nQuality monitor: thresholds from the fp32 run of the first " << opt.calib_ctx << " tokens of the text ("
       << cal_e.size() << " rows): entropy > " << fmt("%.3f", thr.entropy) << " nats or mean attention-output norm > "
       << (opt.fallback_norm == "running" ? std::string("its running baseline (EMA 1/32 per token) + ")
                                          : fmt("%.3f", thr.attn_norm) + " (mean + ")
       << fmt("%.1f", opt.fallback_k) << " std" << (opt.fallback_norm == "running" ? "" : ")") << "; back after "
       << opt.fallback_calm << " quiet tokens. On a spike the plan moves one step up in precision per layer "
       << "(int4 -> k8v4 -> int8 -> fp16). Peak KV bytes of the monitored run " << fb_peak << " B. "
       << fb_events.size() << " switches:\n\n```\n";
    for (size_t i = 0; i < fb_events.size(); ++i)
      md << "window " << fb_windows[i] << " token " << fb_tokens[i] << ": " << kvpack::plan::trigger_name(fb_events[i].trigger)
         << " value " << fmt("%.3f", fb_events[i].value) << " threshold " << fmt("%.3f", fb_events[i].threshold) << " -> "
         << (fb_events[i].fallback ? "fallback on" : "fallback off") << "\n";
    md << "```\n\nMetrics of the monitored run after its last chunk (Prometheus text exposition):\n\n```\n"
       << kvpack::plan::to_prometheus(fb_metrics, "kvpack", {{"run", "fallback"}}) << "```\n";
    j["fallback_switches"] = fb_events.size();
    j["fallback_peak_bytes"] = fb_peak;
  }
  md << "\nRe-plan log:\n\n```\n" << log.str() << "```\n\nwall time " << Progress::fmt_time(seconds_since(t0)) << "\n";
  j["replan_log"] = log.str();
  std::cout << md.str() << std::flush;
  if (!opt.markdown.empty() && !(std::ofstream(opt.markdown) << md.str()))
    return die("cannot write --markdown file '" + opt.markdown + "'");
  if (!opt.json.empty() && !(std::ofstream(opt.json) << j.dump(2) << "\n"))
    return die("cannot write --json file '" + opt.json + "'");
  return 0;
}

}  // namespace kvpack_eval
