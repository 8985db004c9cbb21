// Shared pieces of kvpack's benchmark suite: the configurations under test (codecs x backends),
// model shapes, deterministic K/V data, prebuilt caches reused across Google Benchmark trials,
// the plain fp32/fp16 baseline (an engine without kvpack) and the roofline counters.
//
// Adding a case dimension is one line:
//  * a cache configuration (codec, eviction policy, ...): one X(...) line in KVPACK_BENCH_CONFIGS;
//  * a kernel backend: one X(...) line in KVPACK_BENCH_BACKENDS (the tag must exist in kvpack).
// Every configuration runs on every backend, shape, context length and thread count.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "bandwidth_probe.hpp"
#include "kvpack/kvpack.hpp"

// ---- The configurations under test: X(identifier, "table name", KVCache policies...) ----------
// Backend<...> is appended per backend. Defaults: Blocks<64>, no sinks, no residual window.
#define KVPACK_BENCH_CONFIGS(X)                                                                          \
  X(fp32, "fp32", kvpack::Keys<kvpack::Fp32>, kvpack::Values<kvpack::Fp32>)                              \
  X(fp16, "fp16", kvpack::Keys<kvpack::Fp16>, kvpack::Values<kvpack::Fp16>)                              \
  X(int8, "int8", kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int8<>>)                          \
  X(int4_g32, "int4-g32", kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>,                                 \
    kvpack::Values<kvpack::Int4<kvpack::Group<32>>>)                                                     \
  X(int4_g64, "int4-g64", kvpack::Keys<kvpack::Int4<kvpack::Group<64>>>,                                 \
    kvpack::Values<kvpack::Int4<kvpack::Group<64>>>)                                                     \
  X(k8v4, "k8v4", kvpack::Keys<kvpack::Int8<>>, kvpack::Values<kvpack::Int4<>>)                          \
  X(kivi4, "kivi4", kvpack::Keys<kvpack::Int4<kvpack::Group<32>>, kvpack::PerChannel>,                   \
    kvpack::Values<kvpack::Int4<kvpack::Group<32>>>, kvpack::Residual<128>)                              \
  X(fp8_e4m3, "fp8-e4m3", kvpack::Keys<kvpack::Fp8E4M3<>>, kvpack::Values<kvpack::Fp8E4M3<>>)          \
  /* keys before RoPE (PreRope<>): the kernel rotates queries and dequantized keys; fp32 tiles */      \
  X(int4_pre, "int4-g32-pre", kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>,                             \
    kvpack::Values<kvpack::Int4<kvpack::Group<32>>>, kvpack::PreRope<>)                                  \
  /* eviction at a 1024-token budget (25 % of a 4k context): decode reads only what is held; */        \
  /* h2o also pays its bookkeeping (attention mass gathered by the kernel) in every decode step */     \
  X(int4_sw1k, "int4-g32+sink-window-1k", kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>,   \
    kvpack::SinkWindow<4, 1020>)                                                                         \
  X(int4_h2o1k, "int4-g32+h2o-1k", kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>,          \
    kvpack::H2O<512, 508, 4>)                                                                            \
  /* block-sparse: 16 live 64-token blocks (masked blocks skipped unread); snapkv: 992 + 32 window */     \
  X(int4_bs1k, "int4-g32+block-sparse-1k", kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>, \
    kvpack::BlockSparse<kvpack::Tokens<1024>>)                                                           \
  X(int4_snap1k, "int4-g32+snapkv-1k", kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>,      \
    kvpack::SnapKV<992>)

// ---- Kernel backends: X(kvpack tag, "table name") --------------------------------------------
// Later: X(kvpack::Cuda, "cuda").
// The SIMD backend the build targets runs beside the scalar kernel (the specification).
#if KVPACK_HAS_AVX2
#define KVPACK_BENCH_BACKENDS(X) X(kvpack::Scalar, "scalar") X(kvpack::Avx2, "avx2")
#elif KVPACK_HAS_NEON
#define KVPACK_BENCH_BACKENDS(X) X(kvpack::Scalar, "scalar") X(kvpack::Neon, "neon")
#else
#define KVPACK_BENCH_BACKENDS(X) X(kvpack::Scalar, "scalar")
#endif

