// Device-side signalling over peer-mapped memory: system-scope release adds
// and acquire loads on the 64-bit counters of wire::signal_slot, and a bounded
// wait that records who was late instead of hanging.
//
// System scope because the other side is another process, possibly on
// another GPU: a kernel's stores to a peer's buffer are published by a
// release add on the peer's counter, and observed by the peer's acquire load.
#pragma once

#include <cstdint>

#include "epcomm/cuda/abort_link.hpp"
#include "epcomm/normal/report.hpp"
#include "epcomm/proxy/channel.hpp"

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

// Tells every peer, through its abort word there, that this rank gave up
// because of `culprit`. Called once per rank (by whoever sets `broken`).
// The proxy's status is not checked: a proxy that fails has its own cause,
// which the host reports, and the peers then reach their deadlines.
__device__ inline void relay_abort(const abort_link& link, int culprit) {
  const std::uint64_t word = static_cast<std::uint64_t>(culprit) + 1;
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
      *culprit = static_cast<int>(w - 1);
      return s;
    }
  return -1;
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

// Marks the rank broken (relaying it to every peer the first time, blaming
// `culprit`) and, if nothing was recorded yet, records `r`. Every other waiter
// of this rank sees `broken` and gives up too.
__device__ inline void report_breaking(report* rep, const abort_link& link, int culprit,
                                       const report& r) {
  if (atomicExch(&rep->broken, 1) == 0) relay_abort(link, culprit);
  if (!claim_report(rep)) return;
  rep->peer = r.peer;
  rep->what = r.what;
  rep->expected = r.expected;
  rep->seen = r.seen;
  rep->reporter = r.reporter;
  rep->cause[0] = '\0';
  __threadfence();
  atomicExch(reinterpret_cast<int*>(&rep->code), static_cast<int>(r.code));
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

// Over an RMA transport: a channel call that did not succeed breaks the call
// like a deadline (recorded and relayed). Returns whether it succeeded.
__device__ inline bool channel_ok(report* rep, const abort_link& link,
                                  proxy::channel_status status) {
  if (status == proxy::channel_status::ok) return true;
  report r{};
  r.code = failure::proxy;
  r.peer = no_peer;
  r.seen = static_cast<std::int64_t>(status);
  report_breaking(rep, link, link.rank, r);
  return false;
}

// Spins until *counter >= expected (acquire). Returns false, without hanging,
// when timeout_ns pass first (recorded, attributed to `peer`), when a peer
// aborted (recorded, and relayed on), or when another thread of this rank
// has already failed.
__device__ inline bool wait_at_least(const std::uint64_t* counter, std::uint64_t expected,
                                     std::uint64_t timeout_ns, report* rep, const abort_link& link,
                                     int peer, waited_for what) {
  const std::uint64_t start = now_ns();
  for (std::uint32_t spin = 1;; ++spin) {
    const std::uint64_t v = load_acquire(counter);
    if (v >= expected) return true;
    // Reading the clock and the flag costs more than the load: check them
    // every few polls only.
    if ((spin & 31u) == 0) {
      if (is_broken(rep)) return false;
      report r{};
      r.what = what;
      int culprit = 0;
      if (const int reporter = find_peer_abort(link, &culprit); reporter >= 0) {
        r.code = failure::peer_aborted;
        r.peer = culprit;
        r.reporter = reporter;
        report_breaking(rep, link, culprit, r);
        return false;
      }
      if (now_ns() - start > timeout_ns) {
        r.code = failure::deadline;
        r.peer = peer;
        r.expected = static_cast<std::int64_t>(expected);
        r.seen = static_cast<std::int64_t>(v);
        report_breaking(rep, link, peer, r);
        return false;
      }
    }
  }
}

}  // namespace epcomm::cuda::device
