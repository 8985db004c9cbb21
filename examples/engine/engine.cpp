// kvpack-engine: a small continuous-batching serving loop over the SmolLM2 runner, with every
// request's KV cache in ONE kvpack page pool (PagedCache through the runtime registry).
//
// Shows what a serving engine does with kvpack: a system prompt (WikiText-2 text) prefilled once
// and shared by every request through fork (copy-on-write pages); requests joining and leaving
// mid-run; one batched decode step per iteration (the dense layers on all rows at once, the
// attention in one attend_batch call over the executor); one request doing parallel sampling
// through fork; one doing speculative decoding (a draft on a cheaper policy proposes tokens, the
// target verifies them in one chunk, rejected ones are rolled back with truncate); one request
// preempted by swapping (its pages moved out of the pool to an encrypted file tier, or host
// memory without libsodium, and brought back a few iterations later). Then it
// checks itself: every request replayed alone on a fresh single-sequence cache of the same
// policy, each rollback against a sequence that never received the rejected tokens, and the
// shared prefix's pages unchanged by the forks.
//
//   cmake --preset gcc-release && cmake --build build/gcc-release --target kvpack-engine
//   build/gcc-release/tools/kvpack-engine --model "$(bash tools/fetch_model.sh)" --json engine.json
//
// Prints one line per iteration and the JSON summary (examples/engine/README.md lists its fields).
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "llama/tokenizer.hpp"
#include "serving.hpp"
#if defined(KVPACK_HAS_SODIUM)
#include <kvpack/offload/pool_swap_target.hpp>
#endif

namespace {

using namespace engine;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model, text = KVPACK_ENGINE_DEFAULT_TEXT, policy = "int4-g32", draft_policy = "int4-g64", json;
  int prefix = 384, requests = 10, prompt = 24, max_new = 24, samples = 3, draft = 4, threads = 2, pool_mb = 256;
  int preempt_for = 4;  // iterations request 3 spends swapped out (0: no preemption)
};

// One live sequence of the engine: a request, or one branch of the parallel-sampling request.
struct Live {
  int request = 0, branch = 0;
  RequestSpec spec;
  SeqId seq, draft_seq;
  bool speculative = false, done = false;
  int swapped_until = -1;         // swapped out (preempted) until this iteration
  int32_t pos = 0;                // position of the next token to feed
  std::vector<int32_t> out;       // generated tokens; out.back() is fed next
  std::mt19937_64 rng;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void die(const std::string& what, const kvpack::Error& e) {
  std::fprintf(stderr, "kvpack-engine: %s: %s\n", what.c_str(), e.message.c_str());
  std::exit(1);
}
template <class T>
T take(kvpack::Result<T> r, const std::string& what) {
  if (!r) die(what, r.error());
  return std::move(r.value());
}
void check(const Status& s, const std::string& what) {
  if (!s) die(what, s.error());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kvpack-engine: continuous batching over one kvpack page pool (SmolLM2 runner)"};
  app.add_option("--model", o.model, "GGUF model (bash tools/fetch_model.sh prints its path)")->required();
  app.add_option("--text", o.text, "text for the shared prefix and the requests' prompts")->capture_default_str();
  app.add_option("--policy", o.policy, "registry name of the pool's policy")->capture_default_str();
  app.add_option("--draft-policy", o.draft_policy, "registry name of the draft's policy")->capture_default_str();
  app.add_option("--prefix", o.prefix, "shared system-prompt tokens")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--requests", o.requests, "requests (>= 3)")->capture_default_str()->check(CLI::Range(3, 64));
  app.add_option("--prompt", o.prompt, "own prompt tokens per request")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--max-new", o.max_new, "tokens generated per request (the first request gets this, later ones up to 2x)")
      ->capture_default_str()->check(CLI::Range(2, 4096));
  app.add_option("--samples", o.samples, "branches of the parallel-sampling request")->capture_default_str()->check(CLI::Range(2, 16));
  app.add_option("--draft", o.draft, "draft tokens per speculative step")->capture_default_str()->check(CLI::Range(1, 16));
  app.add_option("--threads", o.threads, "executor threads for the batched attention")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--pool-mb", o.pool_mb, "page pool budget, MiB")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--preempt-for", o.preempt_for, "iterations request 3 stays swapped out (0: none)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--json", o.json, "write the JSON summary here");
  CLI11_PARSE(app, argc, argv);
  // The speculative request rolls back with truncate and the prefix is shared through the prefix
  // cache: neither exists for an evicting pool, so say so now rather than mid-run.
  for (const kvpack::registry::PolicyInfo& p : kvpack::registry::policies())
    if (p.evicts && (p.name == o.policy || p.name == o.draft_policy))
      return std::fprintf(stderr, "kvpack-engine: %s evicts tokens; this engine needs truncate and the prefix cache, "
                                  "which an evicting pool does not offer: choose a policy without eviction\n",
                          p.name.c_str()), 2;

