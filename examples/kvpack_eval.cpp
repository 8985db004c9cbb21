// kvpack-eval: what each KV-cache compression policy costs in quality, memory and speed on a real
// LLaMA-architecture model (default SmolLM2-135M-Instruct), and whether it still retrieves a needle.
//
// Quality protocol (with --text): llama.cpp llama-perplexity's non-overlapping windows of --ctx
// tokens, each scored on its second half. Every window runs in chunks of --chunk tokens, each
// chunk attending to all earlier chunks through the policy's cache, so every scored token reads
// compressed K/V. KL(fp32 cache || policy) and top-1 agreement compare next-token distributions
// with those of the uncompressed kvpack cache ("fp32") on the same window.
// Without --text, the model first writes a passage greedily (fp32 cache) from a built-in prompt
// and every policy is scored on the generated tokens.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <kvpack/plan/candidates.hpp>
#include <kvpack/plan/metrics.hpp>
#include <kvpack/plan/monitor.hpp>
#include <kvpack/plan/planner.hpp>

#include "llama/eval.hpp"
#include "llama/model.hpp"
#include "llama/offload_eval.hpp"
#include "llama/policies.hpp"
#include "llama/tokenizer.hpp"

namespace {

namespace kl = kvpack::llama;
using kl::RowMat;
using Clock = std::chrono::steady_clock;

[[nodiscard]] double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// A sequence to score: tokens, and the first logit row scored (row i predicts token i + 1).
struct Window {
  std::vector<int32_t> tokens;
  int64_t first_row = 0;
};

struct Options {
  std::string model, text, filler, json, markdown, plot, dump_kv;
  int64_t ctx = 512;
  int windows = 4, chunk = 32, threads = 0, gen_tokens = 256, decode_tokens = 16;
  std::vector<std::string> policies;
  std::vector<int> dump_layers{0, 15, 29};
  bool needle = true;
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

/// Progress bar with ETA on stderr, in token units; one line per 10 % when stderr is not a TTY.
class Progress {
 public:
  explicit Progress(int64_t total) : total_(std::max<int64_t>(total, 1)), tty_(isatty(2) != 0), start_(Clock::now()) {}
  void label(std::string l) {
    std::lock_guard lock(mu_);
    label_ = std::move(l);
  }
  /// Counts `tokens` more done (thread-safe); `label` replaces the current label when given.
  void advance(int64_t tokens, const std::string* label = nullptr) {
    std::lock_guard lock(mu_);
    if (label) label_ = *label;
    done_ += tokens;
    const double t = seconds_since(start_), frac = std::min(1.0, double(done_) / double(total_));
    const int decile = static_cast<int>(frac * 10);
    if (tty_ ? t - last_ < 0.2 && done_ < total_ : decile == last_decile_) return;
    last_ = t;
    last_decile_ = decile;
    const double eta = frac > 0 ? t * (1 - frac) / frac : 0;
    constexpr int width = 30;
    const int fill = static_cast<int>(frac * width);
    std::fprintf(stderr, "%s[%s%s] %3.0f%%  %s elapsed, ETA %s  %-28s%s", tty_ ? "\r" : "",
                 std::string(size_t(fill), '#').c_str(), std::string(size_t(width - fill), '.').c_str(), frac * 100,
                 fmt_time(t).c_str(), fmt_time(eta).c_str(), label_.c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\n");
  }
  static std::string fmt_time(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
    return b;
  }

 private:
  int64_t total_, done_ = 0;
  bool tty_;
  Clock::time_point start_;
  double last_ = -1;
  int last_decile_ = -1;
  std::string label_;
  std::mutex mu_;
};

/// One needle case's outcome for one policy.
struct NeedleResult {
  int64_t length = 0;
  int depth = 0;
  double logp = 0;  // sum of log-probabilities of the answer tokens, nats
  bool exact = false;
};

/// Everything measured for one policy.
struct PolicyStats {
  std::string name;
  double key_bits = 0, value_bits = 0;  // declared, incl. metadata
  double nll = 0;
  int64_t scored = 0, agree = 0;
  std::vector<float> kl;
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  size_t kv_bytes = 0;      // memory_bytes() after the first window
  int64_t kv_values = 0;    // K and V values held then
  int64_t kv_tokens = 0;
  std::vector<NeedleResult> needle;
  kl::OffloadReport offload;  // Offload<> policies only

