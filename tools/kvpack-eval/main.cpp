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
//
// Files (one concern each): cli.hpp (options), options.hpp (run options, helpers),
// evaluator.hpp (running the model on a policy's cache), scoring.hpp (one window, one policy),
// needle.hpp (passkey retrieval), report.hpp and plot.hpp (Markdown, JSON, PNG), kv_dump.hpp
// (--dump-kv), profile.hpp and plan.hpp (per-layer planning), policy_dispatch.hpp/.cpp and
// policy_shard.cpp (a policy by name, its instantiations spread over several translation units).
// This file: loading the model and the text, and the order of the work.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "cli.hpp"
#include "plan.hpp"
#include "plot.hpp"
#include "report.hpp"

namespace kvpack_eval {

int run(int argc, char** argv) {
  Options opt;
  CliArgs args;
  CLI::App app{"kvpack-eval: quality, memory and speed of KV-cache compression policies on a real model"};
  define_cli(app, opt, args);
  CLI11_PARSE(app, argc, argv);

  if (args.list) {
    for (const auto& n : kl::policy_names(!kAllPolicies)) std::printf("%s\n", n.c_str());
    return 0;
  }
  if (!opt.dump_tokens.empty() && opt.text.empty()) return die("--dump-tokens needs --text");
  std::vector<std::string> names;
  if (args.policies.empty()) {
    names = kl::policy_names(true);
  } else {
    std::stringstream ss(args.policies);
    for (std::string p; std::getline(ss, p, ',');) {
      const auto group = kl::policy_group(p);  // a group name (equal-memory) expands to its policies
      if (!group.empty()) names.insert(names.end(), group.begin(), group.end());
      else if (!p.empty()) names.push_back(p);
    }
  }
  for (const auto& n : names)
    if (!kl::has_policy(n)) {
      std::string known;
      for (const auto& k : kl::policy_names(false)) known += (known.empty() ? "" : ", ") + k;
      return die("unknown policy '" + n + "' (known: " + known + ")");
    }
  for (const auto& n : names)
    if (auto s = require_compiled(n); !s) return die(s.error().message);
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
    return die("model file '" + opt.model + "' not found (run tools/fetch_model.sh, or pass --model)");
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
    if (opt.ctx > cfg.context && !opt.beyond_context)
      return die("--ctx " + std::to_string(opt.ctx) + " exceeds the model's trained context of " +
                 std::to_string(cfg.context) + " tokens (--beyond-trained-context allows it)");
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
    if (!opt.dump_tokens.empty()) {  // the exact ids, for peers run outside kvpack (bench/peers/kvpress_eval.py)
      std::ofstream f(opt.dump_tokens);
      f << "{\"model\": \"" << std::filesystem::path(opt.model).filename().string() << "\", \"text\": \"" << source
        << "\", \"ctx\": " << opt.ctx << ", \"first_window\": " << opt.first_window
        << ", \"first_row\": " << opt.ctx / 2 << ", \"windows\": [";
      for (size_t w = 0; w < windows.size(); ++w) {
        f << (w ? ",\n  [" : "\n  [");
        for (size_t i = 0; i < windows[w].tokens.size(); ++i) f << (i ? "," : "") << windows[w].tokens[i];
        f << "]";
      }
      f << "]}\n";
      if (!f) return die("cannot write --dump-tokens file '" + opt.dump_tokens + "'");
      std::fprintf(stderr, "kvpack-eval: wrote %zu windows of %lld tokens to %s\n", windows.size(),
                   static_cast<long long>(opt.ctx), opt.dump_tokens.c_str());
      if (args.policies.empty()) return 0;
    }
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
    if (fpath.empty()) {  // WikiText-2 test from the shared data beside the project, else its in-repo head, else --text
      for (const char* p : {"../shared/data/wikitext-2-raw/wiki.test.raw", KVPACK_EVAL_DATA_DIR "/wikitext2_test_head.raw"})
        if (fpath.empty() && std::filesystem::exists(p)) fpath = p;
      if (fpath.empty()) fpath = opt.text;
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
  Progress prog(total, opt.progress);
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
      auto s = score_policy(ev, names[p], stats[p], windows[w], p == 0, w == 0, prog, d);
      if (!s) return die(names[p] + ": " + s.error().message);
    }
  if (auto s = run_needles(ev, needles, names, stats, prog); !s) return die(s.error().message);
  prog.finish();
  if (!opt.dump_kv.empty())
    if (auto s = dump.write(opt.dump_kv, windows[0].tokens, cfg, model_name); !s) return die(s.error().message);

  RunInfo info{model_name, source, filler_name, windows.size(),
               opt.text.empty() ? static_cast<int64_t>(windows[0].tokens.size()) : opt.ctx, {}};
  if (opt.text.empty()) info.passage = tok->decode(std::span(windows[0].tokens).subspan(gen_prompt.size()));
  bool offload_mismatch = false;
  const std::string md = markdown_report(stats, needles, opt, info, offload_mismatch);
  std::cout << md << std::flush;
  if (!opt.markdown.empty() && !(std::ofstream(opt.markdown) << md))
    return die("cannot write --markdown file '" + opt.markdown + "'");
  if (!opt.json.empty() && !(std::ofstream(opt.json) << json_report(stats, opt, info).dump(2) << "\n"))
    return die("cannot write --json file '" + opt.json + "'");
  if (!opt.plot.empty())
    if (auto s = write_plot(stats, opt, model_name); !s) return die(s.error().message);
  if (offload_mismatch) return die("an offload policy's logits differ from its twin's without offload (see the table)");
  return 0;
}

}  // namespace kvpack_eval

int main(int argc, char** argv) {
  // libgomp's default busy-waiting collapses throughput (10x measured) when another process shares
  // the cores; passive waiting costs little on an idle machine. It is read at start-up only, so
  // re-execute once with it set.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
  }
  return kvpack_eval::run(argc, argv);
}