  auto file = take(kl::GgufFile::open(o.model), "model");
  auto model = take(kl::Model::from_gguf(file, o.model), "model");
  model.batch_invariant = true;  // a request decodes in a batch exactly as alone (llama/model.hpp linear())
  const auto tok = take(kl::Tokenizer::from_gguf(file), "tokenizer");
  std::ifstream in(o.text, std::ios::binary);
  if (!in) return std::fprintf(stderr, "kvpack-engine: cannot read %s\n", o.text.c_str()), 1;
  const std::vector<int32_t> ids = tok.encode(std::string(std::istreambuf_iterator<char>(in), {}));
  const std::size_t need = std::size_t(o.prefix) + std::size_t(o.requests) * std::size_t(o.prompt);
  if (ids.size() < need)
    return std::fprintf(stderr, "kvpack-engine: %s has %zu tokens, need %zu\n", o.text.c_str(), ids.size(), need), 1;
  const std::span<const int32_t> prefix(ids.data(), std::size_t(o.prefix));

  // The requests: #1 samples in `samples` branches, #2 decodes speculatively, the rest greedily;
  // the first six arrive at once, the others join every second iteration; lengths differ, so
  // requests leave at different iterations.
  std::vector<RequestSpec> reqs(std::size_t(o.requests));
  std::vector<int> arrive(reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const auto at = ids.begin() + o.prefix + std::ptrdiff_t(i) * o.prompt;
    reqs[i].prompt.assign(at, at + o.prompt);
    reqs[i].max_new = o.max_new + int(i % 3) * o.max_new / 2;
    arrive[i] = i < 6 ? 0 : 2 * int(i - 5);
  }
  const int max_len = o.prefix + o.prompt + 2 * o.max_new + o.draft + 1;
  const kvpack::ModelShape shape = model.cache_shape(max_len);
  kvpack::PoolConfig cfg{.shape = shape, .byte_budget = std::size_t(o.pool_mb) << 20,
                         .max_sequences = o.requests + o.samples + 4, .max_rollback_tokens = o.draft};
  auto pool = take(kvpack::registry::make_pool(o.policy, cfg), "pool " + o.policy);
  auto draft_pool = take(kvpack::registry::make_pool(o.draft_policy, cfg), "draft pool " + o.draft_policy);
  const kvpack::Executor exec = kvpack::thread_executor(o.threads);
  std::vector<kvpack::Workspace> workspaces(std::size_t(o.threads));
  kvpack::Workspace& ws = workspaces[0];
  kl::RowMat logits;
  auto row = [&](Eigen::Index r) { return std::span<const float>(logits.row(r).data(), std::size_t(logits.cols())); };

  // The shared prefix: prefilled once per pool; every request forks from it.
  const auto t_start = Clock::now();
  const SeqId root = take(pool->create_sequence(), "root");
  const SeqId draft_root = take(draft_pool->create_sequence(), "draft root");
  check(model.forward(SeqCache{*pool, root, ws}, prefix, 0, o.prefix, logits), "prefix");
  check(model.forward(SeqCache{*draft_pool, draft_root, ws}, prefix, 0, o.prefix, logits), "draft prefix");
  const Snapshot root_before = take(snapshot(*pool, root), "snapshot");
  const double prefill_s = seconds_since(t_start);

  // Swap space for preemption: an encrypted file tier (OffloadStore, ephemeral key) or host memory.
#if defined(KVPACK_HAS_SODIUM)
  kvpack::offload::StoreConfig swap_cfg;
  swap_cfg.layout = kvpack::offload::swap_layout_for(*pool);
  swap_cfg.file = kvpack::offload::FileTier{};
  swap_cfg.resident_budget_bytes = 0;
  auto swap_store = take(kvpack::offload::OffloadStore::create(swap_cfg), "swap store");
  kvpack::offload::StoreSwapTarget swap_space(*swap_store);
  const char* swap_tier = "encrypted file (OffloadStore FileTier)";
#else
  kvpack::HostSwapTarget swap_space;
  const char* swap_tier = "host memory (HostSwapTarget)";
#endif
  std::size_t swap_pages = 0;
  bool swap_identical = false;
  std::optional<Snapshot> before_swap;