  [[nodiscard]] double ppl() const { return std::exp(nll / double(std::max<int64_t>(scored, 1))); }
  [[nodiscard]] double bits_per_value() const { return kv_values ? 8.0 * double(kv_bytes) / double(kv_values) : 0; }
  [[nodiscard]] double kl_mean() const {
    double s = 0;
    for (float x : kl) s += x;
    return kl.empty() ? 0 : s / double(kl.size());
  }
  [[nodiscard]] double kl_p99() const {
    if (kl.empty()) return 0;
    std::vector<float> v = kl;
    const auto k = static_cast<size_t>(std::ceil(0.99 * double(v.size()))) - 1;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }
};

/// State shared across policies for the window being scored: the fp32-cache log-probabilities.
struct Baseline {
  RowMat logprobs;              // [scored rows][vocab]
  std::vector<int32_t> argmax;  // [scored rows]
};

/// Collects K (pre- and post-RoPE) and V of chosen layers during one run, then writes .npy files.
struct KvDump {
  std::vector<int> layers;
  std::map<int, std::vector<float>> k_pre, k_post, v;
  int kv_heads = 0, head_dim = 0;

  kl::KvTap tap() {
    return [this](int layer, std::span<const float> kp, std::span<const float> k, std::span<const float> vv) {
      if (std::find(layers.begin(), layers.end(), layer) == layers.end()) return;
      k_pre[layer].insert(k_pre[layer].end(), kp.begin(), kp.end());
      k_post[layer].insert(k_post[layer].end(), k.begin(), k.end());
      v[layer].insert(v[layer].end(), vv.begin(), vv.end());
    };
  }
  // NumPy .npy v1.0: magic, header dict padded with spaces to a multiple of 64 bytes, raw data.
  static bool write_npy(const std::filesystem::path& p, const std::vector<float>& data, int64_t a, int64_t b, int64_t c) {
    std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(a) + ", " +
                    std::to_string(b) + ", " + std::to_string(c) + "), }";
    h += std::string(64 - (10 + h.size() + 1) % 64, ' ') + "\n";
    std::ofstream f(p, std::ios::binary);
    const unsigned char pre[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    f.write(reinterpret_cast<const char*>(pre), 8);
    const uint16_t hl = static_cast<uint16_t>(h.size());
    const char len[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
    f.write(len, 2);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
    return static_cast<bool>(f);
  }
  kvpack::Status write(const std::string& dir, const std::vector<int32_t>& tokens, const kl::ModelConfig& cfg,
                       const std::string& model) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return kvpack::fail(kvpack::Errc::io_error, "--dump-kv: cannot create " + dir + ": " + ec.message());
    const int64_t row = int64_t(kv_heads) * head_dim;
    for (int l : layers) {
      char stem[32];
      std::snprintf(stem, sizeof stem, "layer%02d_", l);
      const int64_t n = static_cast<int64_t>(v[l].size()) / row;
      for (auto [name, buf] : {std::pair{"k_prerope", &k_pre[l]}, std::pair{"k", &k_post[l]}, std::pair{"v", &v[l]}})
        if (!write_npy(std::filesystem::path(dir) / (std::string(stem) + name + ".npy"), *buf, n, kv_heads, head_dim))
          return kvpack::fail(kvpack::Errc::io_error, "--dump-kv: cannot write into " + dir);
    }
    nlohmann::json meta = {{"model", model},
                           {"layout", "[tokens][kv_heads][head_dim] float32, token t at position t"},
                           {"files", "layerLL_k_prerope.npy (K before RoPE), layerLL_k.npy (K after RoPE), layerLL_v.npy"},
                           {"rope", "adjacent pairs (2i, 2i+1) rotated by pos * freq_base^(-2i/head_dim)"},
                           {"rope_freq_base", cfg.rope_base},
                           {"layers", layers},
                           {"kv_heads", kv_heads},
                           {"head_dim", head_dim},
                           {"tokens", tokens}};
    std::ofstream(std::filesystem::path(dir) / "meta.json") << meta.dump(1) << "\n";
    return {};
  }
};

class Evaluator {
 public:
  Evaluator(const kl::Model& model, const kl::Tokenizer& tok, const Options& opt) : m_(model), tok_(tok), opt_(opt) {}