namespace kvpack_bench {

template <class... Ts>
struct TypeList {};

/// One configuration: its table name and its cache type for backend tag B.
#define KVPACK_BENCH_DEFINE_CONFIG(id, label, ...)                  \
  struct cfg_##id {                                                 \
    static constexpr const char* name = label;                     \
    template <class B>                                              \
    using cache = kvpack::KVCache<__VA_ARGS__, kvpack::Backend<B>>; \
  };
KVPACK_BENCH_CONFIGS(KVPACK_BENCH_DEFINE_CONFIG)
#undef KVPACK_BENCH_DEFINE_CONFIG

#define KVPACK_BENCH_LIST_CONFIG(id, ...) , cfg_##id
template <class Dummy, class... Cs>
struct drop_first {
  using type = TypeList<Cs...>;
};
/// Every configuration of KVPACK_BENCH_CONFIGS, in order.
using Configs = drop_first<void KVPACK_BENCH_CONFIGS(KVPACK_BENCH_LIST_CONFIG)>::type;
#undef KVPACK_BENCH_LIST_CONFIG

/// One backend: its kvpack tag and table name.
template <class Tag>
struct BackendInfo;
#define KVPACK_BENCH_DEFINE_BACKEND(tag_, label) \
  template <>                                    \
  struct BackendInfo<tag_> {                     \
    using tag = tag_;                            \
    static constexpr const char* name = label;   \
  };
KVPACK_BENCH_BACKENDS(KVPACK_BENCH_DEFINE_BACKEND)
#undef KVPACK_BENCH_DEFINE_BACKEND
#define KVPACK_BENCH_LIST_BACKEND(tag_, label) , BackendInfo<tag_>
/// Every backend of KVPACK_BENCH_BACKENDS, in order.
using Backends = drop_first<void KVPACK_BENCH_BACKENDS(KVPACK_BENCH_LIST_BACKEND)>::type;
#undef KVPACK_BENCH_LIST_BACKEND

/// Calls f.template operator()<T>() for every T of a TypeList.
template <class... Ts, class F>
void for_each_type(TypeList<Ts...>, F&& f) {
  (f.template operator()<Ts>(), ...);
}

// ---- Model shapes -------------------------------------------------------------------------------

/// Attention shape of one layer. Every case benchmarks ONE layer (layers = 1); a model's per-token
/// decode time is this times its layer count (30 for SmolLM2-135M, 32 for an 8B model).
struct BenchShape {
  const char* name;
  int q_heads;
  int kv_heads;
  int head_dim;
};
inline constexpr BenchShape kSmolLM2{"smollm2-135m", 9, 3, 64};  // GQA group 3
inline constexpr BenchShape kEightB{"8b-class", 32, 8, 128};     // GQA group 4 (Llama-3-8B-like)
inline constexpr BenchShape kShapes[] = {kSmolLM2, kEightB};

/// Thread counts every case runs with: 1 and all cores (one entry if the machine has one core).
[[nodiscard]] inline std::vector<int> thread_counts() {
  const int all = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return all > 1 ? std::vector<int>{1, all} : std::vector<int>{1};
}

/// Comma-separated integers from environment variable `var`, or `fallback` when unset/empty.
[[nodiscard]] inline std::vector<int> env_ints(const char* var, std::vector<int> fallback) {
  const char* s = std::getenv(var);
  if (s == nullptr || *s == '\0') return fallback;
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(std::stoi(item));
  return out.empty() ? fallback : out;
}

// ---- Deterministic K/V data ---------------------------------------------------------------------

