// Normal-mode dispatch payload over peer-mapped memory, after the notify
// round has fixed the count matrix. Warp-specialised:
//
//   sender blocks   one warp per token: read the row once (16-byte vectors),
//                   store it straight into its final row at every destination
//                   rank, (recv_offset(rank, r) + send_pos[t][r]) in the host
//                   engine's layout, with scales, rewritten top-k ids, weights
//                   and the source index. The last sender block to finish
//                   publishes (data, rank) at every peer with a release add;
//   receiver block  one warp waits, with a deadline, for (data, s) from every
//                   source s, while the others pad the rows past the received
//                   count up to the caller's worst-case bound.
//
// Over an RMA transport (normal/route.hpp) rows for other ranks are staged
// by destination in this rank's buffer and the last sender block's thread 0
// hands the puts, which carry the data signal, to the proxy.
//
// After a rejected notify round the senders move nothing but still publish,
// and the receiver still waits: that is the host engine's "agreement to
// reject" round, which keeps a fast rank from overwriting slots a slow one
// has not read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/core/layout.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/cuda/warp_copy.cuh"
#include "epcomm/normal/count_matrix.hpp"
#include "epcomm/normal/cuda/kernel_thread.cuh"
#include "epcomm/normal/cuda/launch.hpp"
#include "epcomm/normal/cuda/sync.cuh"
#include "epcomm/normal/route.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/proxy/channel.hpp"

