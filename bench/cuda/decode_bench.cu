// CUDA decode benchmark: split-K flash-decoding over a kvpack cache of 32k tokens (32 query heads,
// 8 KV heads, head_dim 128, one decode query), INT4 and INT8, against the same run's
// device-to-device cudaMemcpy bandwidth. Prints a short Markdown table.
//
//   bench_cuda_decode_bench [--tokens N] [--iters N] [--no-check]
//
// Bandwidth of a decode = bytes of K and V codes + metadata it must read (every KV head, every
// token; positions are not read) / time per decode (CUDA events around `iters` back-to-back
// decodes, after warm-up). Copy bandwidth = 2 x bytes / time of a 1 GiB cudaMemcpyAsync
// (read + write), the usual roofline for a memory-bound kernel. The cache is filled by the device
// quantizer (DeviceCache::append; its rate is printed too). Unless --no-check, the output is
// compared with the CPU scalar kernel over the downloaded blocks (max relative error printed).
// Exit code 77 without a CUDA device, 1 on any CUDA or kvpack error or a check above 1e-5.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvpack/kernels/cuda/device_cache.cuh"
#include "kvpack/kvpack.hpp"
#include "kvpack/kernels/scalar/attention.hpp"

namespace {

using namespace kvpack;  // NOLINT: benchmark file

#define BENCH_CUDA(call)                                                                        \
  do {                                                                                          \
    const cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #call); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

constexpr int kQHeads = 32, kKvHeads = 8, kHeadDim = 128;

/// Deterministic pseudo-normal fill (sum of uniforms), with an outlier channel 7 (x8).
__global__ void fill_kernel(float* x, std::int64_t n, std::uint32_t seed, int D) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    float s = 0.f;
    for (int r = 0; r < 4; ++r) {
      h ^= h >> 15;
      h *= 2246822519u;
      h ^= h >> 13;
      s += static_cast<float>(h & 0xFFFFu) / 65535.f;
    }
    const float v = (s - 2.f) * 1.7320508f;  // mean 0, variance 1
    x[i] = (i % D == 7) ? 8.f * v : v;
  }
}
__global__ void iota_kernel(std::int32_t* p, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::int32_t>(i);
}

struct Row {
  std::string name;
  double bits_per_value = 0, bytes = 0, us = 0, gbs = 0, append_mtok = 0, err = -1;
  int splits = 0;
};

/// Device-to-device copy bandwidth (read + write bytes per second) of a 1 GiB buffer.
double copy_bandwidth(int iters) {
  const std::size_t bytes = std::size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  BENCH_CUDA(cudaMalloc(&src, bytes));
  BENCH_CUDA(cudaMalloc(&dst, bytes));
  BENCH_CUDA(cudaMemset(src, 1, bytes));
  cudaEvent_t t0, t1;
  BENCH_CUDA(cudaEventCreate(&t0));
  BENCH_CUDA(cudaEventCreate(&t1));
  for (int i = 0; i < 3; ++i) BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  BENCH_CUDA(cudaEventRecord(t0));
  for (int i = 0; i < iters; ++i) BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  BENCH_CUDA(cudaEventRecord(t1));
  BENCH_CUDA(cudaEventSynchronize(t1));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, t0, t1));
  BENCH_CUDA(cudaEventDestroy(t0));
  BENCH_CUDA(cudaEventDestroy(t1));
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) * iters / (ms * 1e-3);
}