[[nodiscard]] inline std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Fills k and v with tokens [first, first + n) of a fixed pseudo-random sequence,
/// [n][kv_heads][head_dim] row-major: uniform in [-1, 1), with one key channel in 16 scaled by 8
/// (the outlier channels that motivate per-channel keys). Same data for every codec.
inline void fill_kv(const BenchShape& s, std::int64_t first, std::int64_t n, std::vector<float>& k,
                    std::vector<float>& v) {
  const std::size_t row = static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.head_dim);
  k.resize(static_cast<std::size_t>(n) * row);
  v.resize(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    const std::uint64_t idx = static_cast<std::uint64_t>(first) * row + i;
    const std::uint64_t r = splitmix64(idx);
    const auto u1 = static_cast<float>(static_cast<std::uint32_t>(r)) * 0x1p-31f - 1.f;
    const auto u2 = static_cast<float>(static_cast<std::uint32_t>(r >> 32)) * 0x1p-31f - 1.f;
    const bool outlier = (i % static_cast<std::size_t>(s.head_dim)) % 16 == 5;
    k[i] = outlier ? 8.f * u1 : u1;
    v[i] = u2;
  }
}

/// n_q query tokens, [n_q][q_heads][head_dim], uniform in [-1, 1).
[[nodiscard]] inline std::vector<float> make_queries(const BenchShape& s, int n_q) {
  std::vector<float> q(static_cast<std::size_t>(n_q) * static_cast<std::size_t>(s.q_heads) *
                       static_cast<std::size_t>(s.head_dim));
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = static_cast<float>(static_cast<std::uint32_t>(splitmix64(i ^ 0xABCDEFull))) * 0x1p-31f - 1.f;
  return q;
}

[[nodiscard]] inline std::vector<std::int32_t> iota_positions(std::int64_t first, std::int64_t n) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(first + i);
  return p;
}

/// A one-layer cache holding `ctx` tokens, the last `last_chunk` of them appended as one chunk
/// (1 for decode: the current token; 512 for a prefill chunk). Earlier tokens go in chunks of 512.
/// Returns an error message in `err` (and nullptr) if kvpack refuses.
template <class Cache>
[[nodiscard]] std::unique_ptr<Cache> build_cache(const BenchShape& s, std::int64_t ctx, std::int64_t last_chunk,
                                                 std::string& err) {
  auto made = Cache::create(kvpack::ModelShape{.layers = 1, .q_heads = s.q_heads, .kv_heads = s.kv_heads,
                                               .head_dim = s.head_dim, .max_tokens = ctx});
  if (!made) {
    err = made.error().message;
    return nullptr;
  }
  auto cache = std::make_unique<Cache>(std::move(made).value());
  std::vector<float> k, v;
  std::int64_t t = 0;
  const std::int64_t body = ctx - last_chunk;
  while (t < ctx) {
    const std::int64_t n = t < body ? std::min<std::int64_t>(512, body - t) : last_chunk;
    fill_kv(s, t, n, k, v);
    if (auto st = cache->append(0, k, v, iota_positions(t, n)); !st) {
      err = st.error().message;
      return nullptr;
    }
    t += n;
    // SnapKV scores the prompt with the queries attend saw and refuses to compress a prompt never
    // attended: before the decode token, attend the prompt's last (up to 32) tokens, as an engine's
    // prefill does. Other caches are left as appended.
    if constexpr (requires { cache->compress_prompt(0); })
      if (t == body && last_chunk == 1 && n > 0) {
        const std::vector<float> q = make_queries(s, static_cast<int>(std::min<std::int64_t>(n, 32)));
        std::vector<float> out(q.size());
        if (auto st = cache->attend(0, q, out); !st) {
          err = st.error().message;
          return nullptr;
        }
      }
  }
  return cache;
}

[[nodiscard]] inline bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); });
}

// ---- Fixtures reused across Google Benchmark trials --------------------------------------------

