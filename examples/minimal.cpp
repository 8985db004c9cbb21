// What it shows: the smallest complete use of kvpack for one sequence. A model with 4 layers
// runs a 100-token prompt in one prefill chunk, then decodes 20 tokens one at a time; every
// layer appends its new K/V to the cache and reads attention back through it. Your engine
// supplies the real q/k/v (here: fixed patterns) and does the rest of the layer.
// Run it:  cmake --build build/gcc-release --target kvpack-example-minimal && build/gcc-release/examples/kvpack-example-minimal
#include <kvpack/kvpack.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

using Cache = kvpack::KVCache<kvpack::Keys<kvpack::Int8<kvpack::Group<32>>>,   // INT8 keys, scale per 32
                              kvpack::Values<kvpack::Int4<kvpack::Group<32>>>,  // INT4 values
                              kvpack::Sinks<4>>;                                 // first 4 tokens fp32

int main() {
  const kvpack::ModelShape shape{.layers = 4, .q_heads = 8, .kv_heads = 2, .head_dim = 64, .max_tokens = 512};
  auto cache = Cache::create(shape);
  if (!cache) return std::fprintf(stderr, "create: %s\n", cache.error().message.c_str()), 1;

  // One forward pass over `n` new tokens starting at position `p0`: q [n][q_heads][head_dim],
  // k and v [n][kv_heads][head_dim], out like q. The chunk attends to itself exactly.
  auto step = [&](std::int32_t p0, int n) -> kvpack::Status {
    const auto kv = static_cast<std::size_t>(n * shape.kv_heads * shape.head_dim);
    std::vector<float> k(kv), v(kv), q(kv * 4), out(q.size());  // 8 / 2 query heads per KV head
    std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = p0 + i;
    for (std::size_t i = 0; i < kv; ++i) k[i] = std::sin(0.1f * float(i + std::size_t(p0))), v[i] = std::cos(0.05f * float(i));
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.01f * float(i % 64);
    for (int layer = 0; layer < shape.layers; ++layer) {
      if (auto s = cache->append(layer, k, v, pos); !s) return s;
      if (auto s = cache->attend(layer, q, out); !s) return s;  // out: the attention output
    }
    return {};
  };

  if (auto s = step(0, 100); !s) return std::fprintf(stderr, "prefill: %s\n", s.error().message.c_str()), 1;
  for (std::int32_t t = 100; t < 120; ++t)
    if (auto s = step(t, 1); !s) return std::fprintf(stderr, "decode: %s\n", s.error().message.c_str()), 1;

  const double fp32_bytes = 2.0 * 4 * double(shape.layers * shape.kv_heads * shape.head_dim) * double(cache->tokens(0));
  std::printf("%lld tokens per layer, %zu bytes (fp32 K/V would be %.0f: %.1fx smaller)\n",
              static_cast<long long>(cache->tokens(0)), cache->memory_bytes(), fp32_bytes,
              fp32_bytes / double(cache->memory_bytes()));
  return 0;
}