namespace epcomm::cuda::device {

inline constexpr int dispatch_warps = 8;
inline constexpr int dispatch_threads = dispatch_warps * warp_size;

// Per sender warp: the destinations of its current token.
struct destinations {
  int* rank;         // [R]
  int* row;          // [R] row at that rank
  std::byte** addr;  // [R] address of the field being copied
};

__host__ __device__ constexpr std::size_t dispatch_shared_bytes(int world) {
  return static_cast<std::size_t>(dispatch_warps) * world * (sizeof(std::byte*) + 2 * sizeof(int));
}

__device__ __forceinline__ unsigned lanes_below(int lane) { return (1u << lane) - 1u; }

// Collects token t's destinations from send_pos, in rank order; returns how
// many there are. `world` is a compile-time constant in rank-specialised
// kernels (inlined), which unrolls the scan.
__device__ __forceinline__ int collect_destinations(const dispatch_args& a, int world, int t,
                                                    const int* dest_base, destinations d,
                                                    int lane) {
  int n = 0;
  for (int c = 0; c < world; c += warp_size) {
    const int r = c + lane;
    const int pos = r < world ? a.ws.send_pos[static_cast<std::size_t>(t) * world + r] : -1;
    const unsigned goes = __ballot_sync(0xffffffffu, pos >= 0);
    if (pos >= 0) {
      const int j = n + __popc(goes & lanes_below(lane));
      d.rank[j] = r;
      d.row[j] = dest_base[r] + pos;
    }
    n += __popc(goes);
  }
  __syncwarp();
  return n;
}

// Where rows bound for rank r go: the array at `recv` in r's buffer, or,
// over RMA for another rank, its staging at `send` in this rank's.
__device__ __forceinline__ std::byte* row_array(const dispatch_args& a, int r, std::size_t recv,
                                                std::size_t send) {
  if (a.route.via_proxy != 0 && r != a.peers.rank) return a.peers.buffer[a.peers.rank] + send;
  return a.peers.buffer[r] + recv;
}

// Points d.addr[j] at row d.row[j] of rank d.rank[j]'s array (row_array),
// rows of row_bytes each.
__device__ __forceinline__ void aim(const dispatch_args& a, destinations d, int n, std::size_t recv,
                                    std::size_t send, std::size_t row_bytes, int lane) {
  __syncwarp();  // every lane is done with the previous addresses
  for (int j = lane; j < n; j += warp_size)
    d.addr[j] =
        row_array(a, d.rank[j], recv, send) + static_cast<std::size_t>(d.row[j]) * row_bytes;
  __syncwarp();
}

template <class Token, int Ranks, int Hidden>
__device__ void send_token(const dispatch_args& a, int world, int t, const int* dest_base,
                           destinations d, int lane) {
  const int n = collect_destinations(a, world, t, dest_base, d, lane);
  if (n == 0) return;
  const int hidden = Hidden > 0 ? Hidden : a.hidden;
  const std::size_t row_bytes = static_cast<std::size_t>(hidden) * sizeof(Token);
  const auto* x = static_cast<const std::byte*>(a.x) + static_cast<std::size_t>(t) * row_bytes;

  aim(a, d, n, a.plan.recv_x, a.plan.send_x, row_bytes, lane);
  if constexpr (Hidden > 0) {
    warp_copy_to_all<static_cast<std::size_t>(Hidden) * sizeof(Token)>(x, d.addr, n, lane);
  } else {
    warp_copy_to_all(x, d.addr, n, row_bytes, row_bytes | wire::alignment, lane);
  }

  if constexpr (token_traits<Token>::has_scales) {
    const std::size_t scale_bytes = static_cast<std::size_t>(hidden / 128) * sizeof(float);
    aim(a, d, n, a.plan.recv_scales, a.plan.send_scales, scale_bytes, lane);
    warp_copy_to_all(reinterpret_cast<const std::byte*>(a.x_scales) + t * scale_bytes, d.addr, n,
                     scale_bytes, scale_bytes | wire::alignment, lane);
  }

  // Top-k ids rewritten to the destination's local ids (-1 elsewhere), the
  // matching weights (0 elsewhere), and the source index: (destination, k)
  // pairs spread over the lanes.
  const int k_max = a.topk;
  const int per_rank = a.num_experts / world;
  for (int i = lane; i < n * k_max; i += warp_size) {
    const int j = i / k_max;
    const int k = i % k_max;
    const std::size_t at = static_cast<std::size_t>(d.row[j]) * k_max + k;
    const std::int64_t local =
        local_expert_id(a.topk_idx[static_cast<std::size_t>(t) * k_max + k], d.rank[j], per_rank);
    reinterpret_cast<std::int64_t*>(
        row_array(a, d.rank[j], a.plan.recv_topk_idx, a.plan.send_topk_idx))[at] = local;
    reinterpret_cast<float*>(
        row_array(a, d.rank[j], a.plan.recv_weights, a.plan.send_weights))[at] =
        local >= 0 ? a.topk_weights[static_cast<std::size_t>(t) * k_max + k] : 0.0f;
  }
  for (int j = lane; j < n; j += warp_size)
    reinterpret_cast<std::int32_t*>(
        row_array(a, d.rank[j], a.plan.recv_src_idx, a.plan.send_src_idx))[d.row[j]] = t;
  __syncwarp();
}

// True in thread 0 of the last of `senders` blocks to get here, which then
// publishes for all of them. Each block fences its own (remote) stores
// first, so they are ordered before whatever the last block does next.
__device__ inline bool last_sender(std::uint32_t* blocks_done, unsigned senders) {
  __syncthreads();
  if (threadIdx.x != 0) return false;
  __threadfence_system();
  if (atomicAdd(blocks_done, 1u) != senders - 1) return false;
  __threadfence_system();
  *blocks_done = 0;  // the next launch is stream-ordered after this one
  return true;
}

// Signal `kind` of this rank at every peer, with release adds.
__device__ inline void signal_all(const peer_table& peers, int world, wire::signal_kind kind) {
  for (int p = 0; p < world; ++p)
    add_release(peers.signals[p] + wire::signal_slot(kind, peers.rank, world), 1);
}

// Grid: senders + 1 blocks of dispatch_threads; the last block receives.
template <class Token, int Ranks, int Hidden>
__global__ void __launch_bounds__(dispatch_threads)
    dispatch_kernel(const __grid_constant__ dispatch_args a) {
  extern __shared__ std::byte dyn[];
  __shared__ int dest_base[peer_table::max_ranks];
  const auto [rep, world, rank, warp, lane] = thread_of<Ranks>(a);
  if (block_is_broken(rep)) return;
  const bool accepted = a.ws.accepted[0] != 0;
  const unsigned senders = gridDim.x - 1;

  if (blockIdx.x == senders) {
    if (warp == 0) {
      const std::uint64_t epoch = *a.ws.dispatch_epoch;
      const std::uint64_t* mine = a.peers.signals[rank];
      const waited_for what = accepted ? waited_for::token_rows : waited_for::agreement_to_reject;
      for (int s = lane; s < world; s += warp_size)
        if (!wait_at_least(mine + wire::signal_slot(wire::signal_kind::data, s, world), epoch,
                           a.timeout_ns, rep, abort_link_of(a), a.ws.exited, s, what))
          break;
    } else if (accepted && a.recv_bound > 0) {
      // Padding rows read as "routed nowhere" for callers that loop over the
      // bound; peers never write past the received count.
      std::byte* base = a.peers.buffer[rank];
      auto* idx = reinterpret_cast<std::int64_t*>(base + a.plan.recv_topk_idx);
      auto* weights = reinterpret_cast<float*>(base + a.plan.recv_weights);
      auto* src = reinterpret_cast<std::int32_t*>(base + a.plan.recv_src_idx);
      const std::size_t k = a.topk;
      const std::size_t from = static_cast<std::size_t>(*a.ws.num_recv);
      const std::size_t to = static_cast<std::size_t>(a.recv_bound);
      for (std::size_t i = from * k + threadIdx.x - warp_size; i < to * k;
           i += blockDim.x - warp_size) {
        idx[i] = -1;
        weights[i] = 0.0f;
      }
      for (std::size_t i = from + threadIdx.x - warp_size; i < to; i += blockDim.x - warp_size)
        src[i] = -1;
    }
    return;
  }

  // First row per destination: its final row there, or over RMA, for other
  // ranks, the first staged row (return_offset: staging is by destination).
  for (int r = threadIdx.x; r < world; r += blockDim.x)
    dest_base[r] = a.route.via_proxy != 0 && r != rank
                       ? return_offset(a.ws.count_matrix, world, rank, r)
                       : recv_offset(a.ws.count_matrix, world, rank, r);
  __syncthreads();

  if (accepted) {
    auto* ranks = reinterpret_cast<int*>(dyn);
    auto* rows = ranks + dispatch_warps * world;
    auto* addrs = reinterpret_cast<std::byte**>(rows + dispatch_warps * world);
    const destinations d{ranks + warp * world, rows + warp * world, addrs + warp * world};
    const int stride = static_cast<int>(senders) * dispatch_warps;
    for (int t = blockIdx.x * dispatch_warps + warp; t < a.num_tokens; t += stride)
      send_token<Token, Ranks, Hidden>(a, world, t, dest_base, d, lane);
  }
  if (!last_sender(a.ws.blocks_done, senders)) return;
  if (a.route.via_proxy == 0) {
    signal_all(a.peers, world, wire::signal_kind::data);
    return;
  }
  const int hidden = Hidden > 0 ? Hidden : a.hidden;
  const normal_push::row_shape rs{
      static_cast<std::size_t>(hidden) * sizeof(Token),
      token_traits<Token>::has_scales ? static_cast<std::size_t>(hidden / 128) * sizeof(float) : 0,
      static_cast<std::size_t>(a.topk), 0};
  channel_ok(rep, abort_link_of(a),
             normal_push::rows(a.route.data.writer(), a.plan, world, rank, a.ws.count_matrix, rs,
                               accepted));
}

}  // namespace epcomm::cuda::device