/// Google Benchmark calls a benchmark function several times (growing iteration counts); building
/// a 32k-token cache each time would dominate the run. Fixtures are built once per (case, thread)
/// and kept until a case with a different key prefix asks, which frees the previous ones (so at
/// most one case's caches are alive). Thread-safe; each benchmark thread gets its own object
/// (kvpack caches are not thread-safe: one cache per thread, like one layer per thread).
class Fixtures {
 public:
  template <class T>
  T* get(const std::string& prefix, int thread, const std::function<std::unique_ptr<T>()>& make) {
    const std::string key = prefix + "#" + std::to_string(thread);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (prefix != prefix_) {
        items_.clear();
        prefix_ = prefix;
      }
      if (auto it = items_.find(key); it != items_.end()) return static_cast<T*>(it->second.get());
    }
    std::shared_ptr<T> made = make();  // built outside the lock: threads build in parallel
    if (!made) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    items_[key] = made;
    return made.get();
  }
  static Fixtures& instance() {
    static Fixtures f;
    return f;
  }

 private:
  std::mutex mu_;
  std::string prefix_;
  std::map<std::string, std::shared_ptr<void>> items_;
};

// ---- Baseline: the engine without kvpack --------------------------------------------------------

[[nodiscard]] inline float half_to_float(std::uint16_t h) noexcept {
#if defined(__F16C__)
  return _cvtsh_ss(h);  // what an engine built for this CPU uses
#else
  return kvpack::fp16_to_float(h);
#endif
}

/// An uncompressed cache written the straightforward way: K and V as [tokens][kv_heads][head_dim]
/// arrays of float (fp32) or IEEE half bits (fp16), and attention as plain loops, query head by
/// query head (no GQA sharing, two-pass softmax over a score buffer). This is what kvpack's
/// figures are divided by.
template <class T>
struct PlainCache {
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t tokens = 0;
  std::vector<T> k, v;
  std::vector<float> scores;

  [[nodiscard]] static std::unique_ptr<PlainCache> build(const BenchShape& s, std::int64_t ctx) {
    auto c = std::make_unique<PlainCache>();
    c->q_heads = s.q_heads;
    c->kv_heads = s.kv_heads;
    c->head_dim = s.head_dim;
    c->tokens = ctx;
    const std::size_t row = static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(s.head_dim);
    c->k.resize(static_cast<std::size_t>(ctx) * row);
    c->v.resize(c->k.size());
    c->scores.resize(static_cast<std::size_t>(ctx));
    std::vector<float> k, v;
    for (std::int64_t t = 0; t < ctx; t += 512) {
      const std::int64_t n = std::min<std::int64_t>(512, ctx - t);
      fill_kv(s, t, n, k, v);
      for (std::size_t i = 0; i < k.size(); ++i) {
        const std::size_t at = static_cast<std::size_t>(t) * row + i;
        if constexpr (std::is_same_v<T, float>) {
          c->k[at] = k[i];
          c->v[at] = v[i];
        } else {
          c->k[at] = kvpack::fp16_from_float(k[i]);
          c->v[at] = kvpack::fp16_from_float(v[i]);
        }
      }
    }
    return c;
  }

  [[nodiscard]] static float load(T x) noexcept {
    if constexpr (std::is_same_v<T, float>) return x;
    else return half_to_float(x);
  }

  /// Bytes of K and V held (what one decode step reads).
  [[nodiscard]] std::size_t bytes() const noexcept { return (k.size() + v.size()) * sizeof(T); }