  /// Scores window `w` with the policy `Cache`; the baseline policy fills base_, the others are
  /// compared with it. The first window also times a token-by-token decode and records KV bytes.
  template <class Cache>
  kvpack::Status score(PolicyStats& st, const Window& w, bool baseline, bool first_window, Progress& prog,
                       KvDump* dump) {
    const auto n = static_cast<int64_t>(w.tokens.size());
    auto cache = make_cache<Cache>(m_.cache_shape(capacity<Cache>(n, n + opt_.decode_tokens)), n, &st.offload);
    if (!cache) return cache.error();
    kvpack::Status hook_status;
    const int64_t rows = n - 1 - w.first_row;
    // Exactness check of "X+offload" against "X": X's raw logits are kept for this window.
    const bool keep_twin = twins_.count(st.name) != 0;
    const std::string twin = kl::offload_twin(st.name);
    const RowMat* twin_logits = nullptr;
    if (!twin.empty()) {
      st.offload.twin = twin;
      if (auto it = twin_logits_.find(twin); it != twin_logits_.end() && it->second.rows() == rows) {
        twin_logits = &it->second;
        st.offload.compared = true;
      }
    }
    if (keep_twin) twin_logits_[st.name].resize(rows, m_.cfg.vocab);
    if (baseline) {
      base_.logprobs.resize(rows, m_.cfg.vocab);
      base_.argmax.assign(size_t(rows), 0);
    }
    std::vector<float> kls;
    double scoring_s = 0;
    Eigen::RowVectorXf last;  // logits after the final token, for the decode timing
    auto on_logits = [&](int64_t i0, RowMat& lg) {
      const auto t0 = Clock::now();
      if (i0 + lg.rows() == n) last = lg.row(lg.rows() - 1);
      for (Eigen::Index r = 0; r < lg.rows(); ++r) {
        const int64_t i = i0 + r, row = i - w.first_row;
        if (i + 1 >= n) break;
        if (keep_twin) twin_logits_[st.name].row(row) = lg.row(r);
        if (twin_logits) {
          st.offload.max_abs_dlogit = std::max(
              st.offload.max_abs_dlogit, double((twin_logits->row(row) - lg.row(r)).cwiseAbs().maxCoeff()));
          ++st.offload.compared_rows;
        }
        auto lp = lg.row(r);
        kl::log_softmax(lp);
        st.nll -= lp[w.tokens[size_t(i + 1)]];
        ++st.scored;
        Eigen::Index top = 0;
        lp.maxCoeff(&top);
        if (baseline) {
          base_.logprobs.row(row) = lp;
          base_.argmax[size_t(row)] = static_cast<int32_t>(top);
          kls.push_back(0.f);
          ++st.agree;
        } else {
          const auto p = base_.logprobs.row(row).array();
          kls.push_back(std::max(0.f, (p.exp() * (p - lp.array())).sum()));
          st.agree += top == base_.argmax[size_t(row)];
        }
      }
      if constexpr (std::is_same_v<Cache, PlanCache>)
        if (row_hook) row_hook(*cache, lg);
      scoring_s += seconds_since(t0);
    };
    const auto t0 = Clock::now();
    // Context (tokens before first_row) prefilled, compressed by SnapKV caches, then scored.
    auto s = kl::run_prefill_then_score(
        m_, *cache, w.tokens, w.first_row, w.first_row, opt_.chunk, on_logits,
        [&, done = int64_t{0}](int64_t e) mutable {
          prog.advance(e - done);
          done = e;
          if constexpr (std::is_same_v<Cache, PlanCache>)
            if (plan_hook && hook_status) hook_status = plan_hook(*cache, e, n);
        },
        dump ? dump->tap() : (std::is_same_v<Cache, PlanCache> && kv_tap ? kv_tap : kl::KvTap{}));
    if (!s) return s;
    if (!hook_status) return hook_status;
    st.prefill_s += seconds_since(t0) - scoring_s;
    st.prefill_tokens += n;
    st.kl.insert(st.kl.end(), kls.begin(), kls.end());
    if (!first_window) return kl::collect_offload(*cache, st.offload);
    st.kv_bytes = cache->memory_bytes();
    st.kv_tokens = n;
    st.kv_values = 0;
    for (int l = 0; l < m_.cfg.layers; ++l)
      for (int h = 0; h < m_.cfg.kv_heads; ++h) {  // tokens held after eviction, where a policy evicts
        if constexpr (requires { cache->held_tokens(l, h); })
          st.kv_values += cache->held_tokens(l, h) * m_.cfg.head_dim * 2;
        else
          st.kv_values += cache->tokens(l) * m_.cfg.head_dim * 2;
      }
    // Decode timing: greedy continuation, one token per forward (the output head included).
    RowMat lg;
    Eigen::Index next = 0;
    if (last.size()) last.maxCoeff(&next);
    const auto td = Clock::now();
    for (int i = 0; i < opt_.decode_tokens; ++i) {
      const int32_t t = static_cast<int32_t>(next);
      if (auto e = m_.forward(*cache, std::span(&t, 1), static_cast<int32_t>(n + i), 0, lg); !e) return e;
      lg.row(0).maxCoeff(&next);
      prog.advance(1);
    }
    st.decode_s += seconds_since(td);
    st.decode_tokens += opt_.decode_tokens;
    return kl::collect_offload(*cache, st.offload);
  }

