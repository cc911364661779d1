// Normal mode's route over an RMA transport (libfabric, UCX), written once
// for the host engine (normal/buffer.hpp) and the kernels (normal/cuda/):
// which bytes of a rank's symmetric buffer are put where in a peer's, in
// which order, with which counted signal. A rank writes what leaves it into
// the staging regions of its own buffer (wire::region_plan's send_*) and
// pushes these descriptors to its proxy; rows for itself it stores in place,
// and only signals itself (its counters are the transport's, in host
// memory, so even that signal goes through the proxy).
//
// The pushes take any channel-like pusher: a kernel passes a
// proxy::channel_writer (channel::writer()), one per run of pushes, which
// reads the ring's shared words over PCIe only when it must; the host engine
// passes the proxy engine's writer (proxy::engine_writer). The host tests
// replay the same templates against simulated rank buffers
// (tests/normal/test_cuda_normal_route.cpp), and the host engine's suites run
// them over libfabric and UCX.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "epcomm/core/config.hpp"
#include "epcomm/normal/count_matrix.hpp"
#include "epcomm/normal/window.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/proxy/push_or_return.hpp"

namespace epcomm::cuda {

// What a normal-mode kernel pushes through.
struct normal_route {
  int via_proxy;         // 0: peer-mapped stores; channels unused
  proxy::channel data;   // one producer: the kernels of a call are stream-ordered
  proxy::channel abort;  // the abort relay's (abort_link.hpp)
};

static_assert(std::is_trivially_copyable_v<normal_route>);

}  // namespace epcomm::cuda

