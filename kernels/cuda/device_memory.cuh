// CUDA error mapping, owning device buffers allocated and zeroed on an explicit stream, and a
// guard that makes a given device current for the duration of a call (restoring the caller's).
// Host code (cuda_runtime.h); used by kernels/cuda/device_cache.cuh.
//
// Error mapping (CUDA has no kvpack category of its own):
//   no device / no driver / unsupported architecture  -> Errc::unsupported
//   out of device memory                              -> Errc::capacity_exceeded
//   any other CUDA error                              -> Errc::io_error
// The message names the failing call and cudaGetErrorName / cudaGetErrorString of the error.
#pragma once

#if !defined(__CUDACC__)
#error "kernels/cuda/device_memory.cuh uses the CUDA runtime: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "kvpack/result.hpp"

namespace kvpack::cuda {

/// Error for a failed CUDA call `what` (see the mapping above).
[[nodiscard]] inline Error cuda_error(cudaError_t e, const std::string& what) {
  const Errc code = (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorNoKernelImageForDevice)
                        ? Errc::unsupported
                        : (e == cudaErrorMemoryAllocation ? Errc::capacity_exceeded : Errc::io_error);
  return fail(code, "CUDA: " + what + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

/// Returns the Status of a CUDA call from the enclosing function when it fails.
#define KVPACK_CUDA_TRY(call)                                                                        \
  do {                                                                                               \
    const cudaError_t kvpack_cuda_err_ = (call);                                                     \
    if (kvpack_cuda_err_ != cudaSuccess) return ::kvpack::cuda::cuda_error(kvpack_cuda_err_, #call); \
  } while (0)

/// Owning device allocation (cudaFree on destruction; errors there cannot be reported).
struct DeviceFree {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

/// Allocates `bytes` of device memory on the current device and zeroes it ON `stream`
/// (cudaMemsetAsync): work queued on the same stream afterwards sees zeros, whatever kind of
/// stream it is. (A plain cudaMemset runs on the legacy default stream, which does not order
/// against a cudaStreamNonBlocking stream: the zeroing could land after the first kernel.)
[[nodiscard]] inline Result<DeviceBuffer> device_alloc(std::size_t bytes, cudaStream_t stream, const std::string& what) {
  void* p = nullptr;
  const std::size_t n = bytes == 0 ? 1 : bytes;
  if (const cudaError_t e = cudaMalloc(&p, n); e != cudaSuccess)
    return cuda_error(e, "cudaMalloc(" + std::to_string(bytes) + " bytes) for " + what);
  DeviceBuffer buf(p);
  if (const cudaError_t e = cudaMemsetAsync(p, 0, n, stream); e != cudaSuccess)
    return cuda_error(e, "cudaMemsetAsync for " + what);
  return Result<DeviceBuffer>(std::move(buf));
}

/// Makes `device` current until destruction, then restores the caller's device. ok() is false
/// (and error() says why) when either call failed.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if ((err_ = cudaGetDevice(&previous_)) != cudaSuccess) return;
    if (previous_ != device) {
      err_ = cudaSetDevice(device);
      switched_ = err_ == cudaSuccess;
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  [[nodiscard]] bool ok() const noexcept { return err_ == cudaSuccess; }
  [[nodiscard]] Error error() const { return cuda_error(err_, "cudaGetDevice/cudaSetDevice"); }

 private:
  int previous_ = 0;
  bool switched_ = false;
  cudaError_t err_ = cudaSuccess;
};

/// Makes the DeviceCache's device current for the rest of the enclosing function (or returns).
#define KVPACK_CUDA_ON_DEVICE(dev)                         \
  ::kvpack::cuda::DeviceGuard kvpack_device_guard_(dev);   \
  if (!kvpack_device_guard_.ok()) return kvpack_device_guard_.error()

}  // namespace kvpack::cuda
