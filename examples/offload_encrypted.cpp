// What it shows: a cache larger than the memory you give it. Offload<DeviceTier, FileTier,
// Prefetch<1>> aims at `resident_budget_bytes` of compressed blocks in memory (a target: the
// layer being attended and the one prefetched stay pinned above it) and moves older full blocks
// to a file, each sealed with an AEAD (AES-256-GCM with AES-NI, else
// XChaCha20-Poly1305) under a per-cache key that never leaves RAM; attend() brings them back,
// prefetching the next layer in the background. The attention output is bit-identical to the
// same cache kept fully in memory, which the program checks. Needs libsodium (kvpack::offload).
// Run it:  cmake --build build/gcc-release --target kvpack-example-offload && build/gcc-release/examples/kvpack-example-offload
#include <kvpack/kvpack.hpp>
#include <kvpack/offload.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace ko = kvpack::offload;
using Codecs = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>, kvpack::Values<kvpack::Int4<kvpack::Group<32>>>,
                               kvpack::Blocks<32>>;
using Offloaded = kvpack::KVCache<kvpack::Keys<kvpack::Int4<kvpack::Group<32>>>, kvpack::Values<kvpack::Int4<kvpack::Group<32>>>,
                                  kvpack::Blocks<32>, ko::Offload<ko::DeviceTier, ko::FileTier, ko::Prefetch<1>>>;

constexpr kvpack::ModelShape kShape{.layers = 8, .q_heads = 8, .kv_heads = 2, .head_dim = 64, .max_tokens = 2048};

/// Runs 1024 tokens in chunks of 64 through `cache` (every layer appends, then attends) and
/// returns the last chunk's attention output of every layer.
template <class Cache>
kvpack::Result<std::vector<float>> run(Cache& cache) {
  constexpr int n = 64, kv = n * kShape.kv_heads * kShape.head_dim;
  std::vector<float> k(static_cast<size_t>(kv)), v(k.size()), q(k.size() * 4), out(q.size()), last;
  std::vector<std::int32_t> pos(static_cast<size_t>(n));
  for (std::int32_t t0 = 0; t0 < 1024; t0 += n) {
    for (int i = 0; i < n; ++i) pos[size_t(i)] = t0 + i;
    for (int i = 0; i < kv; ++i) k[size_t(i)] = std::sin(0.3f * float(t0 * 97 + i)), v[size_t(i)] = std::cos(0.7f * float(t0 + i));
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.01f * float(i));
    for (int l = 0; l < kShape.layers; ++l) {
      if (auto s = cache.append(l, k, v, pos); !s) return s.error();
      if (auto s = cache.attend(l, q, out); !s) return s.error();  // offloaded blocks are fetched here
      if (t0 + n == 1024) last.insert(last.end(), out.begin(), out.end());
    }
  }
  return last;
}

int main() {
  ko::OffloadOptions opt;
  opt.resident_budget_bytes = 64 << 10;  // 64 KiB of blocks in memory; the whole cache is ~1.4 MiB
  opt.file.directory = "";               // $TMPDIR or /tmp; the file is unlinked as soon as it is created
  auto off = Offloaded::create(kShape, opt);
  auto mem = Codecs::create(kShape);
  if (!off || !mem) return std::fprintf(stderr, "create: %s\n", (!off ? off.error() : mem.error()).message.c_str()), 1;
  auto a = run(*off);
  auto b = run(*mem);
  if (!a || !b) return std::fprintf(stderr, "run: %s\n", (!a ? a.error() : b.error()).message.c_str()), 1;
  if (auto s = off->offload().flush(); !s) return std::fprintf(stderr, "flush: %s\n", s.error().message.c_str()), 1;
  const auto m = off->offload().metrics();
  const bool same = a->size() == b->size() && std::memcmp(a->data(), b->data(), a->size() * sizeof(float)) == 0;
  std::printf("resident %llu B of %zu B total; %llu B sealed with %s written to the file, %llu B read back in %llu "
              "fetches (p50 %.1f us), prefetch hit rate %.0f %%; output %s the in-memory cache's\n",
              static_cast<unsigned long long>(m.resident_bytes), mem->memory_bytes(),
              static_cast<unsigned long long>(m.store.bytes_written), ko::to_string(ko::best_available_aead()),
              static_cast<unsigned long long>(m.store.bytes_read),
              static_cast<unsigned long long>(m.store.fetches), m.store.fetch_p50_us, 100 * m.store.prefetch_hit_rate,
              same ? "is bit-identical to" : "DIFFERS from");
  return same ? 0 : 1;
}
