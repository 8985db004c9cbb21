// Host-side launch of the decode split kernel (kernels/cuda/decode_kernel.cuh): picks the
// instantiation for head_dim and query heads per CTA, and grants the kernel its dynamic shared
// memory on the launching device once (cudaFuncSetAttribute is per device and per kernel).
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/decode_launch.cuh launches CUDA kernels: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "kvpack/kernels/cuda/decode_kernel.cuh"
#include "kvpack/kernels/cuda/decode_plan.cuh"
#include "kvpack/kernels/cuda/device_memory.cuh"

namespace kvpack::cuda {

/// Enqueues decode_split_kernel<KC, VC, B, D, GMAX> on `stream` with a.smem.total bytes of
/// dynamic shared memory; `device` is the current device (for the opt-in). The opt-in above
/// 48 KiB is requested once per (instantiation, device, larger size), under a lock (SmemOptIn),
/// so concurrent launches from several threads and devices are safe.
template <class KC, class VC, int B, int D, int GMAX>
Status launch_decode_split_as(const DecodeArgs& a, dim3 grid, int device, cudaStream_t stream) {
  auto* kernel = &decode_split_kernel<KC, VC, B, D, GMAX>;
  static SmemOptIn opt_in;
  Status granted = opt_in.ensure(device, a.smem.total, [kernel](std::size_t bytes) -> Status {
    KVPACK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    return {};
  });
  if (!granted) return granted;
  kernel<<<grid, kDecodeThreads, a.smem.total, stream>>>(a);
  KVPACK_CUDA_TRY(cudaGetLastError());
  return {};
}

/// The instantiation for head_dim (64, 128, 256) and query heads per CTA (1, 2, 4, 8).
template <class KC, class VC, int B>
Status launch_decode_split(const DecodeArgs& a, dim3 grid, int head_dim, int heads_per_cta, int device,
                           cudaStream_t stream) {
  auto for_dim = [&]<int D>() -> Status {
    if (heads_per_cta <= 2)
      return heads_per_cta == 1 ? launch_decode_split_as<KC, VC, B, D, 1>(a, grid, device, stream)
                                : launch_decode_split_as<KC, VC, B, D, 2>(a, grid, device, stream);
    return heads_per_cta == 4 ? launch_decode_split_as<KC, VC, B, D, 4>(a, grid, device, stream)
                              : launch_decode_split_as<KC, VC, B, D, 8>(a, grid, device, stream);
  };
  if (head_dim == 64) return for_dim.template operator()<64>();
  return head_dim == 128 ? for_dim.template operator()<128>() : for_dim.template operator()<256>();
}

}  // namespace kvpack::cuda
