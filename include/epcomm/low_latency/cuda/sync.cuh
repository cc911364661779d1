// Device-side waits and failure records of the low-latency kernels: the
// system-scope acquire loads and release adds of device_sync.cuh, a bounded
// wait that records who was late in an ll_report instead of hanging, the
// "first failure wins" record of a verdict, and the abort relay
// (abort_link.hpp) that carries a breaking failure to every peer.
#pragma once

#include <cstdint>

#include "epcomm/cuda/device_sync.cuh"
#include "epcomm/low_latency/report.hpp"
#include "epcomm/proxy/channel.hpp"

namespace epcomm::cuda::device {

// Records `r` (filled by a verdict function) unless a failure the host has
// not read yet is pending: the first one of a call wins. A breaking failure
// also sets `broken`, which makes every other waiter of this rank give up,
// and the first one tells every peer through `link`, blaming the rank it
// names (the relayed culprit for a relayed abort, this rank if none).
__device__ inline void ll_record(ll_report* rep, const ll_report& r, const abort_link& link) {
  if (ll_breaks_buffer(r.code) && atomicExch(&rep->broken, 1) == 0)
    relay_abort(link, r.peer >= 0 ? r.peer : link.rank);
  record_first_failure(&rep->code, r.code, [&] {
    copy_fields(*rep, r, &ll_report::peer, &ll_report::what, &ll_report::op, &ll_report::expected,
                &ll_report::seen, &ll_report::index, &ll_report::src_rank, &ll_report::src_token,
                &ll_report::src_slot);
    for (int i = 0; i < wire::cause_bytes; ++i) rep->cause[i] = r.cause[i];
  });
}

// A peer's abort word, if one is set: records it (which relays it on) and
// returns true.
__device__ inline bool ll_peer_aborted(ll_report* rep, const abort_link& link, ll_op op,
                                       ll_waited_for what) {
  int culprit = 0;
  const int reporter = find_peer_abort(link, &culprit);
  if (reporter < 0) return false;
  ll_report r{};
  r.code = ll_failure::peer_aborted;
  r.peer = culprit;
  r.src_rank = reporter;
  r.what = what;
  r.op = op;
  ll_record(rep, r, link);
  return true;
}

// Spins until *counter >= expected (acquire). Returns false, without hanging,
// when timeout_ns pass first (recorded as a deadline attributed to `peer`),
// when a peer aborted (recorded), when another thread of this rank has
// already failed, or when gave_up() (asked now and then) says so (recorded
// by no one). `waited_ns`, when given, receives how long the wait took.
template <class GaveUp>
__device__ inline bool ll_wait(const std::uint64_t* counter, std::uint64_t expected,
                               std::uint64_t timeout_ns, ll_report* rep, const abort_link& link,
                               ll_op op, int peer, ll_waited_for what, GaveUp gave_up,
                               std::uint64_t* waited_ns = nullptr) {
  const auto late = [&](std::uint64_t seen) {
    ll_report r{};
    r.code = ll_failure::deadline;
    r.peer = peer;
    r.what = what;
    r.op = op;
    r.expected = static_cast<std::int64_t>(expected);
    r.seen = static_cast<std::int64_t>(seen);
    ll_record(rep, r, link);
  };
  return wait_bounded(
      counter, expected, timeout_ns,
      [&] { return is_broken(rep) || ll_peer_aborted(rep, link, op, what) || gave_up(); }, late,
      waited_ns);
}

// Over an RMA transport: a channel call that did not succeed breaks the
// call like a deadline (recorded and relayed). Returns whether it succeeded.
__device__ inline bool ll_channel_ok(ll_report* rep, const abort_link& link, ll_op op,
                                     proxy::channel_status status) {
  if (status == proxy::channel_status::ok) return true;
  ll_report r{};
  r.code = ll_failure::proxy;
  r.peer = no_peer;
  r.op = op;
  r.seen = static_cast<std::int64_t>(status);
  ll_record(rep, r, link);
  return false;
}

// The last of a kernel's blocks to get here returns true, after every
// block's stores (local and remote) are ordered before whatever it does
// next. `done` is reset for the next launch, which is stream-ordered after
// this one. Must be reached by every thread of every block.
__device__ inline bool ll_last_block(std::uint32_t* done) {
  __shared__ int last;
  // Every thread fences its own stores (the memory model's cumulativity
  // through the barrier would cover them too; the warps wait in parallel).
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done, 1u) == gridDim.x - 1 ? 1 : 0;
    if (last != 0) {
      __threadfence_system();
      *done = 0;
    }
  }
  __syncthreads();
  return last != 0;
}

}  // namespace epcomm::cuda::device