  /// Policies whose raw logits are kept per window (the twins of "+offload" policies).
  void set_twins(std::set<std::string> names) { twins_ = std::move(names); }

  /// Runs one needle case (prompt + answer) with `Cache`: log-probability of the answer tokens
  /// and whether greedy decoding reproduces them exactly (every answer token is the argmax).
  /// `context`: the case's declared length (--needle-lengths), see capacity().
  template <class Cache>
  kvpack::Result<NeedleResult> needle(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
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

/// Dispatches a member-function template of Evaluator over the registry by policy name.
template <class R, class F>
R dispatch(const std::string& name, F&& f) {
  return kl::with_policy<R>(name, std::forward<F>(f), R(kvpack::fail(kvpack::Errc::invalid_argument, "unknown policy " + name)));
}

[[nodiscard]] int die(const std::string& msg) {
  std::fprintf(stderr, "kvpack-eval: error: %s\n", msg.c_str());
  return 1;
}

[[nodiscard]] std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

/// The passkey needle prompt: instructions, filler with the key planted at `depth` %, question.
struct NeedleCase {
  int64_t length;
  int depth;
  std::vector<int32_t> prompt, answer;
  std::string key;
};

std::vector<NeedleCase> make_needles(const kl::Tokenizer& tok, const std::vector<int32_t>& filler, const Options& opt,
                                     int64_t max_ctx) {
  std::vector<NeedleCase> out;
  const auto intro = tok.encode(
      "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
      "I will quiz you about the pass key.\n\n");
  const auto question = tok.encode("\n\nWhat is the pass key? The pass key is");
  for (int64_t len : opt.needle_lengths) {
    if (len > max_ctx) continue;
    for (int depth : opt.needle_depths) {
      std::mt19937 rng(static_cast<unsigned>(len * 1000 + depth));  // the key depends on the case only
      NeedleCase c{len, depth, {}, {}, std::to_string(10000 + rng() % 90000)};
      const auto needle = tok.encode("\n\nThe pass key is " + c.key + ". Remember it. " + c.key + " is the pass key.\n\n");
      c.answer = tok.encode(" " + c.key);
      const int64_t fill = len - int64_t(intro.size() + needle.size() + question.size() + c.answer.size());
      if (fill < 16 || fill > static_cast<int64_t>(filler.size())) continue;
      const int64_t at = fill * depth / 100;
      c.prompt = intro;
      c.prompt.insert(c.prompt.end(), filler.begin(), filler.begin() + at);
      c.prompt.insert(c.prompt.end(), needle.begin(), needle.end());
      c.prompt.insert(c.prompt.end(), filler.begin() + at, filler.begin() + fill);
      c.prompt.insert(c.prompt.end(), question.begin(), question.end());
      out.push_back(std::move(c));
    }
  }
  return out;
}

[[nodiscard]] std::optional<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return std::nullopt;
  return ss.str();
}

#include "kvpack_eval_plan.inc"

int run(int argc, char** argv) {
  Options opt;
  std::string policies_arg;
  CLI::App app{"kvpack-eval: quality, memory and speed of KV-cache compression policies on a real model"};
  app.add_option("--model", opt.model, "GGUF model (LLaMA architecture); default: the fetch_model.sh cache path");
  app.add_option("--text", opt.text, "Text file scored with llama-perplexity's protocol (without it: a generated passage)")
      ->check(CLI::ExistingFile);
  app.add_option("--ctx", opt.ctx, "Window length in tokens (second half scored)")->check(CLI::Range(int64_t{8}, int64_t{1} << 20));
  app.add_option("--windows", opt.windows, "Number of non-overlapping windows (fewer if the text is shorter)")
      ->check(CLI::PositiveNumber);
  app.add_option("--chunk", opt.chunk, "Tokens per forward pass; earlier chunks are read from the compressed cache (1 = pure decode)")
      ->check(CLI::PositiveNumber);
  app.add_option("--policies", policies_arg, "Comma-separated policy names (default: every default policy); see --list-policies");
  bool list = false;
  app.add_flag("--list-policies", list, "Print the registered policies and exit");
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
  app.add_option("--dump-layers", opt.dump_layers, "Layers written by --dump-kv")->delimiter(',');
  app.add_flag("!--no-needle", opt.needle, "Skip the needle (passkey) retrieval test");
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
                 "Needle filler text (default: ../shared/data/wikitext-2-raw/wiki.test.raw, else --text)");
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
  CLI11_PARSE(app, argc, argv);