// Each push function pushes its descriptors in order and stops at the first
// status other than ok, which it returns.
namespace epcomm::normal_push {

// The sizes of one call's rows, as the wire lays them out: packed with the
// call's hidden and top-k, not the buffer's maxima.
struct row_shape {
  std::size_t x;       // hidden * token bytes
  std::size_t scales;  // (hidden / 128) * sizeof(float) (fp8), else 0
  std::size_t topk;    // K
  std::size_t out;     // hidden * combine element bytes
};

// Where dispatch's x rows leave from. Staged (positions null): by
// destination in send_x, like the other arrays. Unstaged: the caller wrote
// its tokens into send_tokens (the host engine's dispatch_send_buffer), in
// token order; positions[t * world + r] is token t's row among those sent
// to r, or -1 (layout::send_pos). A run of consecutive tokens bound for one
// rank lands in consecutive rows there (rows keep source order), so each
// run is one put.
struct x_source {
  const int* positions = nullptr;
  int num_tokens = 0;
};

// The notify round: this rank's staged slot for each peer (send_notify, one
// slot per destination) into its slot there, with the notify signal.
template <class Channel>
EPCOMM_HD proxy::channel_status notify(Channel&& ch, const wire::region_plan& pl, int world,
                                       int rank, std::size_t bytes) {
  for (int p = 0; p < world; ++p)
    EPCOMM_PUSH_OR_RETURN(ch.put_signal(
        p, pl.send_notify + p * pl.notify_slot_bytes, pl.notify + rank * pl.notify_slot_bytes,
        bytes, wire::signal_slot(wire::signal_kind::notify, rank, world), 1));
  return proxy::channel_status::ok;
}

// The readiness round: the one staged combine status into every peer's slot.
template <class Channel>
EPCOMM_HD proxy::channel_status combine_status(Channel&& ch, const wire::region_plan& pl, int world,
                                               int rank, std::size_t bytes) {
  for (int p = 0; p < world; ++p)
    EPCOMM_PUSH_OR_RETURN(ch.put_signal(
        p, pl.send_combine_status, pl.combine_status + rank * pl.combine_status_slot_bytes, bytes,
        wire::signal_slot(wire::signal_kind::combine_ready, rank, world), 1));
  return proxy::channel_status::ok;
}

// x's rows for destination r from x_source's runs, each one put.
template <class Channel>
EPCOMM_HD proxy::channel_status x_runs(Channel&& ch, const wire::region_plan& pl, int world, int r,
                                       std::size_t to, std::size_t row_x, const x_source& xs) {
  for (int t = 0, end = 0; t < xs.num_tokens; t = end) {
    end = t + 1;
    const int pos = xs.positions[static_cast<std::size_t>(t) * world + r];
    if (pos < 0) continue;
    while (end < xs.num_tokens && xs.positions[static_cast<std::size_t>(end) * world + r] >= 0)
      ++end;
    EPCOMM_PUSH_OR_RETURN(ch.put(r, pl.send_tokens + static_cast<std::size_t>(t) * row_x,
                                 pl.recv_x + (to + static_cast<std::size_t>(pos)) * row_x,
                                 static_cast<std::size_t>(end - t) * row_x));
  }
  return proxy::channel_status::ok;
}

// `n` dispatch rows for r, one put per array from this rank's staged rows at
// `from` (send_*; x from `xs` when it names the caller's tokens) to r's rows
// at `to` (recv_*), the source indices last with the data signal.
template <class Channel>
EPCOMM_HD proxy::channel_status row_puts(Channel&& ch, const wire::region_plan& pl, int world,
                                         int r, std::size_t from, std::size_t to, std::size_t n,
                                         const row_shape& rs, const x_source& xs,
                                         std::size_t data) {
  const std::size_t idx = rs.topk * sizeof(std::int64_t);
  const std::size_t w = rs.topk * sizeof(float);
  if (xs.positions == nullptr)
    EPCOMM_PUSH_OR_RETURN(ch.put(r, pl.send_x + from * rs.x, pl.recv_x + to * rs.x, n * rs.x));
  else
    EPCOMM_PUSH_OR_RETURN(x_runs(ch, pl, world, r, to, rs.x, xs));
  if (rs.scales != 0)
    EPCOMM_PUSH_OR_RETURN(ch.put(r, pl.send_scales + from * rs.scales,
                                 pl.recv_scales + to * rs.scales, n * rs.scales));
  if (rs.topk != 0) {  // 0: a dispatch from a cached handle moves no routing
    EPCOMM_PUSH_OR_RETURN(
        ch.put(r, pl.send_topk_idx + from * idx, pl.recv_topk_idx + to * idx, n * idx));
    EPCOMM_PUSH_OR_RETURN(ch.put(r, pl.send_weights + from * w, pl.recv_weights + to * w, n * w));
  }
  return ch.put_signal(r, pl.send_src_idx + from * sizeof(std::int32_t),
                       pl.recv_src_idx + to * sizeof(std::int32_t), n * sizeof(std::int32_t), data,
                       1);
}

// Dispatch rows: per destination with rows (not this rank: stored there
// directly), row_puts from the staged rows to their final rows; a bare
// signal where there are none, or for every rank when the call was rejected
// (the agreement to reject). counts: the count matrix of the notify round.
template <class Channel>
EPCOMM_HD proxy::channel_status rows(Channel&& ch, const wire::region_plan& pl, int world, int rank,
                                     const int* counts, const row_shape& rs, bool accepted,
                                     const x_source& xs = {}) {
  const std::size_t data = wire::signal_slot(wire::signal_kind::data, rank, world);
  for (int r = 0; r < world; ++r) {
    const std::size_t n = accepted ? static_cast<std::size_t>(counts[rank * world + r]) : 0;
    if (n == 0 || r == rank)
      EPCOMM_PUSH_OR_RETURN(ch.signal(r, data, 1));
    else
      EPCOMM_PUSH_OR_RETURN(row_puts(
          ch, pl, world, r, static_cast<std::size_t>(return_offset(counts, world, rank, r)),
          static_cast<std::size_t>(recv_offset(counts, world, rank, r)), n, rs, xs, data));
  }
  return proxy::channel_status::ok;
}

// One round of a dispatch in windows (normal/window.hpp): per destination
// but this rank (which stores into its own window), the round's slice of
// this rank's rows for it, staged in send_* at r's window (r * W rows in),
// into r's window for this rank (rank * W rows in); a bare signal where the
// slice is empty.
template <class Channel>
EPCOMM_HD proxy::channel_status window_rows(Channel&& ch, const wire::region_plan& pl, int world,
                                            int rank, const int* counts, int round, int window_rows,
                                            const row_shape& rs) {
  const std::size_t data = wire::signal_slot(wire::signal_kind::data, rank, world);
  const std::size_t w = static_cast<std::size_t>(window_rows);
  for (int r = 0; r < world; ++r) {
    const int n = wire::slice_of(counts[rank * world + r], round, window_rows).rows;
    if (n == 0 || r == rank)
      EPCOMM_PUSH_OR_RETURN(ch.signal(r, data, 1));
    else
      EPCOMM_PUSH_OR_RETURN(row_puts(ch, pl, world, r, r * w, rank * w, n, rs, {}, data));
  }
  return proxy::channel_status::ok;
}

// `n` combine rows for s from the staged rows at `from` (send_combine_*) to
// s's combine rows at `to`, then their weights when given, the last put with
// the combine-data signal.
template <class Channel>
EPCOMM_HD proxy::channel_status combine_puts(Channel&& ch, const wire::region_plan& pl, int s,
                                             std::size_t from, std::size_t to, std::size_t n,
                                             const row_shape& rs, bool weights, std::size_t done) {
  const std::size_t w = rs.topk * sizeof(float);
  if (!weights)
    return ch.put_signal(s, pl.send_combine_x + from * rs.out, pl.combine_x + to * rs.out,
                         n * rs.out, done, 1);
  EPCOMM_PUSH_OR_RETURN(
      ch.put(s, pl.send_combine_x + from * rs.out, pl.combine_x + to * rs.out, n * rs.out));
  return ch.put_signal(s, pl.send_combine_weights + from * w, pl.combine_weights + to * w, n * w,
                       done, 1);
}

// Combine rows: the rows source s sent here, staged in receive order
// (send_combine_x from recv_offset(s, rank)), back into s's combine region at
// return_offset(s, rank), with combine_puts; a bare signal where there are
// none, for this rank (stored in place) and for everyone when the call was
// rejected.
template <class Channel>
EPCOMM_HD proxy::channel_status combine_rows(Channel&& ch, const wire::region_plan& pl, int world,
                                             int rank, const int* counts, const row_shape& rs,
                                             bool weights, bool accepted) {
  const std::size_t done = wire::signal_slot(wire::signal_kind::combine_data, rank, world);
  for (int s = 0; s < world; ++s) {
    const std::size_t n = accepted ? static_cast<std::size_t>(counts[s * world + rank]) : 0;
    if (n == 0 || s == rank)
      EPCOMM_PUSH_OR_RETURN(ch.signal(s, done, 1));
    else
      EPCOMM_PUSH_OR_RETURN(combine_puts(
          ch, pl, s, static_cast<std::size_t>(recv_offset(counts, world, s, rank)),
          static_cast<std::size_t>(return_offset(counts, world, s, rank)), n, rs, weights, done));
  }
  return proxy::channel_status::ok;
}

// One round of a combine in windows: per source but this rank, the round's
// slice of the rows it sent here, staged in send_combine_* at s's window,
// into s's combine window for this rank; a bare signal where it is empty.
template <class Channel>
EPCOMM_HD proxy::channel_status window_combine_rows(Channel&& ch, const wire::region_plan& pl,
                                                    int world, int rank, const int* counts,
                                                    int round, int window_rows, const row_shape& rs,
                                                    bool weights) {
  const std::size_t done = wire::signal_slot(wire::signal_kind::combine_data, rank, world);
  const std::size_t w = static_cast<std::size_t>(window_rows);
  for (int s = 0; s < world; ++s) {
    const int n = wire::slice_of(counts[s * world + rank], round, window_rows).rows;
    if (n == 0 || s == rank)
      EPCOMM_PUSH_OR_RETURN(ch.signal(s, done, 1));
    else
      EPCOMM_PUSH_OR_RETURN(combine_puts(ch, pl, s, s * w, rank * w, n, rs, weights, done));
  }
  return proxy::channel_status::ok;
}

}  // namespace epcomm::normal_push
