// Device-side signalling over peer-mapped memory: system-scope release adds
// and acquire loads on the 64-bit counters of wire::signal_slot, and a bounded
// wait that records who was late instead of hanging.
//
// System scope because the other side is another process, possibly on
// another GPU: a kernel's stores to a peer's buffer are published by a
// release add on the peer's counter, and observed by the peer's acquire load.
#pragma once

#include <cstdint>

#include "epcomm/cuda/report.hpp"

namespace epcomm::cuda::device {

__device__ __forceinline__ std::uint64_t load_acquire(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Adds n to a (possibly remote) counter after every earlier store of this
// thread has become visible to whoever acquires the new value.
__device__ __forceinline__ void add_release(std::uint64_t* p, std::uint64_t n) {
  asm volatile("red.release.sys.add.u64 [%0], %1;" ::"l"(p), "l"(n) : "memory");
}

// Nanoseconds of a clock shared by every SM (and, for our purposes, every
// process on the node): deadlines are wall-clock, like the host's.
__device__ __forceinline__ std::uint64_t now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool is_broken(const report* rep) {
  return *reinterpret_cast<const volatile std::int32_t*>(&rep->broken) != 0;
}

// Records the first failure of the current call: a failure already in the
// report (an earlier rejected call not yet read by the host) is kept.
__device__ __forceinline__ bool claim_report(report* rep) {
  return atomicCAS(reinterpret_cast<int*>(&rep->code), static_cast<int>(failure::none), -1) ==
         static_cast<int>(failure::none);
}

// Marks the rank broken and, if nothing was recorded yet, says which wait
// expired. Every other waiter of this rank sees `broken` and gives up too.
__device__ inline void report_deadline(report* rep, int peer, waited_for what,
                                       std::uint64_t expected, std::uint64_t seen) {
  atomicExch(&rep->broken, 1);
  if (!claim_report(rep)) return;
  rep->peer = peer;
  rep->what = what;
  rep->expected = static_cast<std::int64_t>(expected);
  rep->seen = static_cast<std::int64_t>(seen);
  rep->cause[0] = '\0';
  __threadfence();
  atomicExch(reinterpret_cast<int*>(&rep->code), static_cast<int>(failure::deadline));
}

// Records a verdict failure (already filled in `r` by judge_notify or
// judge_combine) unless an earlier failure is pending.
__device__ inline void report_verdict(report* rep, const report& r) {
  if (!claim_report(rep)) return;
  rep->peer = r.peer;
  rep->what = r.what;
  rep->field = r.field;
  rep->expected = r.expected;
  rep->seen = r.seen;
  for (int i = 0; i < wire::cause_bytes; ++i) rep->cause[i] = r.cause[i];
  __threadfence();
  atomicExch(reinterpret_cast<int*>(&rep->code), static_cast<int>(r.code));
}

// Spins until *counter >= expected (acquire). Returns false, without hanging,
// when timeout_ns pass first (recorded, attributed to `peer`) or when another
// thread of this rank has already failed.
__device__ inline bool wait_at_least(const std::uint64_t* counter, std::uint64_t expected,
                                     std::uint64_t timeout_ns, report* rep, int peer,
                                     waited_for what) {
  const std::uint64_t start = now_ns();
  for (std::uint32_t spin = 1;; ++spin) {
    const std::uint64_t v = load_acquire(counter);
    if (v >= expected) return true;
    // Reading the clock and the flag costs more than the load: check them
    // every few polls only.
    if ((spin & 31u) == 0) {
      if (is_broken(rep)) return false;
      if (now_ns() - start > timeout_ns) {
        report_deadline(rep, peer, what, expected, v);
        return false;
      }
    }
  }
}

}  // namespace epcomm::cuda::device
