// The GPU-fed proxy: CUDA kernels drive an RMA transport (libfabric, UCX)
// through the proxy thread. This host object sets up what a kernel needs and
// hands it proxy::channel handles (epcomm/proxy/channel.hpp):
//
//   rings      one per channel, in pinned host memory mapped into the
//              device (cudaHostAlloc): kernels write descriptors over PCIe,
//              the proxy engine drains them;
//   counters   the transport's signal counters, registered and mapped
//              (cudaHostRegister), so that a kernel's wait polls them;
//   buffer     the transport's symmetric buffer as kernels address it:
//              device memory itself when the transport was built on it
//              (options::memory, GPUDirect RDMA), else the host buffer,
//              registered and mapped (kernels then stage rows over PCIe).
//
// Setup errors are epcomm::error naming the rank, "gpu proxy setup" and the
// CUDA call that failed. Keep the transport alive longer than this object;
// destroying it stops the engine first (waiting for what is in flight).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "epcomm/core/cuda_check.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/proxy/engine.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm::cuda {

struct gpu_proxy_options {
  int channels = 1;                    // rings; one producing thread each
  std::uint64_t ring_capacity = 1024;  // descriptors per ring, a power of two
  // Bound on each spin of a kernel's channel calls. EPCOMM_TIMEOUT_MS overrides it.
  std::chrono::milliseconds timeout = default_timeout;
  proxy::engine_options engine{};  // idle and drain behaviour (its ring fields are unused)
};

template <gpu_fed_transport Transport>
class gpu_proxy {
 public:
  gpu_proxy(Transport& t, const gpu_proxy_options& opt = {})
      : rank_(t.rank()),
        timeout_ns_(static_cast<std::uint64_t>(
            std::chrono::nanoseconds(effective_timeout(opt.timeout)).count())) {
    if (opt.channels < 1) fail("channels must be >= 1");
    if (!proxy::valid_capacity(opt.ring_capacity))
      fail("ring_capacity must be a power of two >= 2, got " + std::to_string(opt.ring_capacity));
    const std::size_t ring_bytes = proxy::ring_bytes(opt.ring_capacity);
    rings_ = host_mapping::allocate(rank_, ring_bytes * static_cast<std::size_t>(opt.channels));
    std::vector<proxy::ring_view> host_views;
    for (int c = 0; c < opt.channels; ++c) {
      const std::size_t at = ring_bytes * static_cast<std::size_t>(c);  // 64-byte multiples
      host_views.push_back(proxy::ring_view::over(rings_.host() + at, opt.ring_capacity));
      device_rings_.push_back({reinterpret_cast<proxy::ring_header*>(rings_.device() + at),
                               reinterpret_cast<proxy::descriptor*>(rings_.device() + at +
                                                                    sizeof(proxy::ring_header))});
    }
    const std::span<const std::uint64_t> counters = t.signal_counters();
    counters_ = host_mapping::register_range(rank_, counters.data(), counters.size_bytes());
    const std::span<std::byte> buffer = t.local_buffer();
    if (t.local_buffer_on_device()) {
      device_buffer_ = buffer.data();
    } else {
      buffer_ = host_mapping::register_range(rank_, buffer.data(), buffer.size_bytes());
      device_buffer_ = buffer_.device();
    }
    engine_ = std::make_unique<proxy::engine<Transport>>(t, host_views, opt.engine);
  }

  gpu_proxy(const gpu_proxy&) = delete;
  gpu_proxy& operator=(const gpu_proxy&) = delete;

  int channels() const { return static_cast<int>(device_rings_.size()); }

  // What a kernel gets for channel c: every pointer in it is a device address.
  proxy::channel channel(int c) const {
    return {device_rings_.at(static_cast<std::size_t>(c)), device_counters(), timeout_ns_};
  }

  // The transport's local_buffer() as kernels address it.
  std::byte* device_buffer() const { return device_buffer_; }

  // The transport's signal counters as kernels address them: kernels read
  // them (channel::wait), only the proxy adds to them.
  const std::uint64_t* device_counters() const {
    return reinterpret_cast<const std::uint64_t*>(counters_.device());
  }

  // The proxy's host side: failed() and rethrow() give the cause behind a
  // kernel's proxy_failed status.
  proxy::engine<Transport>& engine() { return *engine_; }

  // The engine's stop(): false when its thread is left behind in a
  // transport call, which may still read the rings and the transport's
  // mappings, so this is then kept, never destroyed.
  bool stop() { return engine_->stop(); }

 private:
  [[noreturn]] void fail(const std::string& cause) const {
    throw error(rank_, "gpu proxy setup", no_peer, cause);
  }

  // Pinned host memory mapped into the device while this lives: allocated
  // here (cudaHostAlloc, zeroed) or someone else's, registered
  // (cudaHostRegister).
  class host_mapping {
   public:
    host_mapping() = default;
    static host_mapping allocate(int rank, std::size_t bytes) {
      void* p = nullptr;
      check_cuda(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable), rank,
                 "gpu proxy setup", no_peer,
                 "cudaHostAlloc of " + std::to_string(bytes) + " bytes");
      std::memset(p, 0, bytes);
      return host_mapping(rank, p, &cudaFreeHost);
    }
    // The device reads or writes only what the owner lets it (counters: read
    // only); cudaHostRegister just takes a mutable pointer.
    static host_mapping register_range(int rank, const void* host, std::size_t bytes) {
      void* p = const_cast<void*>(host);
      check_cuda(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
                 rank, "gpu proxy setup", no_peer,
                 "cudaHostRegister of " + std::to_string(bytes) + " bytes");
      return host_mapping(rank, p, &cudaHostUnregister);
    }
    host_mapping(host_mapping&& o) noexcept
        : host_(std::exchange(o.host_, nullptr)), device_(o.device_), release_(o.release_) {}
    host_mapping& operator=(host_mapping&& o) noexcept {
      std::swap(host_, o.host_);
      std::swap(device_, o.device_);
      std::swap(release_, o.release_);
      return *this;
    }
    ~host_mapping() {
      if (host_ != nullptr) release_(host_);
    }
    std::byte* host() const { return static_cast<std::byte*>(host_); }
    std::byte* device() const { return device_; }

   private:
    using release_fn = cudaError_t (*)(void*);
    host_mapping(int rank, void* host, release_fn release) : host_(host), release_(release) {
      void* d = nullptr;
      const cudaError_t mapped = cudaHostGetDevicePointer(&d, host, 0);
      if (mapped != cudaSuccess) release_(host_);  // no destructor runs for a failed constructor
      check_cuda(mapped, rank, "gpu proxy setup", no_peer, "cudaHostGetDevicePointer");
      device_ = static_cast<std::byte*>(d);
    }

    void* host_ = nullptr;
    std::byte* device_ = nullptr;
    release_fn release_ = nullptr;
  };

  int rank_;
  std::uint64_t timeout_ns_;
  host_mapping rings_;
  std::vector<proxy::ring_view> device_rings_;
  host_mapping counters_;
  host_mapping buffer_;  // unused when the buffer is device memory
  std::byte* device_buffer_ = nullptr;
  std::unique_ptr<proxy::engine<Transport>> engine_;  // declared last: stops first
};

}  // namespace epcomm::cuda
