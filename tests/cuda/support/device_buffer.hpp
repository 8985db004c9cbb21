// Small RAII device buffer for the CUDA tests and benchmarks: cudaMalloc'd copy of a host vector,
// read back with to_host(). Failures abort the test through GoogleTest's ADD_FAILURE when used in
// tests (ok() tells), and are reported by the benchmark itself.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace kvtest {

template <class T>
class DeviceVector {
 public:
  DeviceVector() = default;
  explicit DeviceVector(std::size_t n) { allocate(n); }
  explicit DeviceVector(const std::vector<T>& host) {
    allocate(host.size());
    if (err_ == cudaSuccess && !host.empty())
      err_ = cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() {
    if (ptr_) (void)cudaFree(ptr_);
  }

  [[nodiscard]] T* get() const noexcept { return ptr_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// cudaSuccess when every CUDA call so far succeeded.
  [[nodiscard]] cudaError_t status() const noexcept { return err_; }
  [[nodiscard]] bool ok() const noexcept { return err_ == cudaSuccess; }
  [[nodiscard]] std::string message() const { return std::string(cudaGetErrorName(err_)) + ": " + cudaGetErrorString(err_); }

  /// Copies the device contents back (empty vector and !ok() on failure).
  [[nodiscard]] std::vector<T> to_host() {
    std::vector<T> out(n_);
    if (err_ == cudaSuccess && n_ > 0) err_ = cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    if (err_ != cudaSuccess) out.clear();
    return out;
  }

 private:
  void allocate(std::size_t n) {
    n_ = n;
    err_ = cudaMalloc(reinterpret_cast<void**>(&ptr_), (n == 0 ? 1 : n) * sizeof(T));
    if (err_ != cudaSuccess) ptr_ = nullptr;
  }
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace kvtest