  if (list) {
    for (const auto& n : kl::policy_names(false)) std::printf("%s\n", n.c_str());
    return 0;
  }
  std::vector<std::string> names;
  if (policies_arg.empty()) {
    names = kl::policy_names(true);
  } else {
    std::stringstream ss(policies_arg);
    for (std::string p; std::getline(ss, p, ',');)
      if (!p.empty()) names.push_back(p);
  }
  for (const auto& n : names)
    if (!kl::has_policy(n)) {
      std::string known;
      for (const auto& k : kl::policy_names(false)) known += (known.empty() ? "" : ", ") + k;
      return die("unknown policy '" + n + "' (known: " + known + ")");
    }
  // fp32 is the baseline every other policy is compared with: always first.
  names.erase(std::remove(names.begin(), names.end(), "fp32"), names.end());
  names.insert(names.begin(), "fp32");

  if (opt.threads > 0) omp_set_num_threads(opt.threads);
  if (opt.model.empty()) {
    const char* dir = std::getenv("KVPACK_MODEL_DIR");
    const char* home = std::getenv("HOME");
    opt.model = (dir ? std::string(dir) : std::string(home ? home : ".") + "/.cache/kvpack/models") +
                "/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  if (!std::filesystem::exists(opt.model))
    return die("model file '" + opt.model + "' not found (run examples/fetch_model.sh, or pass --model)");
  auto file = kl::GgufFile::open(opt.model);
  if (!file) return die("cannot read model '" + opt.model + "': " + file.error().message);
  auto model = kl::Model::from_gguf(*file, opt.model);
  if (!model) return die("cannot load model '" + opt.model + "': " + model.error().message);
  auto tok = kl::Tokenizer::from_gguf(*file);
  if (!tok) return die("cannot load the tokenizer of '" + opt.model + "': " + tok.error().message);
  const kl::ModelConfig& cfg = model->cfg;
  const std::string model_name = std::filesystem::path(opt.model).filename().string();

  // The sequences to score.
  std::vector<Window> windows;
  std::vector<int32_t> gen_prompt;
  std::string source;
  if (!opt.text.empty()) {
    if (opt.ctx > cfg.context)
      return die("--ctx " + std::to_string(opt.ctx) + " exceeds the model's trained context of " +
                 std::to_string(cfg.context) + " tokens");
    const auto text = read_file(opt.text);
    if (!text) return die("cannot read text file '" + opt.text + "'");
    const auto ids = tok->encode(*text);
    const auto avail = static_cast<int>(static_cast<int64_t>(ids.size()) / opt.ctx) - opt.first_window;
    if (avail < 1)
      return die("'" + opt.text + "' has " + std::to_string(ids.size()) + " tokens, fewer than one window of --ctx " +
                 std::to_string(opt.ctx));
    if (avail < opt.windows) {
      std::fprintf(stderr, "kvpack-eval: note: the text holds only %d windows of %lld tokens\n", avail,
                   static_cast<long long>(opt.ctx));
      opt.windows = avail;
    }
    for (int w = 0; w < opt.windows; ++w) {
      const int64_t w0 = int64_t(w + opt.first_window) * opt.ctx;
      windows.push_back({std::vector<int32_t>(ids.begin() + w0, ids.begin() + w0 + opt.ctx), opt.ctx / 2});
      if (tok->add_bos()) windows.back().tokens[0] = tok->bos();  // as llama-perplexity does
    }
    source = std::filesystem::path(opt.text).filename().string();
    if (static_cast<int64_t>(ids.size()) >= opt.calib_ctx) {  // calibration slice: the text's first tokens
      opt.calib = {std::vector<int32_t>(ids.begin(), ids.begin() + opt.calib_ctx), opt.calib_ctx / 2};
      if (tok->add_bos()) opt.calib.tokens[0] = tok->bos();
    }
  } else {
    // Chat-formatted request to the instruct model, special tokens by id.
    const int32_t im_start = tok->bos();
    const auto user = tok->encode("user\nWrite a detailed, factual essay about the history of the printing press in Europe.");
    const auto nl = tok->encode("\n"), asst = tok->encode("assistant\n");
    gen_prompt.push_back(im_start);
    gen_prompt.insert(gen_prompt.end(), user.begin(), user.end());
    gen_prompt.push_back(tok->eos());
    gen_prompt.insert(gen_prompt.end(), nl.begin(), nl.end());
    gen_prompt.push_back(im_start);
    gen_prompt.insert(gen_prompt.end(), asst.begin(), asst.end());
  }

  // Needle cases.
  std::vector<NeedleCase> needles;
  std::string filler_name;
  if (opt.needle) {
    std::string fpath = opt.filler;
    if (fpath.empty()) {
      fpath = "../shared/data/wikitext-2-raw/wiki.test.raw";
      if (!std::filesystem::exists(fpath)) fpath = opt.text;
    }
    filler_name = std::filesystem::path(fpath).filename().string();
    std::optional<std::string> ftext;
    if (!fpath.empty()) ftext = read_file(fpath);
    if (!ftext) {
      if (!opt.filler.empty()) return die("cannot read filler file '" + opt.filler + "'");
      std::fprintf(stderr, "kvpack-eval: note: no filler text found (--filler); needle test skipped\n");
    } else {
      auto ids = tok->encode(ftext->substr(0, std::min<size_t>(ftext->size(), 200000)));
      needles = make_needles(*tok, ids, opt, cfg.context);
    }
  }

  // Work plan in tokens, for the progress bar.
  const auto P = static_cast<int64_t>(names.size());
  int64_t total = 0;
  if (windows.empty()) total += static_cast<int64_t>(gen_prompt.size()) + opt.gen_tokens;
  const int64_t per_window = windows.empty() ? static_cast<int64_t>(gen_prompt.size()) + opt.gen_tokens : opt.ctx;
  total += P * (per_window * std::max<int64_t>(1, static_cast<int64_t>(windows.size())) + opt.decode_tokens);
  for (const auto& c : needles) total += P * static_cast<int64_t>(c.prompt.size() + c.answer.size() - 1);
  if ((!opt.profile.empty() || !opt.plan.empty()) && opt.text.empty()) return die("--profile and --plan need --text");
  if (!opt.profile.empty() || !opt.plan.empty()) {
    Evaluator pev(*model, *tok, opt);
    return !opt.profile.empty() ? run_profile(*model, pev, opt, windows, model_name, source)
                                : run_plan(*model, pev, opt, windows, model_name, source);
  }
  Progress prog(total);
  Evaluator ev(*model, *tok, opt);
  ev.set_im_end(tok->eos());
  {
    std::set<std::string> twins;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string t = kl::offload_twin(names[i]);
      if (t.empty()) continue;
      const auto at = std::find(names.begin(), names.end(), t);
      if (at != names.end() && size_t(at - names.begin()) < i)
        twins.insert(t);
      else
        std::fprintf(stderr, "kvpack-eval: note: %s is not compared with %s (list %s before it)\n", names[i].c_str(),
                     t.c_str(), t.c_str());
    }
    ev.set_twins(std::move(twins));
  }

