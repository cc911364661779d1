// How the low-latency kernels reach other ranks. Over a peer-mapped device
// transport (nvlink_ipc) they store into peers' buffers and signal with
// release adds (peer_table). Over an RMA transport (libfabric, UCX) they
// cannot: they write what leaves the rank into its own buffer (the plan's
// staging regions, or combine_send), and one thread of the phase's last
// block hands the writes to the proxy through a proxy::channel, in the order
// the protocol needs, exactly as the host engine's RMA path issues them
// (low_latency/rma.hpp). Writes to the rank itself are stores either way;
// count words and signals to itself go through the proxy too, because this
// rank's counters are the transport's, in host memory.
//
// The pushes take any channel-like pusher. A kernel passes a
// proxy::channel_writer (channel::writer()), one per run of pushes, which
// reads the ring's shared words over PCIe only when it must; the host tests
// replay the same templates against a recording channel (tests/low_latency/test_cuda_ll_route.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "epcomm/core/config.hpp"
#include "epcomm/low_latency/rma.hpp"
#include "epcomm/low_latency/wire.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/proxy/push_or_return.hpp"

namespace epcomm::cuda {

struct ll_route {
  int via_proxy;  // 0: peer-mapped stores; channels unused
  // The channel of each parity's calls. Its one producer is the pushing
  // thread of whichever phase of that parity runs: the phases of a parity
  // are stream-ordered, so two never push at once.
  proxy::channel parity[wire::ll::parities];
  proxy::channel abort;  // the abort relay's (abort_link.hpp)
};

static_assert(std::is_trivially_copyable_v<ll_route>);

// Each push function pushes its descriptors in order and stops at the first
// status other than ok, which it returns.
namespace ll_push {

template <class Channel>
EPCOMM_HD proxy::channel_status put(Channel&& ch, const wire::ll::rma_write& w) {
  return ch.put(w.peer, w.local, w.remote, w.bytes);
}
template <class Channel>
EPCOMM_HD proxy::channel_status put_signal(Channel&& ch, const wire::ll::rma_write& w) {
  return ch.put_signal(w.peer, w.local, w.remote, w.bytes, w.slot, 1);
}

// A dispatch's publication, once its records, count words (and reject
// record) are staged: per destination rank, the reject record (a rejected
// call), then per expert of that rank its staged records (not to this rank:
// stored there directly) and its count word with the region's signal, which
// the transport delivers after every earlier write to that rank landed.
// counts[e]: records for global expert e; unread when `rejected`.
template <class Channel>
EPCOMM_HD proxy::channel_status dispatch(Channel&& ch, const wire::ll::shape& s,
                                         const wire::ll::plan& pl, int parity, int rank,
                                         const int* counts, bool rejected) {
  const int el = s.local_experts();
  for (int r = 0; r < s.world_size; ++r) {
    if (rejected && r != rank)
      EPCOMM_PUSH_OR_RETURN(
          put(ch, wire::ll::reject_write(s, pl, parity, rank, wire::ll::reject_kind::dispatch, r)));
    for (int e = r * el; e < (r + 1) * el; ++e) {
      if (!rejected && r != rank && counts[e] > 0)
        EPCOMM_PUSH_OR_RETURN(put(ch, wire::ll::records_write(s, pl, parity, rank, e, counts[e])));
      EPCOMM_PUSH_OR_RETURN(put_signal(ch, wire::ll::dispatch_count_write(s, pl, parity, rank, e)));
    }
  }
  return proxy::channel_status::ok;
}

// A combine's rows to other ranks, put from combine_send: every valid row
// of every local expert (recv_count, recv_src: this parity's dispatch
// outputs) whose source is not this rank.
template <class Channel>
EPCOMM_HD proxy::channel_status combine_rows(Channel&& ch, const wire::ll::shape& s,
                                             const wire::ll::plan& pl, int parity, int rank,
                                             const std::int32_t* recv_count,
                                             const wire::ll::source* recv_src) {
  for (int le = 0; le < s.local_experts(); ++le) {
    const std::size_t first = static_cast<std::size_t>(le) * s.rows_per_expert();
    for (std::size_t row = first; row < first + static_cast<std::size_t>(recv_count[le]); ++row)
      if (recv_src[row].rank != rank)
        EPCOMM_PUSH_OR_RETURN(
            put(ch, wire::ll::combine_row_write(s, pl, parity, row, recv_src[row])));
  }
  return proxy::channel_status::ok;
}

// A combine's count words (staged), each after the reject record of a
// rejected call, with this rank's combine signal at every source.
template <class Channel>
EPCOMM_HD proxy::channel_status combine_counts(Channel&& ch, const wire::ll::shape& s,
                                               const wire::ll::plan& pl, int parity, int rank,
                                               bool rejected) {
  for (int r = 0; r < s.world_size; ++r) {
    if (rejected && r != rank)
      EPCOMM_PUSH_OR_RETURN(
          put(ch, wire::ll::reject_write(s, pl, parity, rank, wire::ll::reject_kind::combine, r)));
    EPCOMM_PUSH_OR_RETURN(put_signal(ch, wire::ll::combine_count_write(s, pl, parity, rank, r)));
  }
  return proxy::channel_status::ok;
}

// The end of a dispatch's receive phase: this parity's regions at this rank
// may be written again by every source.
template <class Channel>
EPCOMM_HD proxy::channel_status release(Channel&& ch, const wire::ll::shape& s, int parity,
                                        int rank) {
  for (int r = 0; r < s.world_size; ++r)
    EPCOMM_PUSH_OR_RETURN(ch.signal(r, wire::ll::released_signal(s, parity, rank), 1));
  return proxy::channel_status::ok;
}

}  // namespace ll_push
}  // namespace epcomm::cuda
