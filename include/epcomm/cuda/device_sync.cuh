// Device-side signalling both modes' kernels share: system-scope release adds
// and acquire loads on 64-bit signal counters, the globaltimer clock their
// deadlines read, the abort relay (cuda/abort_link.hpp), and the look at the
// sticky `broken` flag both modes' reports carry. What a failed
// wait records is each mode's own (normal/cuda/sync.cuh,
// low_latency/cuda/sync.cuh).
//
// System scope because the other side is another process, possibly on
// another GPU: a kernel's stores to a peer's buffer are published by a
// release add on the peer's counter, and observed by the peer's acquire load.
#pragma once

#include <cstdint>

#include "epcomm/cuda/abort_link.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/transport/peer_abort.hpp"

namespace epcomm::cuda::device {

#if defined(EPCOMM_DEVICE_CODE_ON_HOST)
// Device code compiled by a host compiler to run on the CPU: the execution
// layer that does so (tests/support/cpu_cuda) defines these three. Its
// acquire load also lets the block's other threads run, as a GPU's other
// warps run while one polls.
std::uint64_t host_load_acquire(const std::uint64_t* p);
void host_add_release(std::uint64_t* p, std::uint64_t n);
std::uint64_t host_now_ns();
#endif

// Whether a call's report (normal/report.hpp, low_latency/report.hpp) has
// its sticky `broken` flag set: every waiter of the rank then gives up.
template <class Report>
__device__ __forceinline__ bool is_broken(const Report* rep) {
  return *reinterpret_cast<const volatile std::int32_t*>(&rep->broken) != 0;
}

// is_broken for a kernel's start, answered for the whole block at once
// (every thread calls it): another block may break the call between one
// warp's look and the next's, and a block whose threads part there meets
// its next barrier short of the ones that left.
template <class Report>
__device__ __forceinline__ bool block_is_broken(const Report* rep) {
  return __syncthreads_or(is_broken(rep) ? 1 : 0) != 0;
}

__device__ __forceinline__ std::uint64_t load_acquire(const std::uint64_t* p) {
#if defined(EPCOMM_DEVICE_CODE_ON_HOST)
  return host_load_acquire(p);
#else
  std::uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#endif
}

// Adds n to a (possibly remote) counter after every earlier store of this
// thread has become visible to whoever acquires the new value.
__device__ __forceinline__ void add_release(std::uint64_t* p, std::uint64_t n) {
#if defined(EPCOMM_DEVICE_CODE_ON_HOST)
  host_add_release(p, n);
#else
  asm volatile("red.release.sys.add.u64 [%0], %1;" ::"l"(p), "l"(n) : "memory");
#endif
}

// Nanoseconds of a clock shared by every SM (and, for our purposes, every
// process on the node): deadlines are wall-clock, like the host's.
__device__ __forceinline__ std::uint64_t now_ns() {
#if defined(EPCOMM_DEVICE_CODE_ON_HOST)
  return host_now_ns();
#else
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

// Writes a failure record, the first of a call only: claims its code (none
// -> -1, so that a reader waits for the rest), lets fill() write the other
// fields, then publishes `value` after a fence. False, writing nothing, when
// a failure is pending already (one the host has not read).
template <class Code, class Fill>
__device__ inline bool record_first_failure(Code* code, Code value, Fill&& fill) {
  int* word = reinterpret_cast<int*>(code);
  if (atomicCAS(word, static_cast<int>(Code::none), -1) != static_cast<int>(Code::none))
    return false;
  fill();
  __threadfence();
  atomicExch(word, static_cast<int>(value));
  return true;
}

// to.*m = from.*m for each member m named: the fields of a failure record
// that the failure fills (a report's other fields are the rank's own).
template <class Record, class... Member>
__device__ __forceinline__ void copy_fields(Record& to, const Record& from, Member Record::*... m) {
  ((to.*m = from.*m), ...);
}

// The bounded wait of both modes' kernels: spins until *counter >= expected
// (acquire) and returns true. The clock and the failure flags cost more than
// the load, so every 32 polls it asks stopped() (true once this rank has
// failed or a peer aborted, which stopped() records) and, once timeout_ns
// have passed, calls late(last value seen) to record the deadline; either
// way it returns false instead of hanging. `waited_ns`, when given, receives
// how long a wait that succeeded took.
template <class Stopped, class Late>
__device__ inline bool wait_bounded(const std::uint64_t* counter, std::uint64_t expected,
                                    std::uint64_t timeout_ns, Stopped&& stopped, Late&& late,
                                    std::uint64_t* waited_ns = nullptr) {
  const std::uint64_t start = now_ns();
  for (std::uint32_t spin = 1;; ++spin) {
    const std::uint64_t v = load_acquire(counter);
    if (v >= expected) {
      if (waited_ns != nullptr) *waited_ns = now_ns() - start;
      return true;
    }
    if ((spin & 31u) == 0) {
      if (stopped()) return false;
      if (now_ns() - start > timeout_ns) {
        late(v);
        return false;
      }
    }
  }
}

// Tells every peer, through its abort word there, that this rank gave up
// because of `culprit`. Called once per rank (by whoever sets `broken`).
// The proxy's status is not checked: a proxy that fails has its own cause,
// which the host reports, and the peers then reach their deadlines.
__device__ inline void relay_abort(const abort_link& link, int culprit) {
  const std::uint64_t word = encode_abort(culprit);
  const std::size_t slot = link.first + link.rank;
  if (link.via_proxy != 0) {
    proxy::channel_writer relay = link.relay.writer();
    for (int q = 0; q < link.world; ++q)
      if (q != link.rank) relay.signal(q, slot, word);
  } else {
    for (int q = 0; q < link.world; ++q)
      if (q != link.rank) add_release(link.signals[q] + slot, word);
  }
}

// The lowest peer whose abort word is set at this rank, with the rank it
// blamed in *culprit; -1 when none is.
__device__ inline int find_peer_abort(const abort_link& link, int* culprit) {
  const std::uint64_t* words = link.signals[link.rank] + link.first;
  for (int s = 0; s < link.world; ++s)
    if (const std::uint64_t w = load_acquire(words + s); w != 0) {
      *culprit = decode_abort(w, link.world);
      return s;
    }
  return -1;
}

}  // namespace epcomm::cuda::device
