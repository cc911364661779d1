// The count-exchange rounds on the device, in the host engine's wire format:
//
//   dispatch notify  every rank posts its notify_header and counts into its
//                    slot of every peer's notify region, signals
//                    (notify, rank), waits for all R slots, and judges them
//                    (judge_notify) exactly as normal/buffer.hpp does; a
//                    dispatch from a cached handle posts the header alone,
//                    with the fingerprint of the handle's count matrix, and
//                    judges the counts of that matrix, which it leaves as is;
//   combine ready    every rank posts its combine_header into every peer's
//                    combine-status region, signals (combine_ready, rank),
//                    waits for all R, and judges them (judge_combine).
//
// One block: R is at most peer_table::max_ranks, so thread p talks to peer p.
// Over an RMA transport (normal/route.hpp) the slots are staged in this
// rank's buffer and thread 0 hands the puts to the proxy, after waiting
// until every put of the previous call is complete: each round of a call
// writes staging those puts may still read.
// Call counters (epochs) live in device memory, so a captured graph stays in
// step with its peers on every replay.
#pragma once

#include <cstdint>

#include "epcomm/normal/count_matrix.hpp"
#include "epcomm/normal/cuda/launch.hpp"
#include "epcomm/normal/cuda/sync.cuh"
#include "epcomm/normal/route.hpp"
#include "epcomm/normal/verdict.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/proxy/channel.hpp"

