// A producer's handle on the proxy: what a CUDA kernel holds to drive an RMA
// transport (libfabric, UCX) through the proxy thread, in the manner of
// MSCCL++'s proxy channels. Four primitives and two waits:
//
//   put, put_signal, signal, flush   write one descriptor into the ring
//                                    (writer(): a run of them, cheaper);
//   quiet                            until the proxy has completed every
//                                    descriptor pushed so far (their source
//                                    bytes may be overwritten);
//   wait                             until this rank's signal counter reaches
//                                    a value (a peer's put_signal landed).
//
// The handle is a few plain pointers, trivially copyable, passed to a kernel
// by value. The ring lives in pinned host memory the kernel writes over PCIe
// (cuda/gpu_proxy.hpp), the counters are the transport's, mapped for the
// device. One thread per ring pushes (the ring has one producer); before it
// pushes, every thread that wrote the bytes a descriptor names must have
// fenced (__threadfence_system) and synchronised with it, so that the NIC
// reads what was written. Nothing here blocks without a deadline: every spin
// ends with a status after timeout_ns, or at once when the proxy has failed.
//
// The same code runs on the host (EPCOMM_HD), where a thread plays the
// kernel: tests/proxy/test_proxy_channel.cpp drives it against real transports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "epcomm/core/config.hpp"
#include "epcomm/core/enum_names.hpp"
#include "epcomm/proxy/ring.hpp"

#if !defined(__CUDA_ARCH__)
#include <chrono>
#include <thread>
#endif

namespace epcomm::proxy {

// What a channel call reports; kernels copy it into their error report.
enum class channel_status : std::int32_t {
  ok = 0,
  proxy_failed = 1,  // the proxy stopped on an error: its host side has the cause
  ring_full = 2,     // the deadline passed with the ring still full
  not_drained = 3,   // quiet's deadline passed with descriptors incomplete
  signal_late = 4,   // wait's deadline passed below the expected count
};

// Nanoseconds on a clock every waiter of the process shares: the GPU's
// global timer on the device, the steady clock on the host.
EPCOMM_HD inline std::uint64_t channel_clock_ns() {
#if defined(__CUDA_ARCH__)
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
#endif
}

// Called between polls: on the host a spinning thread must let the proxy
// thread run when cores are few; a GPU thread just polls again.
EPCOMM_HD inline void channel_pause([[maybe_unused]] std::uint32_t spin) {
#if !defined(__CUDA_ARCH__)
  if ((spin & 63u) == 0) std::this_thread::yield();
#endif
}

// A producer's run of pushes on one channel (channel::writer()), reading the
// ring's shared words as seldom as it can. From a kernel the ring is pinned
// host memory: each read of it is a round trip over PCIe, while writes are
// posted. A writer reads head, capacity and the failed word once, and tail
// only when the slots it already knows to be free are used up, as MSCCL++'s
// device FIFO caches the consumer's position. Make one for a run of pushes
// (a kernel phase's loop) and push nothing else on its channel while it
// lives: the ring has one producer.
class channel_writer {
 public:
  EPCOMM_HD channel_writer(ring_view ring, std::uint64_t timeout_ns)
      : ring_(ring),
        timeout_ns_(timeout_ns),
        head_(ring.header->head),
        capacity_(ring.header->capacity),
        free_until_(load_acquire(&ring.header->tail) + capacity_),
        failed_(proxy_failed(ring)) {}

  EPCOMM_HD channel_status put(int peer, std::uint64_t local_offset, std::uint64_t remote_offset,
                               std::uint64_t bytes) {
    return push(op_code::put, peer, local_offset, remote_offset, bytes, 0, 0);
  }
  EPCOMM_HD channel_status put_signal(int peer, std::uint64_t local_offset,
                                      std::uint64_t remote_offset, std::uint64_t bytes,
                                      std::uint64_t slot, std::uint64_t n) {
    return push(op_code::put_signal, peer, local_offset, remote_offset, bytes, slot, n);
  }
  EPCOMM_HD channel_status signal(int peer, std::uint64_t slot, std::uint64_t n) {
    return push(op_code::signal, peer, 0, 0, 0, slot, n);
  }
  EPCOMM_HD channel_status flush(int peer) { return push(op_code::flush, peer, 0, 0, 0, 0, 0); }

