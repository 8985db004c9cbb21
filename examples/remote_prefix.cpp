// kvpack-remote-prefix: one side of two-process prefix sharing through a Redis/Valkey server
// (include/kvpack/offload/remote_prefix.hpp), on the real model. Driven by
// examples/remote_prefix_sharing.sh.
//
//   publish  prefill the first --tokens tokens of the text in one chunk, publish the prefix's
//            pages, decode the next token; write its logits to --logits
//   import   fresh cache: import the prefix's pages from the server, run only the tokens not
//            imported through the model, decode the next token; write its logits to --logits
//
// Prints one line of facts: tokens imported, prefix tokens run through the model (counted at the
// cache: every token the model appends passes through CountingCache), times, tier counters.
// The shared secret comes from $KVPACK_REMOTE_KEY (64 hex digits), the server password (if any)
// from $KVPACK_REMOTE_PASSWORD.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <kvpack/kvpack.hpp>
#include <kvpack/offload/crypto.hpp>
#include <kvpack/offload/remote_prefix.hpp>

#include "llama/model.hpp"
#include "llama/tokenizer.hpp"

namespace {

namespace kl = kvpack::llama;
namespace ko = kvpack::offload;
using Cache = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>, kvpack::Values<kvpack::Int4<kvpack::Group<32>>>>;

// Forwards the model's cache calls and counts the tokens the model runs through it.
struct CountingCache {
  Cache& cache;
  int64_t appended = 0;  // tokens appended to layer 0 = tokens run through the model
  kvpack::Status append(int layer, std::span<const float> k, std::span<const float> v, std::span<const int32_t> pos) {
    if (layer == 0) appended += static_cast<int64_t>(pos.size());
    return cache.append(layer, k, v, pos);
  }
  kvpack::Status attend(int layer, std::span<const float> q, std::span<float> out) { return cache.attend(layer, q, out); }
};

int usage() {
  std::fprintf(stderr,
               "usage: kvpack-remote-prefix publish|import --model GGUF --text FILE --url URL --logits OUT "
               "[--tokens 2048]\n");
  return 2;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  std::string model_path, text_path, url, logits_path;
  int64_t n_prefix = 2048;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model_path = v;
    else if (a == "--text") text_path = v;
    else if (a == "--url") url = v;
    else if (a == "--logits") logits_path = v;
    else if (a == "--tokens") n_prefix = std::stoll(v);
    else return usage();
  }
  if ((mode != "publish" && mode != "import") || model_path.empty() || text_path.empty() || url.empty() ||
      logits_path.empty() || n_prefix <= 0)
    return usage();

  auto file = kl::GgufFile::open(model_path);
  if (!file) return std::fprintf(stderr, "%s\n", file.error().message.c_str()), 1;
  auto model = kl::Model::from_gguf(*file, model_path);
  if (!model) return std::fprintf(stderr, "%s\n", model.error().message.c_str()), 1;
  auto tok = kl::Tokenizer::from_gguf(*file);
  if (!tok) return std::fprintf(stderr, "%s\n", tok.error().message.c_str()), 1;
  std::ifstream in(text_path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = tok->encode(text);
  if (static_cast<int64_t>(ids.size()) <= n_prefix)
    return std::fprintf(stderr, "text has %zu tokens, need more than %lld\n", ids.size(), static_cast<long long>(n_prefix)), 1;
  const std::span<const int32_t> prefix(ids.data(), static_cast<std::size_t>(n_prefix));
  const int32_t next = ids[static_cast<std::size_t>(n_prefix)];

  ko::RemoteConfig cfg;
  cfg.url = url;
  cfg.command_timeout = std::chrono::milliseconds(2000);
  auto tier = ko::RemoteTier::create(cfg);
  if (!tier) return std::fprintf(stderr, "%s\n", tier.error().message.c_str()), 1;
  auto cache = Cache::create(model->cache_shape(n_prefix + 64));
  if (!cache) return std::fprintf(stderr, "%s\n", cache.error().message.c_str()), 1;
  const std::string model_id = std::filesystem::path(model_path).filename().string() + ":" +
                               std::to_string(std::filesystem::file_size(model_path));
  auto share = ko::RemotePrefixShare<Cache>::create(*cache, **tier, ko::EnvKeyProvider("KVPACK_REMOTE_KEY"), model_id);
  if (!share) return std::fprintf(stderr, "%s\n", share.error().message.c_str()), 1;

  CountingCache counted{*cache};
  kl::RowMat logits;
  int64_t imported = 0;
  double import_ms = 0, prefill_ms = 0, publish_ms = 0;
  if (mode == "import") {
    const auto t0 = std::chrono::steady_clock::now();
    auto got = share->import(*cache, prefix);
    import_ms = ms_since(t0);
    if (!got) return std::fprintf(stderr, "%s\n", got.error().message.c_str()), 1;
    imported = *got;
  }
  if (imported < n_prefix) {  // what the tier did not have: run it through the model
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = model->forward(counted, prefix.subspan(static_cast<std::size_t>(imported)), static_cast<int32_t>(imported),
                                n_prefix - imported, logits);
        !s)
      return std::fprintf(stderr, "%s\n", s.error().message.c_str()), 1;
    prefill_ms = ms_since(t0);
  }
  const int64_t prefix_run = counted.appended;
  ko::PrefixPublishReport rep;
  if (mode == "publish") {
    const auto t0 = std::chrono::steady_clock::now();
    rep = share->publish(*cache, prefix);
    publish_ms = ms_since(t0);
  }
  if (auto s = model->forward(counted, std::span<const int32_t>(&next, 1), static_cast<int32_t>(n_prefix), 0, logits); !s)
    return std::fprintf(stderr, "%s\n", s.error().message.c_str()), 1;
  std::ofstream out(logits_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) return std::fprintf(stderr, "cannot write %s\n", logits_path.c_str()), 1;

  const auto st = (*tier)->stats();
  const double fp16_bytes = static_cast<double>(n_prefix) * model->cfg.layers * model->cfg.kv_heads * model->cfg.head_dim * 2 * 2;
  std::printf("mode=%s prefix_tokens=%lld imported=%lld prefix_tokens_run_through_model=%lld model_tokens_total=%lld "
              "import_ms=%.1f prefill_ms=%.1f publish_ms=%.1f published=%llu/%llu value_bytes=%zu wire_bytes=%llu "
              "fp16_bytes=%.0f wire_vs_fp16=%.3f\nstats: %s\n",
              mode.c_str(), static_cast<long long>(n_prefix), static_cast<long long>(imported),
              static_cast<long long>(prefix_run), static_cast<long long>(counted.appended), import_ms, prefill_ms,
              publish_ms, static_cast<unsigned long long>(rep.stored), static_cast<unsigned long long>(rep.values),
              share->value_bytes(), static_cast<unsigned long long>(mode == "import" ? st.bytes_in + st.bytes_out : st.bytes_out),
              fp16_bytes, static_cast<double>(mode == "import" ? st.bytes_in : st.bytes_out) / fp16_bytes, st.summary().c_str());
  return 0;
}