namespace epcomm::cuda::device {

inline constexpr int notify_threads = peer_table::max_ranks;

// Copies a header into a (possibly remote) slot with 4-byte stores: the slot
// is 64-byte aligned and every wire header is a multiple of 4 bytes.
template <class Header>
__device__ __forceinline__ void store_header(std::byte* slot, const Header& h) {
  static_assert(sizeof(Header) % 4 == 0);
  const auto* src = reinterpret_cast<const std::uint32_t*>(&h);
  auto* dst = reinterpret_cast<std::uint32_t*>(slot);
  for (std::size_t i = 0; i < sizeof(Header) / 4; ++i) dst[i] = src[i];
}

// Over RMA: thread 0 waits until the proxy completed every put pushed so far,
// so that the staging may be written again. Block-wide; false on failure.
template <class Args>
__device__ inline bool staging_free(const Args& a, report* rep) {
  __shared__ int quiet;
  if (threadIdx.x == 0)
    quiet = a.route.via_proxy == 0 || channel_ok(rep, abort_link_of(a), a.route.data.quiet());
  __syncthreads();
  return quiet != 0;
}

// Every thread calls this after its waits; true when all of them succeeded.
__device__ __forceinline__ bool all_waits_succeeded(bool mine) {
  return __syncthreads_and(mine ? 1 : 0) != 0;
}

template <int Ranks>
__global__ void __launch_bounds__(notify_threads)
    notify_kernel(const __grid_constant__ dispatch_args a) {
  __shared__ wire::notify_header hdr;
  __shared__ std::uint64_t epoch;
  report* rep = a.ws.rep;
  if (block_is_broken(rep)) return;
  const int world = Ranks > 0 ? Ranks : a.peers.world_size;
  const int rank = a.peers.rank;
  const int per_rank = a.num_experts / world;
  const std::size_t slot_bytes = a.plan.notify_slot_bytes;
  const bool rma = a.route.via_proxy != 0;
  const bool cached = a.cached != 0;
  if (!staging_free(a, rep)) return;

  if (threadIdx.x == 0) {
    epoch = ++*a.ws.dispatch_epoch;
    hdr = wire::notify_header{};
    hdr.magic = wire::magic;
    hdr.epoch = epoch;
    hdr.num_tokens = a.num_tokens;
    hdr.hidden = a.hidden;
    hdr.topk = a.topk;
    hdr.num_experts = a.num_experts;
    hdr.token_id = a.token_id;
    hdr.recv_bound = a.recv_bound;
    hdr.routing = cached ? routing_fingerprint(a.ws.count_matrix, world, *a.ws.origin) : 0;
    const std::uint64_t bad = *a.ws.first_invalid;
    if (a.host_cause[0] != '\0') {
      hdr.state = wire::status::invalid_input;
      cause_text(hdr.cause, wire::cause_bytes) << a.host_cause;
    } else if (bad != ~std::uint64_t{0}) {
      hdr.state = wire::status::invalid_input;
      describe_invalid_expert(hdr.cause, wire::cause_bytes, static_cast<long long>(bad), a.topk,
                              a.topk_idx[bad], a.num_experts);
    } else {
      hdr.state = wire::status::ok;
    }
    *a.ws.first_invalid = ~std::uint64_t{0};  // the layout of this call has been read
  }
  __syncthreads();

  // A rejected input posts zero counts, as the host engine does.
  const bool valid = hdr.state == wire::status::ok;
  for (int p = threadIdx.x; p < world; p += blockDim.x) {
    std::byte* slot = rma ? a.peers.buffer[rank] + a.plan.send_notify + slot_bytes * p
                          : a.peers.buffer[p] + a.plan.notify + slot_bytes * rank;
    store_header(slot, hdr);
    auto* counts = reinterpret_cast<std::int32_t*>(slot + sizeof(wire::notify_header));
    for (int r = 0; r < world && !cached; ++r) counts[r] = valid ? a.ws.tokens_per_rank[r] : 0;
    for (int e = 0; e < per_rank && !cached; ++e)
      counts[world + e] = valid ? a.ws.tokens_per_expert[p * per_rank + e] : 0;
    if (!rma)
      add_release(a.peers.signals[p] + wire::signal_slot(wire::signal_kind::notify, rank, world),
                  1);
  }
  if (rma) {
    __threadfence_system();  // the staged slots, before the puts that read them
    __syncthreads();
    if (threadIdx.x == 0)
      channel_ok(rep, abort_link_of(a),
                 normal_push::notify(a.route.data.writer(), a.plan, world, rank,
                                     sizeof(wire::notify_header) +
                                         (cached ? 0 : sizeof(std::int32_t) * (world + per_rank))));
  }

  bool ok = true;
  const std::uint64_t* mine = a.peers.signals[rank];
  for (int s = threadIdx.x; s < world; s += blockDim.x)
    ok = ok && wait_at_least(mine + wire::signal_slot(wire::signal_kind::notify, s, world), epoch,
                             a.timeout_ns, rep, abort_link_of(a), a.ws.exited, s,
                             waited_for::notify_counts);
  if (!all_waits_succeeded(ok)) return;

  if (threadIdx.x == 0) {
    const std::byte* region = a.peers.buffer[rank] + a.plan.notify;
    report verdict{};
    judge_notify(region, slot_bytes, world, rank, epoch, a.max_recv_tokens, verdict,
                 cached ? a.ws.count_matrix : nullptr);
    const bool accepted = verdict.code == failure::none;
    if (cached) {
      // The handle's routing stays; the result has no per-expert counts.
      if (!accepted) report_verdict(rep, verdict);
    } else if (accepted) {
      gather_count_matrix(region, slot_bytes, world, a.ws.count_matrix);
      *a.ws.origin = epoch;
      for (int e = 0; e < per_rank; ++e) {
        int n = 0;
        for (int s = 0; s < world; ++s) n += notify_counts_at(region, slot_bytes, s)[world + e];
        a.ws.recv_per_expert[e] = aligned_expert_count(n, a.expert_alignment);
      }
    } else {
      report_verdict(rep, verdict);
      for (int i = 0; i < world * world; ++i) a.ws.count_matrix[i] = 0;
      for (int e = 0; e < per_rank; ++e) a.ws.recv_per_expert[e] = 0;
    }
    const int received =
        accepted ? static_cast<int>(total_received(a.ws.count_matrix, world, rank)) : 0;
    *a.ws.num_recv = received;
    rep->num_recv_tokens = received;
    a.ws.accepted[0] = accepted ? 1 : 0;
  }
}

template <int Ranks>
__global__ void __launch_bounds__(notify_threads)
    combine_ready_kernel(const __grid_constant__ combine_args a) {
  __shared__ wire::combine_header hdr;
  __shared__ std::uint64_t epoch;
  report* rep = a.ws.rep;
  if (block_is_broken(rep)) return;
  const int world = Ranks > 0 ? Ranks : a.peers.world_size;
  const int rank = a.peers.rank;
  const std::size_t slot_bytes = a.plan.combine_status_slot_bytes;
  const bool rma = a.route.via_proxy != 0;
  if (!staging_free(a, rep)) return;

  if (threadIdx.x == 0) {
    epoch = ++*a.ws.combine_epoch;
    hdr = wire::combine_header{};
    hdr.epoch = epoch;
    hdr.with_weights = a.y_weights != nullptr ? 1 : 0;
    hdr.out_id = a.out_id;
    const int received = *a.ws.num_recv;
    if (a.host_cause[0] != '\0') {
      hdr.state = wire::status::invalid_input;
      cause_text(hdr.cause, wire::cause_bytes) << a.host_cause;
    } else if (a.y_rows < received) {
      hdr.state = wire::status::invalid_input;
      describe_short_y(hdr.cause, wire::cause_bytes, a.y_rows * a.hidden, a.hidden, received);
    } else {
      hdr.state = wire::status::ok;
      // ws holds the routing of the handle's dispatch (its slot).
      hdr.routing = routing_fingerprint(a.ws.count_matrix, world, *a.ws.origin);
    }
  }
  __syncthreads();

  if (rma) {
    if (threadIdx.x == 0) {
      store_header(a.peers.buffer[rank] + a.plan.send_combine_status, hdr);
      __threadfence_system();
      channel_ok(
          rep, abort_link_of(a),
          normal_push::combine_status(a.route.data.writer(), a.plan, world, rank, sizeof hdr));
    }
  } else {
    for (int p = threadIdx.x; p < world; p += blockDim.x) {
      store_header(a.peers.buffer[p] + a.plan.combine_status + slot_bytes * rank, hdr);
      add_release(
          a.peers.signals[p] + wire::signal_slot(wire::signal_kind::combine_ready, rank, world), 1);
    }
  }

  bool ok = true;
  const std::uint64_t* mine = a.peers.signals[rank];
  for (int s = threadIdx.x; s < world; s += blockDim.x)
    ok = ok && wait_at_least(mine + wire::signal_slot(wire::signal_kind::combine_ready, s, world),
                             epoch, a.timeout_ns, rep, abort_link_of(a), a.ws.exited, s,
                             waited_for::combine_readiness);
  if (!all_waits_succeeded(ok)) return;

  if (threadIdx.x == 0) {
    report verdict{};
    judge_combine(a.peers.buffer[rank] + a.plan.combine_status, slot_bytes, world, rank, epoch,
                  verdict);
    if (verdict.code != failure::none) report_verdict(rep, verdict);
    a.ws.accepted[1] = verdict.code == failure::none ? 1 : 0;
  }
}

}  // namespace epcomm::cuda::device
