// The bounded waits and failure records of the normal-mode kernels: a wait
// on a signal counter (cuda/device_sync.cuh) that records who was late in the
// call's report (normal/report.hpp) instead of hanging, and relays a breaking
// failure to every peer.
#pragma once

#include <cstdint>

#include "epcomm/cuda/abort_link.hpp"
#include "epcomm/cuda/device_sync.cuh"
#include "epcomm/normal/report.hpp"
#include "epcomm/proxy/channel.hpp"

namespace epcomm::cuda::device {

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
  rep->reference = r.reference;
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
