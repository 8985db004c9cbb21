// Compile-only check: include/kvpack/numeric.hpp builds as CUDA device code (every function is
// KVPACK_HOST_DEVICE, no host-only std:: call) and constant-evaluates under nvcc's front end.
// Run by ctest as `nvcc -std=c++20 -arch=sm_90 -c` where the CUDA Toolkit is found (see
// tests/CMakeLists.txt); needs no GPU. The numeric results are tested on the host by
// tests/test_numeric_*.cpp and tests/cuda/test_numeric_cuda_crosscheck.cpp.
#include <cstdint>

#include "kvpack/numeric.hpp"

static_assert(kvpack::e4m3_from_float(17.f) == 0x58 && kvpack::e4m3_from_float(19.f) == 0x5A);
static_assert(kvpack::e4m3_from_float(465.f) == 0x7E && kvpack::e5m2_from_float(1e10f) == 0x7B);
static_assert(kvpack::fp16_from_float(4367.2f, kvpack::Rounding::toward_pos_inf) == 0x6C44);
static_assert(kvpack::bf16_from_float(1.0f) == 0x3F80 && kvpack::fp16_to_float(0x0001) == 0x1p-24f);

// codes: [n] fp16 RNE / up / down, bf16 RNE / up / down, E4M3, E5M2 of in[i];
// back:  [n] sum of the four decodes of those codes.
__global__ void numeric_device_roundtrip(const float* in, std::uint16_t* codes, float* back,
                                         int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float x = in[i];
  std::uint16_t* c = codes + 8 * i;
  c[0] = kvpack::fp16_from_float(x);
  c[1] = kvpack::fp16_from_float(x, kvpack::Rounding::toward_pos_inf);
  c[2] = kvpack::fp16_from_float(x, kvpack::Rounding::toward_neg_inf);
  c[3] = kvpack::bf16_from_float(x);
  c[4] = kvpack::bf16_from_float(x, kvpack::Rounding::toward_pos_inf);
  c[5] = kvpack::bf16_from_float(x, kvpack::Rounding::toward_neg_inf);
  c[6] = kvpack::e4m3_from_float(x);
  c[7] = kvpack::e5m2_from_float(x);
  back[i] = kvpack::fp16_to_float(c[0]) + kvpack::bf16_to_float(c[3]) +
            kvpack::e4m3_to_float(static_cast<std::uint8_t>(c[6])) +
            kvpack::e5m2_to_float(static_cast<std::uint8_t>(c[7])) +
            (x > kvpack::kE4M3Max ? kvpack::kFp16Max : kvpack::kE5M2Max);
}
