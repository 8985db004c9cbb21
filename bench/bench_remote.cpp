// Shared remote tier (issue 19): what a 2048-token prefix costs on the wire and in time when it
// is fetched from Redis instead of recomputed.
//
//   remote_fetch_2k/<codec>   fresh cache + RemotePrefixShare::import of a published 2048-token
//                             prefix (SmolLM2-135M shape: 30 layers, 3 KV heads, head_dim 64,
//                             64-token pages) from a redis-server on a unix socket started here.
//                             Counters: wire bytes per token (values + keys, both directions) vs
//                             fp16 K/V bytes per token, values fetched, batch p50/p99.
//   remote_recompute_2k       the same prefix run through the real model (int4-g32 cache, one
//                             prefill chunk): the time a fetch replaces. Needs KVPACK_MODEL_PATH
//                             and WikiText-2 ($KVPACK_WIKITEXT_PATH or ../shared/data); skipped
//                             otherwise.
// Run: ./bench_remote --benchmark_format=json (needs redis-server on PATH or $KVPACK_REDIS_SERVER).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kvpack/kvpack.hpp>
#include <kvpack/offload/crypto.hpp>
#include <kvpack/offload/remote_prefix.hpp>

#include "remote/redis_server_process.hpp"
#include "remote/synthetic_prefix.hpp"
#if defined(KVPACK_BENCH_REMOTE_MODEL)
#include "llama/model.hpp"
#include "llama/tokenizer.hpp"
#endif

namespace {

namespace ko = kvpack::offload;
constexpr int64_t kRemoteBenchTokens = 2048;

kvpack::ModelShape smollm2_shape() {
  kvpack::ModelShape s;
  s.layers = 30;
  s.q_heads = 9;
  s.kv_heads = 3;
  s.head_dim = 64;
  s.max_tokens = kRemoteBenchTokens + 64;
  return s;
}

// One server for the whole run (started on first use, stopped at exit).
kvpack_remote_test::RedisServerProcess* bench_server() {
  static std::optional<kvpack_remote_test::RedisServerProcess> srv = kvpack_remote_test::RedisServerProcess::start({});
  return srv ? &*srv : nullptr;
}

template <class Cache>
void remote_fetch_2k(benchmark::State& state) {
  auto* srv = bench_server();
  if (!srv) {
    state.SkipWithError("redis-server could not be started");
    return;
  }
  ko::RemoteConfig cfg;
  cfg.url = srv->url();
  cfg.command_timeout = std::chrono::milliseconds(5000);
  auto tier = ko::RemoteTier::create(cfg).value();
  std::array<std::byte, 32> k{};
  k[0] = std::byte{1};
  const auto key = ko::StaticKeyProvider::create(k).value();
  const auto prompt = kvpack_remote_test::synth_prompt(static_cast<int>(kRemoteBenchTokens), 42);
  Cache a = Cache::create(smollm2_shape()).value();
  if (!kvpack_remote_test::synth_append(a, prompt, 0, kRemoteBenchTokens)) {
    state.SkipWithError("append failed");
    return;
  }
  auto share = ko::RemotePrefixShare<Cache>::create(a, *tier, key, "bench-model").value();
  const auto rep = share.publish(a, prompt);
  if (rep.stored != rep.values) {
    state.SkipWithError("publish incomplete");
    return;
  }
  const auto s0 = tier->stats();
  int64_t imported = 0;
  for (auto _ : state) {
    Cache b = Cache::create(smollm2_shape()).value();
    auto got = share.import(b, prompt);
    imported = got ? *got : -1;
    benchmark::DoNotOptimize(imported);
  }
  if (imported != kRemoteBenchTokens) state.SkipWithError("import incomplete");
  const auto s = tier->stats();
  const double iters = static_cast<double>(state.iterations());
  const auto sh = smollm2_shape();
  const double fp16_per_token = static_cast<double>(sh.layers) * sh.kv_heads * sh.head_dim * 2 * 2;
  const double wire_per_token =
      static_cast<double>((s.bytes_in - s0.bytes_in) + (s.bytes_out - s0.bytes_out)) / iters / kRemoteBenchTokens;
  state.counters["wire_B/tok"] = wire_per_token;
  state.counters["fp16_B/tok"] = fp16_per_token;
  state.counters["wire/fp16"] = wire_per_token / fp16_per_token;
  state.counters["values"] = static_cast<double>(s.hits - s0.hits) / iters;
  state.counters["value_B"] = static_cast<double>(share.value_bytes());
  state.counters["batch_p50_us"] = s.fetch_p50_us;
  state.counters["batch_p99_us"] = s.fetch_p99_us;
}

using Int4Cache = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>, kvpack::Values<kvpack::Int4<kvpack::Group<32>>>>;
using Int8Cache = kvpack::KVCache<kvpack::Keys<kvpack::Int8<kvpack::Group<32>>>, kvpack::Values<kvpack::Int8<kvpack::Group<32>>>>;
using Fp16Cache = kvpack::KVCache<kvpack::Keys<kvpack::Fp16>, kvpack::Values<kvpack::Fp16>>;

void remote_recompute_2k(benchmark::State& state) {
#if defined(KVPACK_BENCH_REMOTE_MODEL)
  const char* mp = std::getenv("KVPACK_MODEL_PATH");
  std::string tp = std::getenv("KVPACK_WIKITEXT_PATH") ? std::getenv("KVPACK_WIKITEXT_PATH")
                                                         : std::string(KVPACK_SOURCE_DIR) + "/../shared/data/wikitext-2-raw/wiki.test.raw";
  if (!mp || !std::filesystem::exists(mp) || !std::filesystem::exists(tp)) {
    state.SkipWithError("needs KVPACK_MODEL_PATH and WikiText-2");
    return;
  }
  auto file = kvpack::llama::GgufFile::open(mp);
  auto model = kvpack::llama::Model::from_gguf(*file, mp);
  auto tok = kvpack::llama::Tokenizer::from_gguf(*file);
  if (!model || !tok) {
    state.SkipWithError("model could not be loaded");
    return;
  }
  std::ifstream in(tp, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto ids = tok->encode(text);
  ids.resize(static_cast<std::size_t>(kRemoteBenchTokens));
  kvpack::llama::RowMat logits;
  for (auto _ : state) {
    Int4Cache c = Int4Cache::create(model->cache_shape(kRemoteBenchTokens + 64)).value();
    if (!model->forward(c, ids, 0, kRemoteBenchTokens, logits)) state.SkipWithError("forward failed");
  }
#else
  state.SkipWithError("built without the model runner");
#endif
}

}  // namespace

BENCHMARK_TEMPLATE(remote_fetch_2k, Int4Cache)->Name("remote_fetch_2k/int4-g32")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_TEMPLATE(remote_fetch_2k, Int8Cache)->Name("remote_fetch_2k/int8-g32")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_TEMPLATE(remote_fetch_2k, Fp16Cache)->Name("remote_fetch_2k/fp16")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK(remote_recompute_2k)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
