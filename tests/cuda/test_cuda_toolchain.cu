// Proves the CUDA toolchain end to end: nvcc compiles kvpack's headers for sm_80/sm_90 + PTX,
// a KVPACK_HOST_DEVICE function gives the same result on host and device, and a kernel launch
// reports its errors. Runs only where a GPU is present (otherwise skipped, exit 77).
#include <kvpack/config.hpp>
#include <kvpack/result.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

static_assert(KVPACK_HAS_CUDA == 1, "nvcc must see KVPACK_HAS_CUDA == 1");

namespace {

// y = a*x + b, rounded by the same IEEE fp32 operations on host and device (no FMA contraction:
// __fmul_rn/__fadd_rn on device, plain operations with -ffp-contract=off semantics on host).
KVPACK_HOST_DEVICE float affine(float a, float x, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, x), b);
#else
  const volatile float ax = a * x;
  return ax + b;
#endif
}

__global__ void affine_kernel(const float* x, float* y, int n, float a, float b) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = affine(a, x[i], b);
}

}  // namespace

TEST(CudaToolchain, HostDeviceFunctionAgreesOnOddSizes) {
  for (int n : {1, 31, 33, 95, 4097}) {
    std::vector<float> x(static_cast<size_t>(n)), y(x.size(), -1.f);
    for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 0.37f * static_cast<float>(i) - 11.f;
    float *dx = nullptr, *dy = nullptr;
    const size_t bytes = x.size() * sizeof(float);
    ASSERT_EQ(cudaMalloc(&dx, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    affine_kernel<<<(n + 127) / 128, 128>>>(dx, dy, n, 1.5f, -0.25f);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(y.data(), dy, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dx);
    cudaFree(dy);
    for (int i = 0; i < n; ++i) {
      const auto k = static_cast<size_t>(i);
      EXPECT_EQ(y[k], affine(1.5f, x[k], -0.25f)) << "n=" << n << " i=" << i;
    }
  }
}

TEST(CudaToolchain, BadLaunchIsReported) {
  // 2048 threads per block exceeds every architecture's limit (1024): the launch must fail.
  affine_kernel<<<1, 2048>>>(nullptr, nullptr, 0, 0.f, 0.f);
  EXPECT_NE(cudaGetLastError(), cudaSuccess);
}
