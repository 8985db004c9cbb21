// kvpack-eval: the run's options (filled by the CLI in main.cpp), the sequence type, and the
// small helpers every part of the program uses.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <kvpack/plan/candidates.hpp>

#include "llama/model.hpp"
#include "llama/offload_eval.hpp"
#include "llama/progress.hpp"

namespace kvpack_eval {

namespace kl = kvpack::llama;
using kl::RowMat;
using kl::Progress;
using Clock = std::chrono::steady_clock;

[[nodiscard]] inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// A sequence to score: tokens, and the first logit row scored (row i predicts token i + 1).
struct Window {
  std::vector<int32_t> tokens;
  int64_t first_row = 0;
};

/// Everything the command line sets (see main.cpp for each option's meaning).
struct Options {
  std::string model, text, filler, json, markdown, plot, dump_kv, dump_tokens;
  int64_t ctx = 512;
  bool beyond_context = false;  ///< --beyond-trained-context: --ctx may exceed the trained context
  int windows = 4, chunk = 32, threads = 0, gen_tokens = 256, decode_tokens = 16;
  std::vector<std::string> policies;
  std::vector<int> dump_layers{0, 15, 29};
  bool needle = true;
  bool progress = false;  // --progress: draw the bar even when stderr is not a terminal
  std::vector<int64_t> needle_lengths{1024};
  std::vector<int> needle_depths{10, 50, 90};
  kl::OffloadEvalOptions offload;  // Offload<> policies: resident budget fraction, file directory
  // Per-layer planning (issue 9): --profile writes a sensitivity table, --plan evaluates plans.
  std::string profile, plan;
  int first_window = 0;
  std::vector<std::string> profile_candidates{"fp16", "int8", "k8v4", "kivi4", "int4-g32", "int4-g64"};
  std::vector<std::string> plan_budgets{"int4-g32", "int8"};
  std::string replan_from = "fp16";
  std::vector<std::string> plan_uniform;  // --plan: extra uniform registry policies scored alongside the plans
  bool profile_merge = false;
  bool fallback = false;
  double fallback_k = 3.0;
  std::string fallback_norm = "fixed";
  std::string fallback_mode = "migrate";
  int64_t fallback_window = 64;
  int fallback_calm = 32;
  int64_t calib_ctx = 256;
  Window calib;  // --plan --fallback: the calibration window (the profile's text slice)
};

/// The per-layer cache the planner drives (candidate i = kvpack::plan::standard_candidate_names[i]).
using PlanCache = kvpack::plan::StandardLayeredCache;


[[nodiscard]] inline int die(const std::string& msg) {
  std::fprintf(stderr, "kvpack-eval: error: %s\n", msg.c_str());
  return 1;
}

/// printf-style formatting of one number.
[[nodiscard]] inline std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

/// The whole file, or nullopt when it cannot be read.
[[nodiscard]] inline std::optional<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return std::nullopt;
  return ss.str();
}

}  // namespace kvpack_eval
