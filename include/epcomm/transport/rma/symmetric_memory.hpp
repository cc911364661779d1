// Where an RMA transport's symmetric data region lives, and the memory
// itself. Host memory (page-aligned anonymous mmap: what FI_MR_ALLOCATED
// asks) serves the host engines. CUDA device memory serves producers that
// run on the GPU: the NIC then reads and writes the GPU directly (libfabric
// FI_HMEM with iface FI_HMEM_CUDA, UCX memory type CUDA; GPUDirect RDMA on
// EFA and InfiniBand). Device memory needs the CUDA runtime: a program that
// links epcomm::cuda has EPCOMM_WITH_CUDA defined; without it, asking for
// device memory is an error at construction, never a silent host fallback.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "epcomm/core/error.hpp"

#if defined(EPCOMM_WITH_CUDA)
#include "epcomm/core/cuda_check.hpp"
#endif

namespace epcomm::proxy {

enum class memory_kind { host, cuda_device };

struct memory_placement {
  memory_kind kind = memory_kind::host;
  int cuda_device = 0;  // CUDA ordinal, for memory_kind::cuda_device
};

class symmetric_memory {
 public:
  symmetric_memory() = default;

  // `bytes` rounded up to whole pages; zeroed. Errors name `rank` and `op`.
  symmetric_memory(int rank, const char* op, std::size_t bytes, memory_placement where)
      : where_(where), bytes_((bytes + page - 1) / page * page) {
    if (where.kind == memory_kind::host) {
      void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
        throw error(rank, op, no_peer,
                    "mmap of " + std::to_string(bytes_) + " bytes: " + std::strerror(errno));
      data_ = static_cast<std::byte*>(p);
      return;
    }
#if defined(EPCOMM_WITH_CUDA)
    const device_scope on(rank, op, where.cuda_device);
    void* p = nullptr;
    cuda::check_cuda(cudaMalloc(&p, bytes_), rank, op, no_peer,
                     "cudaMalloc of " + std::to_string(bytes_) + " bytes");
    const cudaError_t zeroed = cudaMemset(p, 0, bytes_);
    if (zeroed != cudaSuccess) cudaFree(p);  // no destructor runs for a failed constructor
    cuda::check_cuda(zeroed, rank, op, no_peer, "cudaMemset");
    cudaStream_t stream = nullptr;
    const cudaError_t made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (made != cudaSuccess) cudaFree(p);
    cuda::check_cuda(made, rank, op, no_peer, "cudaStreamCreateWithFlags");
    copy_stream_ = stream;
    data_ = static_cast<std::byte*>(p);
#else
    throw error(rank, op, no_peer,
                "CUDA device memory was asked for, but this program was built without "
                "EPCOMM_WITH_CUDA (link epcomm::cuda)");
#endif
  }

  symmetric_memory(symmetric_memory&& o) noexcept
      : where_(o.where_),
        bytes_(o.bytes_),
        data_(std::exchange(o.data_, nullptr)),
        copy_stream_(std::exchange(o.copy_stream_, nullptr)) {}
  symmetric_memory& operator=(symmetric_memory&& o) noexcept {
    std::swap(where_, o.where_);
    std::swap(bytes_, o.bytes_);
    std::swap(data_, o.data_);
    std::swap(copy_stream_, o.copy_stream_);
    return *this;
  }
  ~symmetric_memory() { release(); }

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  memory_placement placement() const { return where_; }
  bool on_device() const { return where_.kind == memory_kind::cuda_device; }

  // A transport's put to itself: copies n bytes within the region. Device
  // memory has no overlapping copy, so overlapping ranges are refused there.
  // The copy goes on a non-blocking stream of its own: a cudaMemcpy (legacy
  // default stream) would wait for the kernel that pushed the put, which
  // may be waiting for the signal the put carries.
  void copy_within(int rank, const char* op, std::size_t dst, std::size_t src, std::size_t n) {
    if (!on_device()) {
      std::memmove(data_ + dst, data_ + src, n);
      return;
    }
    if (n != 0 && dst < src + n && src < dst + n)
      throw error(rank, op, rank,
                  "a put to this rank's own CUDA device memory may not overlap its source (" +
                      std::to_string(n) + " bytes from offset " + std::to_string(src) + " to " +
                      std::to_string(dst) + ")");
#if defined(EPCOMM_WITH_CUDA)
    const device_scope on(rank, op, where_.cuda_device);
    cuda::check_cuda(
        cudaMemcpyAsync(data_ + dst, data_ + src, n, cudaMemcpyDeviceToDevice, copy_stream()), rank,
        op, rank, "cudaMemcpyAsync (device to device)");
    cuda::check_cuda(cudaStreamSynchronize(copy_stream()), rank, op, rank,
                     "cudaStreamSynchronize (device to device copy)");
#endif
  }

 private:
  static constexpr std::size_t page = 4096;

#if defined(EPCOMM_WITH_CUDA)
  // Makes `device` current for one call and restores the caller's device.
  class device_scope {
   public:
    device_scope(int rank, const char* op, int device) {
      cuda::check_cuda(cudaGetDevice(&previous_), rank, op, no_peer, "cudaGetDevice");
      cuda::check_cuda(cudaSetDevice(device), rank, op, no_peer,
                       "cudaSetDevice(" + std::to_string(device) + ")");
    }
    ~device_scope() { cudaSetDevice(previous_); }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;

   private:
    int previous_ = 0;
  };
#endif

#if defined(EPCOMM_WITH_CUDA)
  cudaStream_t copy_stream() const { return static_cast<cudaStream_t>(copy_stream_); }
#endif

  void release() {
    if (data_ == nullptr) return;
    if (!on_device()) {
      munmap(data_, bytes_);
    } else {
#if defined(EPCOMM_WITH_CUDA)
      cudaStreamDestroy(copy_stream());
      cudaFree(data_);
#endif
    }
    data_ = nullptr;
  }

  memory_placement where_{};
  std::size_t bytes_ = 0;
  std::byte* data_ = nullptr;
  // Device memory: the stream of copy_within (a cudaStream_t, held untyped
  // so that the class compiles without CUDA).
  void* copy_stream_ = nullptr;
};

}  // namespace epcomm::proxy
