// kvpack-eval's reports: the Markdown tables (quality/bytes/speed, needle, offload), the JSON of
// every figure, and the quality-vs-bits plot (gnuplot).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "needle.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace kvpack_eval {

/// What the reports say about the run besides the per-policy figures.
struct RunInfo {
  std::string model_name;   ///< the GGUF file's name
  std::string source;       ///< the scored text's file name, or the generated passage's description
  std::string filler_name;  ///< the needle filler's file name
  size_t windows = 0;       ///< windows scored
  int64_t ctx = 0;          ///< tokens per window (the generated sequence's length without --text)
  std::string passage;      ///< without --text: the generated passage (JSON only)
};

/// The Markdown report (stats[0] is the fp32 baseline). `offload_mismatch` is set when an offload
/// policy's logits differ from its twin's.
[[nodiscard]] inline std::string markdown_report(const std::vector<PolicyStats>& stats,
                                                 const std::vector<NeedleCase>& needles, const Options& opt,
                                                 const RunInfo& run, bool& offload_mismatch) {
  const PolicyStats& base = stats[0];
  const int64_t scored = base.scored;
  const std::string& model_name = run.model_name;
  const std::string& source = run.source;
  const std::string& filler_name = run.filler_name;
  std::ostringstream md;
  md << "### kvpack-eval: " << model_name << ", " << source;
  if (!opt.text.empty()) md << ", ctx " << opt.ctx << " x " << run.windows << " windows (second halves scored)";
  md << ", chunk " << opt.chunk << ", " << scored << " scored tokens\n\n";
  md << "| policy | K bits | V bits | bits/value (measured) | KV MiB @ " << base.kv_tokens
     << " tok | PPL | ΔPPL % | KL mean | KL p99 | top-1 agree % | prefill tok/s | decode tok/s |\n";
  md << "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n";
  for (const auto& s : stats) {
    md << "| " << s.name << " | " << fmt("%.2f", s.key_bits) << " | " << fmt("%.2f", s.value_bits) << " | "
       << fmt("%.2f", s.bits_per_value()) << " | " << fmt("%.2f", double(s.kv_bytes) / (1 << 20)) << " | "
       << fmt("%.4f", s.ppl()) << " | " << fmt("%+.3f", 100 * (s.ppl() / base.ppl() - 1)) << " | "
       << fmt("%.5f", s.kl_mean()) << " | " << fmt("%.4f", s.kl_p99()) << " | "
       << fmt("%.2f", 100.0 * double(s.agree) / double(std::max<int64_t>(s.scored, 1))) << " | "
       << fmt("%.1f", double(s.prefill_tokens) / std::max(s.prefill_s, 1e-9)) << " | "
       << (s.decode_tokens ? fmt("%.1f", double(s.decode_tokens) / std::max(s.decode_s, 1e-9)) : "-") << " |\n";
  }
  if (!needles.empty()) {
    md << "\nNeedle retrieval: 5-digit pass key at depth d % of " << filler_name
       << " filler in an L-token prompt; cell = greedy exact match (✓/✗) and log p(answer) in nats.\n\n| policy |";
    for (const auto& c : needles) md << " " << c.length << "@" << c.depth << "% |";
    md << " exact | mean log p |\n|---|";
    for (size_t i = 0; i < needles.size(); ++i) md << "--:|";
    md << "--:|--:|\n";
    for (const auto& s : stats) {
      md << "| " << s.name << " |";
      int ok = 0;
      double lp = 0;
      for (const auto& r : s.needle) {
        md << " " << (r.exact ? "✓" : "✗") << " " << fmt("%.2f", r.logp) << " |";
        ok += r.exact;
        lp += r.logp;
      }
      md << " " << ok << "/" << s.needle.size() << " | " << fmt("%.3f", lp / double(s.needle.size())) << " |\n";
    }
  }
  offload_mismatch = false;
  if (std::any_of(stats.begin(), stats.end(), [](const PolicyStats& s) { return s.offload.active; })) {
    md << "\nOffload (Offload<DeviceTier, FileTier, Prefetch<N>>, records sealed with AEAD in an unlinked file): "
          "budget = resident block bytes allowed, as % of the window's quantized block bytes; fetch = read + verify + "
          "decrypt of one block; hidden = share of fetch time prefetch overlapped with compute (fetch time of "
          "prefetched blocks / (that + time attend waited)); max |Δlogit| = over every scored logit vs the same "
          "policy without offload.\n\n"
       << "| policy | AEAD | budget MiB (%) | resident MiB at end | written MiB | read MiB | fetches | fetch p50 µs | "
          "fetch p99 µs | prefetch hit % | hidden % | attend wait ms | failures | vs | max \\|Δlogit\\| |\n"
       << "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|\n";
    for (const auto& s : stats) {
      const auto& o = s.offload;
      if (!o.active) continue;
      const bool same = o.compared && o.max_abs_dlogit == 0.0;
      offload_mismatch |= o.compared && !same;
      md << "| " << s.name << " | " << o.aead << " | " << fmt("%.2f", double(o.budget_bytes) / (1 << 20)) << " ("
         << fmt("%.0f", 100.0 * double(o.budget_bytes) / double(std::max<uint64_t>(o.block_bytes_total, 1))) << " %) | "
         << fmt("%.2f", double(o.resident_bytes_end) / (1 << 20)) << " | " << fmt("%.1f", double(o.bytes_written) / (1 << 20))
         << " | " << fmt("%.1f", double(o.bytes_read) / (1 << 20)) << " | " << o.fetches << " | "
         << fmt("%.1f", o.fetch_p50_us) << " | " << fmt("%.1f", o.fetch_p99_us) << " | " << fmt("%.1f", 100 * o.hit_rate())
         << " | " << fmt("%.1f", 100 * o.hidden_share()) << " | " << fmt("%.1f", double(o.wait_ns) / 1e6) << " | "
         << o.offload_failures + o.fetch_failures << " | " << (o.compared ? o.twin : "-") << " | "
         << (o.compared ? fmt("%g", o.max_abs_dlogit) + (same ? " (identical, " : " (MISMATCH, ") +
                              std::to_string(o.compared_rows) + " rows)"
                        : "not compared")
         << " |\n";
    }
  }
  return md.str();
}

