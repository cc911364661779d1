// Owning device arrays for the GPU check program: upload host vectors, read
// device results back. Failures throw epcomm::error like the library's own.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "epcomm/core/cuda_check.hpp"

namespace epcomm::gpu_check {

template <class T>
class device_array {
 public:
  device_array() = default;
  // Never null, even when empty: epcomm's device calls read a null optional
  // input (combine's topk_weights) as "not given", and a rank that received
  // no rows still gives its (empty) weights.
  explicit device_array(std::size_t n) : n_(n) {
    void* p = nullptr;
    cuda::check_cuda(cudaMalloc(&p, std::max<std::size_t>(n_, 1) * sizeof(T)), -1, "gpu check", -1,
                     "cudaMalloc");
    p_ = static_cast<T*>(p);
  }
  explicit device_array(std::span<const T> host) : device_array(host.size()) { upload(host); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  device_array(device_array&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  device_array& operator=(device_array&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~device_array() {
    if (p_ != nullptr) cudaFree(p_);
  }

  T* data() const { return p_; }
  std::size_t size() const { return n_; }

  void upload(std::span<const T> host) {
    if (host.size() != n_) throw error(-1, "gpu check", -1, "upload size mismatch");
    if (n_ != 0)
      cuda::check_cuda(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), -1,
                       "gpu check", -1, "cudaMemcpy(upload)");
  }

  std::vector<T> download() const { return read(p_, n_); }

  // Copies n elements at a device address (a result view) to the host.
  static std::vector<T> read(const T* device, std::size_t n) {
    std::vector<T> out(n);
    if (n != 0)
      cuda::check_cuda(cudaMemcpy(out.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), -1,
                       "gpu check", -1, "cudaMemcpy(download)");
    return out;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace epcomm::gpu_check
