// kvpack-eval's command line: every option, its default and its check (CLI11).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "options.hpp"

namespace kvpack_eval {

/// Command-line values that are not run options.
struct CliArgs {
  std::string policies;  ///< --policies, comma-separated (empty: the default set)
  bool list = false;     ///< --list-policies
};

/// Declares every option of kvpack-eval on `app`, writing into `opt` and `args`.
inline void define_cli(CLI::App& app, Options& opt, CliArgs& args) {
  app.add_option("--model", opt.model, "GGUF model (LLaMA architecture); default: the fetch_model.sh cache path");
  app.add_option("--text", opt.text, "Text file scored with llama-perplexity's protocol (without it: a generated passage)")
      ->check(CLI::ExistingFile);
  app.add_option("--ctx", opt.ctx, "Window length in tokens (second half scored)")->check(CLI::Range(int64_t{8}, int64_t{1} << 20));
  app.add_flag("--beyond-trained-context", opt.beyond_context,
               "Allow --ctx above the model's trained context (streaming studies: positions past it are out of "
               "distribution for a full cache; PreRope<CacheRelative> eviction keeps them inside)");
  app.add_option("--windows", opt.windows, "Number of non-overlapping windows (fewer if the text is shorter)")
      ->check(CLI::PositiveNumber);
  app.add_option("--chunk", opt.chunk, "Tokens per forward pass; earlier chunks are read from the compressed cache (1 = pure decode)")
      ->check(CLI::PositiveNumber);
  app.add_option("--policies", args.policies, "Comma-separated policy names (default: every default policy); see --list-policies");
  app.add_flag("--list-policies", args.list, "Print the policies compiled into this build and exit");
  app.add_option("--threads", opt.threads, "OpenMP threads (default: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--gen-tokens", opt.gen_tokens, "Without --text: tokens to generate for the passage")->check(CLI::PositiveNumber);
  app.add_option("--decode-tokens", opt.decode_tokens, "Tokens decoded one at a time after the first window (decode tok/s)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", opt.json, "Write every figure as JSON to this file");
  app.add_option("--markdown", opt.markdown, "Write the Markdown tables to this file too");
  app.add_option("--plot", opt.plot, "Write a PNG (gnuplot): KL and perplexity change vs measured bits per value");
  app.add_option("--dump-kv", opt.dump_kv,
                 "Directory for layerLL_{k_prerope,k,v}.npy of the fp32 run of the first window: float32 "
                 "[tokens][kv_heads][head_dim], plus meta.json");
  app.add_option("--dump-tokens", opt.dump_tokens,
                 "With --text: write the windows' token ids as scored, as JSON {model, text, ctx, first_window, first_row, "
                 "windows}, and exit, unless --policies is given too (then the run goes on)");
  app.add_option("--dump-layers", opt.dump_layers, "Layers written by --dump-kv")->delimiter(',');
  app.add_flag("!--no-needle", opt.needle, "Skip the needle (passkey) retrieval test");
  app.add_flag("--progress", opt.progress,
               "Progress bar on stderr even when it is not a terminal (one line per 10 %); on a terminal it is always drawn");
  app.add_option("--needle-lengths", opt.needle_lengths, "Needle prompt lengths in tokens, up to the model's context (e.g. 1024,2048,4096)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  // 0..100: make_needles slices the filler at fill * depth / 100 (outside that range: out of bounds).
  app.add_option("--needle-depths", opt.needle_depths, "Needle depths in percent of the filler (0 to 100)")
      ->delimiter(',')
      ->check(CLI::Range(0, 100));
  app.add_option("--offload-budget", opt.offload.budget_fraction,
                 "Offload policies (\"X+offload\"): resident budget as a fraction of the window's quantized block bytes; "
                 "their logits are checked bit-for-bit against policy X when X is listed before them")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--offload-dir", opt.offload.directory, "Offload policies: directory of the encrypted, unlinked block file (default $TMPDIR or /tmp)");
  app.add_option("--filler", opt.filler,
                 "Needle filler text (default: ../shared/data/wikitext-2-raw/wiki.test.raw, else the "
                 "in-repo head tools/llama/tests/data/wikitext2_test_head.raw, else --text)");
  app.add_option("--first-window", opt.first_window, "Skip this many --ctx windows of --text first (held-out windows)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--profile", opt.profile,
                 "Sensitivity profile: per layer x candidate, KL vs the fp32 cache with only that layer compressed; "
                 "writes this JSON file (use a short --ctx, 1 window)");
  app.add_option("--profile-candidates", opt.profile_candidates, "Candidates profiled (fp32 costs 0 by definition)")
      ->delimiter(',');
  app.add_flag("--profile-merge", opt.profile_merge,
               "--profile: keep the existing file's columns and profile only the candidates it lacks (same text, ctx, "
               "windows and chunk required)");
  app.add_option("--plan", opt.plan,
                 "Evaluate per-layer plans from this --profile JSON at the budgets of --plan-budgets, plus a run whose "
                 "budget halves mid-sequence");
  app.add_option("--plan-budgets", opt.plan_budgets, "Budgets named by the uniform policy whose bytes they equal")
      ->delimiter(',');
  app.add_option("--plan-uniform", opt.plan_uniform,
                 "--plan: also score these uniform registry policies on the same windows (baselines with no plan of "
                 "their own, e.g. kivi8 at int8's bytes)")
      ->delimiter(',');
  app.add_option("--replan-from", opt.replan_from, "Uniform policy whose bytes are the budget before it halves (none: no halving run)");
  app.add_flag("--fallback", opt.fallback,
               "--plan: also run the first planned budget with the quality monitor (entropy / attention-norm spikes "
               "raise precision for new tokens)");
  app.add_option("--fallback-k", opt.fallback_k, "Monitor threshold: mean + k * std of the fp32 calibration run");
  app.add_option("--fallback-norm", opt.fallback_norm,
                 "Attention-norm spike test: fixed (calibrated threshold) or running (mean + k std of an EMA baseline, "
                 "1/32 per token, 16 warm-up tokens)")
      ->check(CLI::IsMember({"fixed", "running"}));
  app.add_option("--fallback-mode", opt.fallback_mode,
                 "migrate: a switch re-plans and migrates stored tokens; segments: new tokens only, stored tokens kept, "
                 "fp32 copy of the last --fallback-window tokens during the fallback (reference-speed attention)")
      ->check(CLI::IsMember({"migrate", "segments"}));
  app.add_option("--fallback-window", opt.fallback_window, "--fallback-mode segments: tokens kept in fp32 during a fallback");
  app.add_option("--fallback-calm", opt.fallback_calm, "Quiet tokens before the monitor switches back");
  app.add_option("--calib-ctx", opt.calib_ctx, "Calibration slice (first tokens of --text, as --profile uses) for --fallback");
}

}  // namespace kvpack_eval