  std::vector<Live> live;
  int rollback_checks = 0, rollback_ok = 0, spec_steps = 0, drafted = 0, accepted = 0, peak_live = 0;
  kvpack::PoolStats peak{};
  std::size_t peak_if_unshared = 0;
  const auto t_loop = Clock::now();
  for (int step = 0;; ++step) {
    // Admissions: fork the shared prefix, prefill the request's prompt.
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (arrive[i] != step) continue;
      Live r;
      r.request = int(i);
      r.spec = reqs[i];
      r.speculative = i == 2;
      r.spec.sample = i == 1;
      r.seq = take(pool->fork(root), "fork");
      check(model.forward(SeqCache{*pool, r.seq, ws}, r.spec.prompt, o.prefix, o.prompt - 1, logits), "prompt");
      r.pos = o.prefix + o.prompt;
      if (r.speculative) {
        r.draft_seq = take(draft_pool->fork(draft_root), "draft fork");
        kl::RowMat unused;
        check(model.forward(SeqCache{*draft_pool, r.draft_seq, ws}, r.spec.prompt, o.prefix, o.prompt, unused), "draft prompt");
      }
      const int branches = r.spec.sample ? o.samples : 1;
      for (int b = 0; b < branches; ++b) {
        Live br = r;
        br.branch = b;
        br.spec.seed = 1000 + std::uint64_t(b);
        br.rng.seed(br.spec.seed);
        if (b > 0) br.seq = take(pool->fork(r.seq), "sampling fork");
        br.out.push_back(pick_token(row(0), br.spec.sample ? &br.rng : nullptr));
        live.push_back(std::move(br));
      }
    }
    // Preemption: request 3 leaves the pool two iterations after it joined and comes back
    // preempt_for iterations later (vLLM's swap preemption), its pages in swap space meanwhile.
    for (Live& r : live) {
      if (r.request != 3 || r.done || o.preempt_for == 0) continue;
      if (step == arrive[3] + 2) {
        before_swap = take(snapshot(*pool, r.seq), "snapshot");
        swap_pages = take(pool->swap_out(r.seq, swap_space), "swap out");
        r.swapped_until = step + o.preempt_for;
      } else if (step == r.swapped_until) {
        take(pool->swap_in(r.seq), "swap in");
        swap_identical = take(snapshot(*pool, r.seq), "snapshot") == *before_swap;
        r.swapped_until = -1;
      }
    }
    std::vector<std::size_t> batch;
    int running = 0;
    for (std::size_t i = 0; i < live.size(); ++i)
      if (!live[i].done) {
        ++running;
        if (!live[i].speculative && live[i].swapped_until < 0) batch.push_back(i);
      }
    if (running == 0 && step > arrive.back()) break;
    if (running > peak_live) {
      peak_live = running;
      peak = pool->stats();
      peak_if_unshared = 0;
      for (const auto& s : peak.sequences)
        if (!(s.id == root)) peak_if_unshared += s.pages * peak.page_bytes;
    }

    // One batched decode step for every plain request and sampling branch.
    if (!batch.empty()) {
      std::vector<SeqId> seqs;
      std::vector<int32_t> toks, pos;
      for (std::size_t i : batch) seqs.push_back(live[i].seq), toks.push_back(live[i].out.back()), pos.push_back(live[i].pos);
      check(model.forward_at(BatchCache{*pool, seqs, exec, workspaces}, toks, pos, 0, logits), "batched decode");
      for (std::size_t b = 0; b < batch.size(); ++b) {
        Live& r = live[batch[b]];
        ++r.pos;
        r.out.push_back(pick_token(row(Eigen::Index(b)), r.spec.sample ? &r.rng : nullptr));
      }
    }

    // One speculative step: draft `draft` tokens, verify them in one target chunk, roll back.
    for (Live& r : live) {
      if (r.done || !r.speculative) continue;
      const int32_t p = r.pos;
      std::vector<int32_t> d{r.out.back()};
      for (int j = 0; j < o.draft; ++j) {
        check(model.forward(SeqCache{*draft_pool, r.draft_seq, ws}, std::span<const int32_t>(&d.back(), 1), p + j, 0, logits), "draft");
        d.push_back(pick_token(row(0), nullptr));
      }
      const SeqId twin = take(pool->fork(r.seq), "twin fork");  // the state before the verify chunk
      ChunkKv kv;
      check(model.forward(SeqCache{*pool, r.seq, ws}, d, p, 0, logits, kv.tap()), "verify");
      int m = 0;
      while (m < o.draft && pick_token(row(m), nullptr) == d[std::size_t(m) + 1]) ++m;
      const int32_t next = pick_token(row(m), nullptr);
      ++spec_steps, drafted += o.draft, accepted += m;
      check(pool->truncate(r.seq, p + m + 1), "truncate");  // drop the rejected draft tokens
      if (m < o.draft) {
        check(draft_pool->truncate(r.draft_seq, p + m + 1), "draft truncate");
        // Rollback check: the twin receives only the accepted tokens' K/V (captured above);
        // it must hold the same codes and give the same next logits as the rolled-back sequence.
        check(append_rows(*pool, twin, kv, m + 1, p), "twin append");
        bool same = take(snapshot(*pool, r.seq), "snapshot") == take(snapshot(*pool, twin), "snapshot");
        const SeqId probe = take(pool->fork(r.seq), "probe fork");
        kl::RowMat a, b;
        check(model.forward(SeqCache{*pool, probe, ws}, std::span<const int32_t>(&next, 1), p + m + 1, 0, a), "probe");
        check(model.forward(SeqCache{*pool, twin, ws}, std::span<const int32_t>(&next, 1), p + m + 1, 0, b), "twin probe");
        same = same && a.size() == b.size() && std::memcmp(a.data(), b.data(), std::size_t(a.size()) * sizeof(float)) == 0;
        check(pool->free_sequence(probe), "free");
        ++rollback_checks, rollback_ok += same;
      } else {
        check(model.forward(SeqCache{*draft_pool, r.draft_seq, ws}, std::span<const int32_t>(&d.back(), 1), p + o.draft, 1, logits),
              "draft catch-up");
      }
      check(pool->free_sequence(twin), "free");
      r.spec.chunks.push_back(m + 1);
      r.out.insert(r.out.end(), d.begin() + 1, d.begin() + 1 + m);
      r.out.push_back(next);
      r.pos = p + m + 1;
    }