  /// Causal attention of the last n_q tokens (queries [n_q][q_heads][head_dim]) over all tokens;
  /// query i sits at index tokens - n_q + i and sees tokens [0, tokens - n_q + i]. n_q = 1 is decode.
  void attend(const float* q, float* out, int n_q = 1) {
    const int D = head_dim;
    const int group = q_heads / kv_heads;
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    const std::size_t row = static_cast<std::size_t>(kv_heads) * static_cast<std::size_t>(D);
    const std::size_t qrow = static_cast<std::size_t>(q_heads) * static_cast<std::size_t>(D);
    for (int i = 0; i < n_q; ++i) {
      const std::int64_t visible = tokens - n_q + i + 1;
      for (int h = 0; h < q_heads; ++h) {
        const std::size_t hoff = static_cast<std::size_t>(h / group) * static_cast<std::size_t>(D);
        const float* qh = q + static_cast<std::size_t>(i) * qrow + static_cast<std::size_t>(h) * static_cast<std::size_t>(D);
        float mx = -std::numeric_limits<float>::infinity();
        for (std::int64_t t = 0; t < visible; ++t) {
          const T* kt = k.data() + static_cast<std::size_t>(t) * row + hoff;
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += qh[d] * load(kt[d]);
          scores[static_cast<std::size_t>(t)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        float sum = 0.f;
        for (std::int64_t t = 0; t < visible; ++t) {
          const float p = std::exp(scores[static_cast<std::size_t>(t)] - mx);
          scores[static_cast<std::size_t>(t)] = p;
          sum += p;
        }
        float* o = out + static_cast<std::size_t>(i) * qrow + static_cast<std::size_t>(h) * static_cast<std::size_t>(D);
        std::fill_n(o, D, 0.f);
        for (std::int64_t t = 0; t < visible; ++t) {
          const T* vt = v.data() + static_cast<std::size_t>(t) * row + hoff;
          const float p = scores[static_cast<std::size_t>(t)];
          for (int d = 0; d < D; ++d) o[d] += p * load(vt[d]);
        }
        for (int d = 0; d < D; ++d) o[d] /= sum;
      }
    }
  }
};

// ---- Counters -----------------------------------------------------------------------------------

/// Roofline counters of a decode case. `bytes` = bytes of KV one decode step of one layer reads
/// (kvpack: memory_bytes() of the layer; baseline: its K and V arrays). With T benchmark threads
/// each thread decodes its own layer; rates are summed over threads and divided by wall time.
///  * kv_bytes     bytes per decoded token per layer
///  * GB/s         achieved bytes / s (all threads), 1 GB = 1e9 bytes
///  * roofline     GB/s divided by the same-process probe at the same thread count
///  * tok/s        decoded tokens per second through one layer (all threads together)
///  * probe_GB/s   the probe figure used
///  * workers      threads that worked on one sequence (split-K / ggml rows; else the bench threads)
inline void set_decode_counters(benchmark::State& st, double bytes, int workers = 0) {
  const int probe_threads = workers > 0 ? workers : st.threads();
  const double probe = read_bandwidth(probe_threads).gbps * 1e9;
  const auto iters = static_cast<double>(st.iterations());
  using C = benchmark::Counter;
  st.counters["kv_bytes"] = C(bytes, C::kAvgThreads);
  st.counters["GB/s"] = C(bytes * iters / 1e9, C::kIsRate);
  st.counters["roofline"] = C(bytes * iters / probe, C::kIsRate);
  st.counters["tok/s"] = C(iters, C::kIsRate);
  st.counters["probe_GB/s"] = C(probe / 1e9, C::kAvgThreads);
  if (workers > 0) st.counters["workers"] = C(workers, C::kAvgThreads);
}

/// Decode context lengths: KVPACK_BENCH_CONTEXTS (default 1024,4096,32768).
[[nodiscard]] inline std::vector<int> decode_contexts() { return env_ints("KVPACK_BENCH_CONTEXTS", {1024, 4096, 32768}); }

/// Registration hooks of the suite's translation units, called from main in this order.
void register_memory_benchmarks();
void register_append_benchmarks();
void register_attention_benchmarks();
void register_splitk_benchmarks();
void register_pool_benchmarks();    // bench_pool.cpp: batched decode on the page pool
void register_llamacpp_benchmarks();  // only with KVPACK_BENCH_HAS_LLAMACPP (bench/peers/)

}  // namespace kvpack_bench