 private:
  EPCOMM_HD channel_status push(op_code op, int peer, std::uint64_t local_offset,
                                std::uint64_t remote_offset, std::uint64_t bytes,
                                std::uint64_t slot, std::uint64_t n) {
    if (failed_) return channel_status::proxy_failed;
    if (head_ == free_until_)
      if (const channel_status s = wait_for_room(); s != channel_status::ok) return s;
    write_slot(ring_, head_, capacity_, op, peer, local_offset, remote_offset, bytes, slot, n);
    ++head_;
    return channel_status::ok;
  }

  // The ring is full as far as this writer knows: read where the proxy is.
  EPCOMM_HD channel_status wait_for_room() {
    const std::uint64_t start = channel_clock_ns();
    for (std::uint32_t spin = 1;; ++spin) {
      free_until_ = load_acquire(&ring_.header->tail) + capacity_;
      if (head_ != free_until_) return channel_status::ok;
      if (proxy_failed(ring_)) {
        failed_ = true;
        return channel_status::proxy_failed;
      }
      if (channel_clock_ns() - start > timeout_ns_) return channel_status::ring_full;
      channel_pause(spin);
    }
  }

  ring_view ring_;
  std::uint64_t timeout_ns_;
  std::uint64_t head_;  // the next ticket
  std::uint64_t capacity_;
  std::uint64_t free_until_;  // tickets below it are free, as of the last read of tail
  bool failed_;
};

struct channel {
  ring_view ring;                 // as the producer addresses it (device pointers in a kernel)
  const std::uint64_t* counters;  // this rank's signal counters, likewise
  std::uint64_t timeout_ns;       // bound on each spin

  // A run of pushes; the four below push one descriptor each through a
  // writer of their own, so each reads the ring's shared words anew.
  EPCOMM_HD channel_writer writer() const { return {ring, timeout_ns}; }

  EPCOMM_HD channel_status put(int peer, std::uint64_t local_offset, std::uint64_t remote_offset,
                               std::uint64_t bytes) const {
    return writer().put(peer, local_offset, remote_offset, bytes);
  }
  EPCOMM_HD channel_status put_signal(int peer, std::uint64_t local_offset,
                                      std::uint64_t remote_offset, std::uint64_t bytes,
                                      std::uint64_t slot, std::uint64_t n) const {
    return writer().put_signal(peer, local_offset, remote_offset, bytes, slot, n);
  }
  EPCOMM_HD channel_status signal(int peer, std::uint64_t slot, std::uint64_t n) const {
    return writer().signal(peer, slot, n);
  }
  EPCOMM_HD channel_status flush(int peer) const { return writer().flush(peer); }

  EPCOMM_HD channel_status quiet() const {
    const std::uint64_t start = channel_clock_ns();
    for (std::uint32_t spin = 1; !drained(ring); ++spin) {
      if (proxy_failed(ring)) return channel_status::proxy_failed;
      if (channel_clock_ns() - start > timeout_ns) return channel_status::not_drained;
      channel_pause(spin);
    }
    return channel_status::ok;
  }

  // Until counter `slot` >= expected; `seen` gets the last value read.
  EPCOMM_HD channel_status wait(std::size_t slot, std::uint64_t expected,
                                std::uint64_t* seen = nullptr) const {
    const std::uint64_t start = channel_clock_ns();
    for (std::uint32_t spin = 1;; ++spin) {
      const std::uint64_t v = load_acquire(counters + slot);
      if (seen != nullptr) *seen = v;
      if (v >= expected) return channel_status::ok;
      if (proxy_failed(ring)) return channel_status::proxy_failed;
      if (channel_clock_ns() - start > timeout_ns) return channel_status::signal_late;
      channel_pause(spin);
    }
  }
};

static_assert(std::is_trivially_copyable_v<channel>);

inline constexpr auto channel_status_names = names_for<channel_status, channel_status::signal_late>(
    "ok", "the proxy stopped on an error", "deadline expired with the proxy ring full",
    "deadline expired with proxy operations incomplete", "deadline expired waiting for a signal");

inline const char* to_string(channel_status s) {
  return channel_status_names(s, "unknown channel status");
}

// How a kernel's failed channel call reads in an epcomm::error.
inline std::string channel_failure(channel_status s) {
  return std::string("proxy: ") + to_string(s);
}

}  // namespace epcomm::proxy
