// Normal-mode combine payload over peer-mapped memory, after the readiness
// round (notify.cuh) has accepted every rank's input. Two kernels, because the
// reduction may only start once every peer's rows have landed, and a kernel
// whose blocks wait for work that later blocks of the same kernel do could
// deadlock when they do not all fit on the GPU:
//
//   combine_send    one warp per received row: the expert output goes back to
//                   its source rank, into that source's combine region at
//                   return_offset(source, rank) (the host engine's layout),
//                   with its top-k weights; the last block publishes
//                   (combine_data, rank) at every source. Over an RMA
//                   transport (normal/route.hpp) rows for other ranks are
//                   staged in receive order and the last block's thread 0
//                   hands the puts, with the signal, to the proxy;
//   combine_reduce  every block first waits, with a deadline, for
//                   (combine_data, r) from every rank r, then one warp per
//                   token sums bias_0, bias_1 and the returned rows in rank
//                   order in fp32, exactly the host engine's order, so both
//                   produce the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "epcomm/core/token_types.hpp"
#include "epcomm/cuda/warp_copy.cuh"
#include "epcomm/normal/count_matrix.hpp"
#include "epcomm/normal/cuda/dispatch.cuh"
#include "epcomm/normal/cuda/kernel_thread.cuh"
#include "epcomm/normal/cuda/launch.hpp"
#include "epcomm/normal/cuda/notify.cuh"
#include "epcomm/normal/cuda/sync.cuh"
#include "epcomm/normal/route.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/proxy/channel.hpp"

