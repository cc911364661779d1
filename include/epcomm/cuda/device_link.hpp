// What a device buffer (cuda::device_buffer, cuda::low_latency_device_buffer)
// holds to reach its peers: a device transport whose peers' memory its
// kernels store into (nvlink_ipc), or an RMA transport (libfabric, UCX) and
// the GPU-fed proxy its kernels hand puts to (gpu_proxy.hpp), with the
// symmetric buffer in device memory or in host memory mapped into the device.
// Either way the kernels get a peer_table (over RMA: only this rank's buffer
// and its counters, mapped) and, over RMA, the channels.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "epcomm/core/cuda_check.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/cuda/gpu_proxy.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/proxy/transport_with_proxy.hpp"
#include "epcomm/transport/peer_table.hpp"
#include "epcomm/transport/rma/symmetric_memory.hpp"

namespace epcomm::cuda {

template <class T>
concept device_buffer_transport = device_transport<T> || gpu_fed_transport<T>;

template <device_buffer_transport Transport>
class device_link {
 public:
  // Peers' memory is not mapped: the kernels go through the proxy.
  static constexpr bool via_proxy = !device_transport<Transport>;

  // Collective, like the transport's constructor, which `setup` bounds;
  // `timeout` bounds the transport's and the proxy's waits afterwards.
  // `rma_memory` places an RMA transport's buffer; `channels` is how many the
  // kernels push to.
  template <class B>
  device_link(B& boot, std::size_t bytes, std::size_t slots, const deadline& setup,
              std::chrono::milliseconds timeout, proxy::memory_kind rma_memory, int channels)
      : owned_([&] { return make_transport(boot, bytes, slots, setup, timeout, rma_memory); },
               gpu_proxy_options{.channels = channels, .timeout = timeout}) {}

  Transport& transport() { return owned_.transport(); }

  // The start of this rank's symmetric buffer, as kernels address it.
  std::byte* local_buffer() {
    if constexpr (via_proxy)
      return proxy().device_buffer();
    else
      return transport().local_device_buffer().data();
  }

  // What kernels reach peers with.
  peer_table peers() {
    if constexpr (via_proxy) {
      peer_table t{};
      t.rank = transport().rank();
      t.world_size = transport().world_size();
      t.buffer[t.rank] = proxy().device_buffer();
      // Kernels only read the counters; the proxy adds to them.
      t.signals[t.rank] = const_cast<std::uint64_t*>(proxy().device_counters());
      return t;
    } else {
      return transport().device_handle();
    }
  }

  // Over RMA: channel c of the proxy.
  proxy::channel channel(int c) const {
    if constexpr (via_proxy)
      return proxy().channel(c);
    else
      return {};
  }

  // A kernel sees only that the proxy failed; the engine knows why: `e`
  // with the engine's operation and cause appended, and its peer, when it
  // has failed.
  error with_proxy_cause(const error& e) {
    if constexpr (via_proxy) {
      if (proxy().engine().failed()) {
        try {
          proxy().engine().rethrow();
        } catch (const error& cause) {
          return error(e.rank(), e.op(), cause.peer(),
                       e.cause() + ": " + cause.op() + ": " + cause.cause());
        }
      }
    }
    return e;
  }

 private:
  template <class B>
  static Transport make_transport(B& boot, std::size_t bytes, std::size_t slots, const deadline& dl,
                                  std::chrono::milliseconds timeout, proxy::memory_kind memory) {
    if constexpr (via_proxy) {
      typename Transport::options_type opt{};
      opt.timeout = timeout;
      int device = 0;
      if (memory == proxy::memory_kind::cuda_device)
        check_cuda(cudaGetDevice(&device), boot.rank(), "device buffer setup", no_peer,
                   "cudaGetDevice");
      opt.memory = {memory, device};
      return Transport(boot, bytes, slots, dl, opt);
    } else {
      return Transport(boot, bytes, slots, dl);
    }
  }

  auto& proxy() requires via_proxy { return owned_.proxy(); }
  const auto& proxy() const requires via_proxy { return owned_.proxy(); }

  proxy::transport_with_proxy<via_proxy, gpu_proxy, Transport> owned_;
};

}  // namespace epcomm::cuda