template <class KC, class VC>
Row run(const char* name, int tokens, int iters, bool check) {
  using Cache = KVCache<Keys<KC>, Values<VC>>;
  Row r;
  r.name = name;
  r.bits_per_value = (Cache::key_bits_per_value + Cache::value_bits_per_value) / 2;
  const ModelShape shape{1, kQHeads, kKvHeads, kHeadDim, tokens, 0.f};
  auto dev = cuda::DeviceCache<Cache>::create(shape);
  if (!dev) {
    std::fprintf(stderr, "%s: %s\n", name, dev.error().message.c_str());
    std::exit(1);
  }
  const std::int64_t row = kKvHeads * kHeadDim;
  const int chunk = std::min(tokens, 4096);
  float *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
  std::int32_t* pos = nullptr;
  BENCH_CUDA(cudaMalloc(&k, static_cast<std::size_t>(chunk * row) * sizeof(float)));
  BENCH_CUDA(cudaMalloc(&v, static_cast<std::size_t>(chunk * row) * sizeof(float)));
  BENCH_CUDA(cudaMalloc(&pos, static_cast<std::size_t>(tokens) * sizeof(std::int32_t)));
  BENCH_CUDA(cudaMalloc(&q, kQHeads * kHeadDim * sizeof(float)));
  BENCH_CUDA(cudaMalloc(&out, kQHeads * kHeadDim * sizeof(float)));
  iota_kernel<<<256, 256>>>(pos, tokens);
  fill_kernel<<<1, 256>>>(q, kQHeads * kHeadDim, 99u, kHeadDim);
  BENCH_CUDA(cudaGetLastError());
  cudaEvent_t t0, t1;
  BENCH_CUDA(cudaEventCreate(&t0));
  BENCH_CUDA(cudaEventCreate(&t1));
  float append_ms = 0;
  for (int done = 0; done < tokens; done += chunk) {
    const int m = std::min(chunk, tokens - done);
    fill_kernel<<<512, 256>>>(k, m * row, 1000u + static_cast<std::uint32_t>(done), kHeadDim);
    fill_kernel<<<512, 256>>>(v, m * row, 5000u + static_cast<std::uint32_t>(done), kHeadDim);
    BENCH_CUDA(cudaGetLastError());
    BENCH_CUDA(cudaEventRecord(t0));
    const Status s = dev->append(0, k, v, pos + done, m);
    BENCH_CUDA(cudaEventRecord(t1));
    BENCH_CUDA(cudaEventSynchronize(t1));
    if (!s) {
      std::fprintf(stderr, "%s: append: %s\n", name, s.error().message.c_str());
      std::exit(1);
    }
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    append_ms += ms;
  }
  r.append_mtok = tokens / (append_ms * 1e-3) / 1e6;

  for (int i = 0; i < 5; ++i) (void)dev->decode(0, q, out);
  BENCH_CUDA(cudaEventRecord(t0));
  for (int i = 0; i < iters; ++i) {
    const Status s = dev->decode(0, q, out);
    if (!s) {
      std::fprintf(stderr, "%s: decode: %s\n", name, s.error().message.c_str());
      std::exit(1);
    }
  }
  BENCH_CUDA(cudaEventRecord(t1));
  BENCH_CUDA(cudaEventSynchronize(t1));
  if (const Status s = dev->synchronize(); !s) {
    std::fprintf(stderr, "%s: %s\n", name, s.error().message.c_str());
    std::exit(1);
  }
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, t0, t1));
  r.us = ms * 1e3 / iters;
  r.bytes = static_cast<double>(dev->decode_read_bytes(0));
  r.gbs = r.bytes / (r.us * 1e-6) / 1e9;
  r.splits = dev->last_splits();

  if (check) {
    // CPU scalar kernel over the downloaded blocks.
    std::vector<float> hq(kQHeads * kHeadDim), got(hq.size()), want(hq.size());
    BENCH_CUDA(cudaMemcpy(hq.data(), q, hq.size() * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const int B = Cache::block_tokens, nb = dev->blocks_in_use(0), group = kQHeads / kKvHeads;
    kernels::Scratch scratch;
    for (int h = 0; h < kKvHeads; ++h) {
      std::vector<std::vector<std::byte>> blocks;
      std::vector<kernels::BlockRef> refs;
      for (int b = 0; b < nb; ++b) {
        auto bytes = dev->block_bytes(0, h, b);
        if (!bytes) {
          std::fprintf(stderr, "%s: %s\n", name, bytes.error().message.c_str());
          std::exit(1);
        }
        blocks.push_back(std::move(*bytes));
      }
      for (int b = 0; b < nb; ++b)
        refs.push_back({blocks[static_cast<std::size_t>(b)].data(), static_cast<std::int64_t>(b) * B,
                        std::min(B, tokens - b * B), nullptr});
      kernels::HeadSegments seg;
      seg.blocks = refs;
      kernels::AttendArgs a;
      a.head_dim = kHeadDim;
      a.group = group;
      a.n_q = 1;
      a.q_first = tokens;
      a.scale = 1.f / std::sqrt(static_cast<float>(kHeadDim));
      a.q = hq.data() + h * group * kHeadDim;
      a.q_stride = kQHeads * kHeadDim;
      a.out = want.data() + h * group * kHeadDim;
      a.out_stride = a.q_stride;
      kernels::attend_scalar<KC, VC, false>(a, seg, dev->layout(), scratch);
    }
    double worst = 0;
    for (int hq_i = 0; hq_i < kQHeads; ++hq_i) {
      double err = 0, mag = 1e-6;
      for (int d = 0; d < kHeadDim; ++d) {
        const auto i = static_cast<std::size_t>(hq_i * kHeadDim + d);
        err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
        mag = std::max(mag, std::abs(static_cast<double>(want[i])));
      }
      worst = std::max(worst, err / mag);
    }
    r.err = worst;
  }
  BENCH_CUDA(cudaEventDestroy(t0));
  BENCH_CUDA(cudaEventDestroy(t1));
  BENCH_CUDA(cudaFree(k));
  BENCH_CUDA(cudaFree(v));
  BENCH_CUDA(cudaFree(pos));
  BENCH_CUDA(cudaFree(q));
  BENCH_CUDA(cudaFree(out));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 32768, iters = 200;
  bool check = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--no-check")) check = false;
    else {
      std::fprintf(stderr, "usage: %s [--tokens N] [--iters N] [--no-check]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0, driver = 0;
  BENCH_CUDA(cudaRuntimeGetVersion(&runtime));
  BENCH_CUDA(cudaDriverGetVersion(&driver));
  const double copy = copy_bandwidth(20);
  std::printf("kvpack CUDA decode: %s (sm_%d%d, %d SMs), CUDA runtime %d, driver %d\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, runtime, driver);
  std::printf("shape: %d query heads, %d KV heads, head_dim %d, %d tokens, 1 decode query, %d timed decodes\n",
              kQHeads, kKvHeads, kHeadDim, tokens, iters);
  std::printf("device-to-device cudaMemcpy (1 GiB, read + write): %.1f GB/s\n\n", copy / 1e9);
  const Row rows[] = {run<Int4<>, Int4<>>("INT4 asym g32 fp16 (K and V)", tokens, iters, check),
                      run<Int8<>, Int8<>>("INT8 sym g32 fp16 (K and V)", tokens, iters, check)};
  std::printf("| cache | bits/value | KV bytes read | splits | us/decode | GB/s | %% of copy | append Mtok/s | max rel err vs CPU |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  bool ok = true;
  for (const Row& r : rows) {
    char err[32] = "not checked";
    if (r.err >= 0) std::snprintf(err, sizeof err, "%.2e", r.err);
    std::printf("| %s | %.2f | %.1f MB | %d | %.1f | %.0f | %.0f %% | %.2f | %s |\n", r.name.c_str(), r.bits_per_value,
                r.bytes / 1e6, r.splits, r.us, r.gbs, 100.0 * r.gbs * 1e9 / copy, r.append_mtok, err);
    if (r.err > 1e-5) ok = false;
  }
  if (!ok) {
    std::printf("\nFAILED: the CUDA output differs from the CPU scalar kernel by more than 1e-5 relative\n");
    return 1;
  }
  return 0;
}