    // Leaving: a request with all its tokens frees its sequences (their pages go back or lose a reference).
    int left = 0;
    for (Live& r : live) {
      if (r.done || int(r.out.size()) < r.spec.max_new) continue;
      r.done = true, ++left;  // a speculative request may hold a few tokens past max_new: they count
      check(pool->free_sequence(r.seq), "free");
      if (r.speculative) check(draft_pool->free_sequence(r.draft_seq), "free");
    }
    std::printf("iteration %3d: %2d running, batch %2d, %d left, pool %zu/%zu pages\n", step, running, int(batch.size()), left,
                pool->stats().pages_used, pool->stats().pages_total);
  }
  const double loop_s = seconds_since(t_loop);
  std::size_t generated = 0;
  for (const Live& r : live) generated += r.out.size();

  // Checks: the shared prefix untouched, every request equal to its solo run.
  const bool root_unchanged = take(snapshot(*pool, root), "snapshot") == root_before;
  bool identical = true, branches_differ = false;
  const auto t_solo = Clock::now();
  nlohmann::json per_request = nlohmann::json::array();
  for (const Live& r : live) {
    const auto solo = take(run_solo(model, *pool, shape, prefix, r.spec, r.out), "solo run");
    const std::size_t n = std::size_t(r.spec.max_new);
    const bool same = solo.size() >= n && r.out.size() >= n && std::equal(solo.begin(), solo.begin() + std::ptrdiff_t(n), r.out.begin());
    identical = identical && same;
    if (r.branch > 0 && r.out != live[std::size_t(&r - live.data()) - std::size_t(r.branch)].out) branches_differ = true;
    per_request.push_back({{"request", r.request}, {"branch", r.branch},
                           {"kind", r.speculative ? "speculative" : r.spec.sample ? "sample" : "greedy"},
                           {"joined_at", arrive[std::size_t(r.request)]}, {"tokens", r.out.size()}, {"identical_to_solo", same},
                           {"text", tok.decode(r.out)}});
  }
  const double solo_s = seconds_since(t_solo);

  nlohmann::json j = {
      {"policy", o.policy}, {"draft_policy", o.draft_policy}, {"sequences", live.size()},
      {"peak_concurrent_sequences", peak_live}, {"shared_prefix_tokens", o.prefix},
      {"pool_bytes", peak.bytes_used}, {"pool_bytes_if_unshared", peak_if_unshared},
      {"pool_exact_bytes", peak.exact_bytes}, {"page_bytes", peak.page_bytes},
      {"identical_to_solo", identical},
      {"rollback_identical", rollback_checks > 0 && rollback_ok == rollback_checks}, {"rollback_checks", rollback_checks},
      {"fork_isolated", root_unchanged && branches_differ},
      {"swap", {{"request", 3}, {"pages", swap_pages}, {"iterations_out", o.preempt_for}, {"tier", swap_tier},
                {"identical", swap_identical}}},
      {"speculative", {{"steps", spec_steps}, {"drafted", drafted}, {"accepted", accepted}}},
      {"generated_tokens", generated}, {"prefix_prefill_s", prefill_s}, {"serving_s", loop_s},
      {"tokens_per_s", double(generated) / loop_s}, {"solo_tokens_per_s", double(generated) / solo_s},
      {"requests", per_request}};
  std::printf("%s\n", j.dump(2).c_str());
  if (!o.json.empty()) {
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  const bool swap_ok = o.preempt_for == 0 || o.requests < 4 || swap_identical;
  return identical && root_unchanged && branches_differ && rollback_ok == rollback_checks && swap_ok ? 0 : 3;
}