/// Every figure as JSON (the fields scripts and docs/ pages read).
[[nodiscard]] inline nlohmann::json json_report(const std::vector<PolicyStats>& stats, const Options& opt,
                                              const RunInfo& run) {
  const PolicyStats& base = stats[0];
  nlohmann::json j;
  j["model"] = opt.model;
  j["source"] = run.source;
  j["text"] = opt.text;
  j["ctx"] = run.ctx;
  j["windows"] = run.windows;
  j["chunk"] = opt.chunk;
  j["scored_tokens"] = base.scored;
  if (opt.text.empty()) j["passage"] = run.passage;
  j["threads"] = omp_get_max_threads();
  j["kl"] = "KL(fp32 cache || policy), nats per scored token";
  // An fp16 cache of the same tokens: K and V, 2 bytes per value, every token seen (the first
  // window's kv_tokens), as kv_values counts values (fp32's kv_values = tokens x layers x heads x D x 2).
  const double fp16_bytes = base.kv_tokens ? 2.0 * double(base.kv_values) : 0.0;
  for (const auto& s : stats) {
    nlohmann::json p = {{"name", s.name},
                        {"key_bits_per_value", s.key_bits},
                        {"value_bits_per_value", s.value_bits},
                        {"measured_bits_per_value", s.bits_per_value()},
                        {"kv_bytes", s.kv_bytes},
                        {"kv_bytes_at_tokens", s.kv_tokens},
                        {"protocol", s.protocol},
                        {"tokens_after_prompt", s.tokens_after_prompt},
                        {"tokens_at_end", s.tokens_at_end},
                        {"kv_fraction_of_fp16", fp16_bytes ? double(s.kv_bytes) / double(fp16_bytes) : 0.0},
                        {"ppl", s.ppl()},
                        {"delta_ppl_percent", 100 * (s.ppl() / base.ppl() - 1)},
                        {"kl_mean", s.kl_mean()},
                        {"kl_p99", s.kl_p99()},
                        {"top1_agreement", double(s.agree) / double(std::max<int64_t>(s.scored, 1))},
                        {"prefill_tokens_per_s", double(s.prefill_tokens) / std::max(s.prefill_s, 1e-9)},
                        {"decode_tokens_per_s", s.decode_tokens ? double(s.decode_tokens) / std::max(s.decode_s, 1e-9) : 0.0}};
    if (s.tracks_saturation) p["saturated_values"] = s.saturated;
    if (s.offload.active) {
      const auto& o = s.offload;
      p["offload"] = {{"aead", o.aead},
                      {"budget_bytes", o.budget_bytes},
                      {"block_bytes_total", o.block_bytes_total},
                      {"resident_bytes_end", o.resident_bytes_end},
                      {"bytes_written", o.bytes_written},
                      {"bytes_read", o.bytes_read},
                      {"fetches", o.fetches},
                      {"fetch_p50_us", o.fetch_p50_us},
                      {"fetch_p99_us", o.fetch_p99_us},
                      {"prefetch_hit_rate", o.hit_rate()},
                      {"prefetch_hidden_share", o.hidden_share()},
                      {"attend_wait_ns", o.wait_ns},
                      {"failures", o.offload_failures + o.fetch_failures},
                      {"twin", o.twin},
                      {"compared", o.compared},
                      {"compared_rows", o.compared_rows},
                      {"max_abs_dlogit", o.max_abs_dlogit}};
    }
    for (const auto& r : s.needle)
      p["needle"].push_back({{"length", r.length}, {"depth_percent", r.depth}, {"logp", r.logp}, {"exact", r.exact}});
    j["policies"].push_back(p);
  }
  return j;
}

}  // namespace kvpack_eval