namespace epcomm::cuda::device {

inline constexpr int combine_warps = 8;
inline constexpr int combine_threads = combine_warps * warp_size;

__host__ __device__ constexpr std::size_t reduce_shared_bytes(int world) {
  return static_cast<std::size_t>(combine_warps) * world * (sizeof(std::byte*) + sizeof(int));
}

// Grid: any number of blocks of combine_threads.
template <class Out, int Ranks, int Hidden>
__global__ void __launch_bounds__(combine_threads)
    combine_send_kernel(const __grid_constant__ combine_args a) {
  __shared__ int recv_begin[peer_table::max_ranks + 1];
  __shared__ int return_row[peer_table::max_ranks];
  __shared__ std::byte* target[combine_warps];
  const auto [rep, world, rank, warp, lane] = thread_of<Ranks>(a);
  if (block_is_broken(rep)) return;
  const bool accepted = a.ws.accepted[0] != 0 && a.ws.accepted[1] != 0;

  for (int s = threadIdx.x; s <= world; s += blockDim.x) {
    recv_begin[s] = recv_offset(a.ws.count_matrix, world, s, rank);
    if (s < world) return_row[s] = return_offset(a.ws.count_matrix, world, s, rank);
  }
  __syncthreads();

  if (accepted) {
    const int hidden = Hidden > 0 ? Hidden : a.hidden;
    const std::size_t row_bytes = static_cast<std::size_t>(hidden) * sizeof(Out);
    const int k_max = a.topk;
    const int rows = recv_begin[world];
    const int stride = static_cast<int>(gridDim.x) * combine_warps;
    for (int i = blockIdx.x * combine_warps + warp; i < rows; i += stride) {
      int s = 0;
      while (recv_begin[s + 1] <= i) ++s;  // ranks that sent nothing have empty ranges
      // Over RMA a row for another rank is staged where it was received.
      const bool staged = a.route.via_proxy != 0 && s != rank;
      const std::size_t row = staged
                                  ? static_cast<std::size_t>(i)
                                  : static_cast<std::size_t>(return_row[s] + (i - recv_begin[s]));
      std::byte* dest = staged ? a.peers.buffer[rank] : a.peers.buffer[s];
      if (lane == 0)
        target[warp] = dest + (staged ? a.plan.send_combine_x : a.plan.combine_x) + row * row_bytes;
      __syncwarp();
      const auto* y = static_cast<const std::byte*>(a.y) + static_cast<std::size_t>(i) * row_bytes;
      if constexpr (Hidden > 0) {
        warp_copy_to_all<static_cast<std::size_t>(Hidden) * sizeof(Out)>(y, &target[warp], 1, lane);
      } else {
        warp_copy_to_all(y, &target[warp], 1, row_bytes, row_bytes | wire::alignment, lane);
      }
      if (a.y_weights != nullptr) {
        auto* w = reinterpret_cast<float*>(
            dest + (staged ? a.plan.send_combine_weights : a.plan.combine_weights));
        for (int k = lane; k < k_max; k += warp_size)
          w[row * k_max + k] = a.y_weights[static_cast<std::size_t>(i) * k_max + k];
      }
      __syncwarp();
    }
  }
  if (!last_sender(a.ws.blocks_done + 1, gridDim.x)) return;
  if (a.route.via_proxy == 0) {
    signal_all(a.peers, world, wire::signal_kind::combine_data);
    return;
  }
  const int hidden = Hidden > 0 ? Hidden : a.hidden;
  const normal_push::row_shape rs{0, 0, static_cast<std::size_t>(a.topk),
                                  static_cast<std::size_t>(hidden) * sizeof(Out)};
  channel_ok(rep, abort_link_of(a),
             normal_push::combine_rows(a.route.data.writer(), a.plan, world, rank,
                                       a.ws.count_matrix, rs, a.y_weights != nullptr, accepted));
}

template <class Out>
inline constexpr int per_vector = static_cast<int>(16 / sizeof(Out));

template <class Out>
__device__ __forceinline__ void accumulate(float (&acc)[per_vector<Out>], const std::byte* p) {
  const int4 v = *reinterpret_cast<const int4*>(p);
  Out e[per_vector<Out>];
  std::memcpy(e, &v, sizeof v);
#pragma unroll
  for (int i = 0; i < per_vector<Out>; ++i) acc[i] += to_float(e[i]);
}

// out[t] = bias_0[t] + bias_1[t] + rows[0] + ... + rows[n-1], in that order,
// in fp32, starting from 0.0f as the host engine does.
template <class Out, int Hidden>
__device__ void reduce_token(const combine_args& a, int t, const std::byte* const* rows, int n,
                             int lane) {
  const int hidden = Hidden > 0 ? Hidden : a.hidden;
  const std::size_t row_bytes = static_cast<std::size_t>(hidden) * sizeof(Out);
  const std::size_t at = static_cast<std::size_t>(t) * row_bytes;
  const auto* b0 = a.bias_0 != nullptr ? static_cast<const std::byte*>(a.bias_0) + at : nullptr;
  const auto* b1 = a.bias_1 != nullptr ? static_cast<const std::byte*>(a.bias_1) + at : nullptr;
  auto* out = static_cast<std::byte*>(a.out_x) + at;
  const std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(a.bias_0) |
                              reinterpret_cast<std::uintptr_t>(a.bias_1) |
                              reinterpret_cast<std::uintptr_t>(a.out_x) | row_bytes;
  if (Hidden > 0 || (bits & 15u) == 0) {
    constexpr int v = per_vector<Out>;
    for (std::size_t off = static_cast<std::size_t>(lane) * 16; off < row_bytes;
         off += warp_size * 16) {
      float acc[v] = {};
      if (b0 != nullptr) accumulate<Out>(acc, b0 + off);
      if (b1 != nullptr) accumulate<Out>(acc, b1 + off);
      for (int j = 0; j < n; ++j) accumulate<Out>(acc, rows[j] + off);
      Out e[v];
#pragma unroll
      for (int i = 0; i < v; ++i) e[i] = from_float<Out>(acc[i]);
      std::memcpy(out + off, e, sizeof e);
    }
  } else {
    for (int c = lane; c < hidden; c += warp_size) {
      float acc = 0.0f;
      if (b0 != nullptr) acc += to_float(reinterpret_cast<const Out*>(b0)[c]);
      if (b1 != nullptr) acc += to_float(reinterpret_cast<const Out*>(b1)[c]);
      for (int j = 0; j < n; ++j) acc += to_float(reinterpret_cast<const Out*>(rows[j])[c]);
      reinterpret_cast<Out*>(out)[c] = from_float<Out>(acc);
    }
  }
}

// Grid: any number of blocks of combine_threads, dynamic shared memory
// reduce_shared_bytes(world).
template <class Out, int Ranks, int Hidden>
__global__ void __launch_bounds__(combine_threads)
    combine_reduce_kernel(const __grid_constant__ combine_args a) {
  extern __shared__ std::byte dyn[];
  __shared__ int first_row[peer_table::max_ranks];
  const auto [rep, world, rank, warp, lane] = thread_of<Ranks>(a);
  if (block_is_broken(rep)) return;
  const bool accepted = a.ws.accepted[0] != 0 && a.ws.accepted[1] != 0;

  bool ok = true;
  if (warp == 0) {
    const std::uint64_t epoch = *a.ws.combine_epoch;
    const std::uint64_t* mine = a.peers.signals[rank];
    const waited_for what = accepted ? waited_for::combined_rows : waited_for::agreement_to_reject;
    for (int r = lane; r < world && ok; r += warp_size)
      ok = wait_at_least(mine + wire::signal_slot(wire::signal_kind::combine_data, r, world), epoch,
                         a.timeout_ns, rep, abort_link_of(a), a.ws.exited, r, what);
  }
  for (int r = threadIdx.x; r < world; r += blockDim.x)
    first_row[r] = return_offset(a.ws.count_matrix, world, rank, r);
  if (!all_waits_succeeded(ok) || !accepted) return;

  const int hidden = Hidden > 0 ? Hidden : a.hidden;
  const std::size_t row_bytes = static_cast<std::size_t>(hidden) * sizeof(Out);
  const int k_max = a.topk;
  const std::byte* base = a.peers.buffer[rank];
  const auto* weights = reinterpret_cast<const float*>(base + a.plan.combine_weights);
  auto** rows = reinterpret_cast<const std::byte**>(dyn) + warp * world;
  auto* row_index =
      reinterpret_cast<int*>(reinterpret_cast<const std::byte**>(dyn) + combine_warps * world) +
      warp * world;
  const int stride = static_cast<int>(gridDim.x) * combine_warps;
  for (int t = blockIdx.x * combine_warps + warp; t < a.num_tokens; t += stride) {
    int n = 0;
    for (int c = 0; c < world; c += warp_size) {
      const int r = c + lane;
      const int pos = r < world ? a.ws.send_pos[static_cast<std::size_t>(t) * world + r] : -1;
      const unsigned from = __ballot_sync(0xffffffffu, pos >= 0);
      if (pos >= 0) {
        const int j = n + __popc(from & lanes_below(lane));
        row_index[j] = first_row[r] + pos;
        rows[j] =
            base + a.plan.combine_x + static_cast<std::size_t>(first_row[r] + pos) * row_bytes;
      }
      n += __popc(from);
    }
    __syncwarp();
    reduce_token<Out, Hidden>(a, t, rows, n, lane);
    if (a.out_weights != nullptr) {
      for (int k = lane; k < k_max; k += warp_size) {
        float w = 0.0f;
        for (int j = 0; j < n; ++j)
          w += weights[static_cast<std::size_t>(row_index[j]) * k_max + k];
        a.out_weights[static_cast<std::size_t>(t) * k_max + k] = w;
      }
    }
    __syncwarp();
  }
}

}  // namespace epcomm::cuda::device
