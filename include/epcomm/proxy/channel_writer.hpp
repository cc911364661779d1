// A producer's run of pushes on one channel that reads the ring's shared
// words as seldom as it can. From a kernel the ring is pinned host memory:
// each read of it is a round trip over PCIe (around a microsecond), while
// writes are posted. channel::put reads the failed word, head, tail and
// capacity for every descriptor; a writer reads head, capacity and the failed
// word once, and tail only when the slots it already knows to be free are
// used up, as MSCCL++'s device FIFO caches the consumer's position. The same
// put / put_signal / signal / flush and statuses as channel, and the same
// one-producer rule: make one for a run of pushes (a kernel phase's loop) and
// push nothing else on its channel while it lives.
#pragma once

#include <cstdint>

#include "epcomm/config.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/proxy/ring.hpp"

namespace epcomm::proxy {

class channel_writer {
 public:
  EPCOMM_HD explicit channel_writer(const channel& ch)
      : ring_(ch.ring),
        timeout_ns_(ch.timeout_ns),
        head_(ch.ring.header->head),
        capacity_(ch.ring.header->capacity),
        free_until_(load_acquire(&ch.ring.header->tail) + capacity_),
        failed_(proxy_failed(ch.ring)) {}

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

}  // namespace epcomm::proxy
