// The llama.cpp peer: ggml's CPU flash attention (GGML_OP_FLASH_ATTN_EXT, the op llama.cpp runs
// with -fa) decoding one token over one layer of K/V stored as f16, q8_0 or q4_0 (llama.cpp's
// --cache-type-k/-v), at kvpack's benchmark shapes and context lengths, in the same process as
// kvpack's cases (built only with -DKVPACK_BENCH_LLAMACPP=ON, see bench/peers/CMakeLists.txt).
//
// Names: decode-seq/llamacpp-<type>/ggml/<shape>/<ctx>/workers:<T>: one sequence computed by a
// ggml threadpool of T threads (ggml splits the KV range over them), beside kvpack's split-K rows
// decode-seq/<config>/<backend>/... (bench_splitk.cpp). Same K/V data as kvpack (fill_kv), same
// query; Q is fp32 (llama.cpp converts it to the K type inside the op), no mask, scale 1/sqrt(D).
// Bytes per token = the K and V tensors (ggml_nbytes), what the op reads.
#include <ggml-cpu.h>
#include <ggml.h>

#include "../bench_common.hpp"

namespace kvpack_bench {
namespace {

/// One layer's K/V in a ggml context and the decode graph over it, plus the threadpool.
struct GgmlDecode {
  ggml_context* ctx = nullptr;
  ggml_cgraph* graph = nullptr;
  ggml_tensor* q = nullptr;
  ggml_tensor* out = nullptr;
  ggml_threadpool* pool = nullptr;
  ggml_cplan plan{};
  std::vector<std::uint8_t> work;
  double kv_bytes = 0;
  GgmlDecode() = default;
  GgmlDecode(const GgmlDecode&) = delete;
  GgmlDecode& operator=(const GgmlDecode&) = delete;
  ~GgmlDecode() {
    if (pool) ggml_threadpool_free(pool);
    if (ctx) ggml_free(ctx);
  }

  static std::unique_ptr<GgmlDecode> build(const BenchShape& s, std::int64_t n_kv, ggml_type type, int threads) {
    auto g = std::make_unique<GgmlDecode>();
    const std::int64_t D = s.head_dim;
    const std::size_t kv_tensor = ggml_row_size(type, D) * static_cast<std::size_t>(n_kv * s.kv_heads);
    const std::size_t mem = 2 * kv_tensor + static_cast<std::size_t>(2 * D * s.q_heads) * sizeof(float) +
                            16 * ggml_tensor_overhead() + ggml_graph_overhead() + (1 << 20);
    ggml_init_params ip{mem, nullptr, false};
    g->ctx = ggml_init(ip);
    if (!g->ctx) return nullptr;
    ggml_tensor* k = ggml_new_tensor_3d(g->ctx, type, D, n_kv, s.kv_heads);
    ggml_tensor* v = ggml_new_tensor_3d(g->ctx, type, D, n_kv, s.kv_heads);
    g->q = ggml_new_tensor_3d(g->ctx, GGML_TYPE_F32, D, 1, s.q_heads);
    // K/V: kvpack's [t][h][d] rows -> ggml's [h][t][d] (ne0 = D fastest), converted per row.
    std::vector<float> kf, vf, row(static_cast<std::size_t>(D));
    const std::size_t rb = ggml_row_size(type, D);
    for (std::int64_t t0 = 0; t0 < n_kv; t0 += 512) {
      const std::int64_t n = std::min<std::int64_t>(512, n_kv - t0);
      fill_kv(s, t0, n, kf, vf);
      for (std::int64_t t = 0; t < n; ++t)
        for (int h = 0; h < s.kv_heads; ++h) {
          const std::size_t src = (static_cast<std::size_t>(t) * s.kv_heads + h) * static_cast<std::size_t>(D);
          const std::size_t dst = (static_cast<std::size_t>(h) * n_kv + static_cast<std::size_t>(t0 + t)) * rb;
          for (auto [x, tensor] : {std::pair{&kf, k}, std::pair{&vf, v}}) {
            auto* to = static_cast<std::uint8_t*>(tensor->data) + dst;
            if (type == GGML_TYPE_F16) ggml_fp32_to_fp16_row(x->data() + src, reinterpret_cast<ggml_fp16_t*>(to), D);
            else ggml_quantize_chunk(type, x->data() + src, to, 0, 1, D, nullptr);
          }
        }
    }
    const std::vector<float> qv = make_queries(s, 1);
    std::copy(qv.begin(), qv.end(), static_cast<float*>(g->q->data));
    g->out = ggml_flash_attn_ext(g->ctx, g->q, k, v, nullptr, 1.f / std::sqrt(static_cast<float>(D)), 0.f, 0.f);
    g->graph = ggml_new_graph(g->ctx);
    ggml_build_forward_expand(g->graph, g->out);
    ggml_threadpool_params tp = ggml_threadpool_params_default(threads);
    g->pool = ggml_threadpool_new(&tp);
    g->plan = ggml_graph_plan(g->graph, threads, g->pool);
    g->work.resize(g->plan.work_size + 64);
    g->plan.work_data = g->work.data();
    g->kv_bytes = static_cast<double>(ggml_nbytes(k) + ggml_nbytes(v));
    return g;
  }

  bool run() { return ggml_graph_compute(graph, &plan) == GGML_STATUS_SUCCESS; }
};

void decode_ggml(benchmark::State& st, BenchShape s, std::int64_t ctx, ggml_type type, int workers,
                 std::string prefix) {
  auto* g = Fixtures::instance().get<GgmlDecode>(prefix, 0, [&] { return GgmlDecode::build(s, ctx, type, workers); });
  if (g == nullptr || !g->run()) {
    st.SkipWithError("ggml graph build or compute failed");
    return;
  }
  const float* o = static_cast<const float*>(g->out->data);
  if (!std::all_of(o, o + s.q_heads * s.head_dim, [](float x) { return std::isfinite(x); })) {
    st.SkipWithError("ggml produced non-finite output");
    return;
  }
  for (auto _ : st) {
    const bool ok = g->run();
    benchmark::DoNotOptimize(ok);
    benchmark::ClobberMemory();
  }
  set_decode_counters(st, g->kv_bytes, workers);
}

}  // namespace

void register_llamacpp_benchmarks() {
  ggml_cpu_init();
  const std::pair<ggml_type, const char*> types[] = {
      {GGML_TYPE_F16, "f16"}, {GGML_TYPE_Q8_0, "q8_0"}, {GGML_TYPE_Q4_0, "q4_0"}};
  for (const std::int64_t ctx : decode_contexts())
    for (const BenchShape& s : kShapes)
      for (int workers : thread_counts())
        for (auto [type, label] : types) {
          const std::string name = std::string("decode-seq/llamacpp-") + label + "/ggml/" + s.name + "/" +
                                   std::to_string(ctx) + "/workers:" + std::to_string(workers);
          benchmark::RegisterBenchmark(name.c_str(), decode_ggml, s, ctx, type, workers, name)
              ->UseRealTime()
              ->MinTime(0.15)
              ->Unit(benchmark::kMicrosecond);
        }
}

}  // namespace kvpack_bench