  if (windows.empty()) {
    prog.label("generating passage (fp32)");
    auto seq = ev.generate(gen_prompt, opt.gen_tokens, prog);
    if (!seq) return die(seq.error().message);
    windows.push_back({*seq, static_cast<int64_t>(gen_prompt.size()) - 1});
    source = "generated passage (" + std::to_string(seq->size() - gen_prompt.size()) + " tokens after a " +
             std::to_string(gen_prompt.size()) + "-token prompt)";
  }

  std::vector<PolicyStats> stats(names.size());
  for (size_t p = 0; p < names.size(); ++p) {
    stats[p].name = names[p];
    (void)kl::with_policy<int>(
        names[p],
        [&]<class Cache>() {
          stats[p].key_bits = Cache::key_bits_per_value;
          stats[p].value_bits = Cache::value_bits_per_value;
          return 0;
        },
        0);
  }
  KvDump dump;
  dump.layers = opt.dump_layers;
  dump.kv_heads = cfg.kv_heads;
  dump.head_dim = cfg.head_dim;
  for (int l : dump.layers)
    if (l < 0 || l >= cfg.layers) return die("--dump-layers: layer " + std::to_string(l) + " out of range");

  for (size_t w = 0; w < windows.size(); ++w)
    for (size_t p = 0; p < names.size(); ++p) {
      prog.label(names[p] + " window " + std::to_string(w + 1) + "/" + std::to_string(windows.size()));
      KvDump* d = !opt.dump_kv.empty() && w == 0 && p == 0 ? &dump : nullptr;
      auto s = dispatch<kvpack::Status>(names[p], [&]<class Cache>() {
        return ev.score<Cache>(stats[p], windows[w], p == 0, w == 0, prog, d);
      });
      if (!s) return die(names[p] + ": " + s.error().message);
    }
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
    auto r = dispatch<kvpack::Result<NeedleResult>>(name, [&]<class Cache>() {
      return ev.needle<Cache>(c.prompt, c.answer, c.length, prog, name + " needle " + std::to_string(c.length) + "@" +
                                                            std::to_string(c.depth) + "%");
    });
    if (!r) {
      nerr[size_t(j)] = name + ": " + r.error().message;
      continue;
    }
    nres[size_t(j)] = *r;
    nres[size_t(j)].length = c.length;
    nres[size_t(j)].depth = c.depth;
  }
  for (int64_t j = 0; j < jobs; ++j) {
    if (!nerr[size_t(j)].empty()) return die(nerr[size_t(j)]);
    stats[size_t(j) % names.size()].needle.push_back(nres[size_t(j)]);
  }
  prog.finish();
  if (!opt.dump_kv.empty())
    if (auto s = dump.write(opt.dump_kv, windows[0].tokens, cfg, model_name); !s) return die(s.error().message);

