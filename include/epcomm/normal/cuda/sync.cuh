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

// Records `r` (filled by a verdict, judge_notify or judge_combine, or by a
// failed wait) unless an earlier failure is pending.
__device__ inline void report_verdict(report* rep, const report& r) {
  record_first_failure(&rep->code, r.code, [&] {
    copy_fields(*rep, r, &report::peer, &report::what, &report::field, &report::expected,
                &report::seen, &report::reporter, &report::reference);
    for (int i = 0; i < wire::cause_bytes; ++i) rep->cause[i] = r.cause[i];
  });
}

// Marks the rank broken (relaying it to every peer the first time, blaming
// `culprit`) and, if nothing was recorded yet, records `r`. Every other waiter
// of this rank sees `broken` and gives up too.
__device__ inline void report_breaking(report* rep, const abort_link& link, int culprit,
                                       const report& r) {
  if (atomicExch(&rep->broken, 1) == 0) relay_abort(link, culprit);
  report_verdict(rep, r);
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

// A peer's abort word, if one is set: records it (which relays it on, still
// blaming the peer's culprit) and returns true.
__device__ inline bool peer_aborted(report* rep, const abort_link& link, waited_for what) {
  report r{};
  const int reporter = find_peer_abort(link, &r.peer);
  if (reporter < 0) return false;
  r.code = failure::peer_aborted;
  r.what = what;
  r.reporter = reporter;
  report_breaking(rep, link, r.peer, r);
  return true;
}

// Spins until *counter >= expected (acquire). Returns false, without hanging,
// when timeout_ns pass first (recorded, attributed to `peer`), when `peer`'s
// process exited (recorded: `exited` holds the host's exit watch's words,
// cuda/exit_watch.hpp; null when the transport cannot tell), when a peer
// aborted (recorded, and relayed on), or when another thread of this rank
// has already failed.
__device__ inline bool wait_at_least(const std::uint64_t* counter, std::uint64_t expected,
                                     std::uint64_t timeout_ns, report* rep, const abort_link& link,
                                     const std::uint64_t* exited, int peer, waited_for what) {
  const auto late = [&](std::uint64_t seen) {
    report r{};
    r.code = failure::deadline;
    r.peer = peer;
    r.what = what;
    r.expected = static_cast<std::int64_t>(expected);
    r.seen = static_cast<std::int64_t>(seen);
    report_breaking(rep, link, peer, r);
  };
  const auto gone = [&] {
    if (exited == nullptr || load_acquire(exited + peer) == 0) return false;
    report r{};
    r.code = failure::peer_exited;
    r.peer = peer;
    r.what = what;
    report_breaking(rep, link, peer, r);
    return true;
  };
  return wait_bounded(
      counter, expected, timeout_ns,
      [&] { return is_broken(rep) || peer_aborted(rep, link, what) || gone(); }, late);
}

}  // namespace epcomm::cuda::device