  // Report.
  const PolicyStats& base = stats[0];
  int64_t scored = base.scored;
  std::ostringstream md;
  md << "### kvpack-eval: " << model_name << ", " << source;
  if (!opt.text.empty()) md << ", ctx " << opt.ctx << " x " << windows.size() << " windows (second halves scored)";
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
  bool offload_mismatch = false;
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
  std::cout << md.str() << std::flush;
  if (!opt.markdown.empty() && !(std::ofstream(opt.markdown) << md.str()))
    return die("cannot write --markdown file '" + opt.markdown + "'");

  if (!opt.json.empty()) {
    nlohmann::json j;
    j["model"] = opt.model;
    j["source"] = source;
    j["text"] = opt.text;
    j["ctx"] = opt.text.empty() ? static_cast<int64_t>(windows[0].tokens.size()) : opt.ctx;
    j["windows"] = windows.size();
    j["chunk"] = opt.chunk;
    j["scored_tokens"] = scored;
    if (opt.text.empty())
      j["passage"] = tok->decode(std::span(windows[0].tokens).subspan(gen_prompt.size()));
    j["threads"] = omp_get_max_threads();
    j["kl"] = "KL(fp32 cache || policy), nats per scored token";
    for (const auto& s : stats) {
      nlohmann::json p = {{"name", s.name},
                          {"key_bits_per_value", s.key_bits},
                          {"value_bits_per_value", s.value_bits},
                          {"measured_bits_per_value", s.bits_per_value()},
                          {"kv_bytes", s.kv_bytes},
                          {"kv_bytes_at_tokens", s.kv_tokens},
                          {"ppl", s.ppl()},
                          {"delta_ppl_percent", 100 * (s.ppl() / base.ppl() - 1)},
                          {"kl_mean", s.kl_mean()},
                          {"kl_p99", s.kl_p99()},
                          {"top1_agreement", double(s.agree) / double(std::max<int64_t>(s.scored, 1))},
                          {"prefill_tokens_per_s", double(s.prefill_tokens) / std::max(s.prefill_s, 1e-9)},
                          {"decode_tokens_per_s", s.decode_tokens ? double(s.decode_tokens) / std::max(s.decode_s, 1e-9) : 0.0}};
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
    if (!(std::ofstream(opt.json) << j.dump(2) << "\n")) return die("cannot write --json file '" + opt.json + "'");
  }

  if (!opt.plot.empty()) {
    const std::string dat = opt.plot + ".dat", gp = opt.plot + ".gp";
    {
      std::ofstream d(dat);
      for (const auto& s : stats)
        d << s.name << " " << s.bits_per_value() << " " << std::max(s.kl_mean(), 1e-7) << " "
          << 100 * (s.ppl() / base.ppl() - 1) << "\n";
      std::ofstream g(gp);
      g << "set terminal pngcairo size 1200,500 font ',10' noenhanced\nset output '" << opt.plot << "'\n"
        << "set multiplot layout 1,2 title '" << model_name << ": KV-cache policies, chunk " << opt.chunk << "'\n"
        << "set xlabel 'bits per value (measured, metadata included)'\nset grid\n"
        << "set logscale y\nset ylabel 'mean KL(fp32 || policy), nats/token (0 drawn at 1e-7)'\n"
        << "plot '" << dat << "' using 2:3 with points pt 7 notitle, '' using 2:3:1 with labels offset char 0,1 notitle\n"
        << "unset logscale y\nset ylabel 'perplexity change, %'\n"
        << "plot '" << dat << "' using 2:4 with points pt 7 notitle, '' using 2:4:1 with labels offset char 0,1 notitle\n"
        << "unset multiplot\n";
    }
    if (std::system(("gnuplot '" + gp + "'").c_str()) != 0) return die("gnuplot failed on " + gp);
    std::remove(dat.c_str());
    std::remove(gp.c_str());
  }
  if (offload_mismatch) return die("an offload policy's logits differ from its twin's without offload (see the table)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // libgomp's default busy-waiting collapses throughput (10x measured) when another process shares
  // the cores; passive waiting costs little on an idle machine. It is read at start-up only, so
  // re-execute once with it set.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
  }
  return run(argc, argv);
}
