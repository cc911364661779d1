// Layout on the device: for each destination rank, which tokens go there and
// in which order (send_pos), how many (tokens_per_rank), and how many (token,
// k) entries name each expert (tokens_per_expert). The same definition as
// make_layout (core/layout.hpp): a token goes once to each rank owning one of its
// experts, and keeps its source order among the tokens sent there.
//
// One block per destination rank (under a smaller block budget, each block
// several ranks in turn) scans the tokens in tiles; a block-wide
// prefix sum turns "token t goes to r" flags into positions, so the result is
// deterministic (no atomics decide an order).
#pragma once

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "epcomm/core/layout.hpp"
#include "epcomm/normal/cuda/launch.hpp"
#include "epcomm/normal/cuda/sync.cuh"

namespace epcomm::cuda::device {

inline constexpr int layout_threads = 256;

// Ranks > 0 fixes world_size at compile time (0: from the call).
template <int Ranks>
__global__ void __launch_bounds__(layout_threads)
    layout_kernel(const __grid_constant__ dispatch_args a) {
  using scan = cub::BlockScan<int, layout_threads>;
  __shared__ typename scan::TempStorage scan_storage;
  extern __shared__ int expert_count[];  // [E/R] for this block's rank

  if (block_is_broken(a.ws.rep)) return;
  const int world = Ranks > 0 ? Ranks : a.peers.world_size;
  const int per_rank = a.num_experts / world;
  const int k_max = a.topk;
  // One destination rank at a time; a budget below world blocks takes turns.
  for (int dst = blockIdx.x; dst < world; dst += gridDim.x) {
    const std::int64_t first = static_cast<std::int64_t>(dst) * per_rank;
    for (int i = threadIdx.x; i < per_rank; i += blockDim.x) expert_count[i] = 0;
    __syncthreads();

    int base = 0;
    for (int tile = 0; tile < a.num_tokens; tile += layout_threads) {
      const int t = tile + static_cast<int>(threadIdx.x);
      int goes = 0;
      if (t < a.num_tokens) {
        const std::int64_t* row = a.topk_idx + static_cast<std::size_t>(t) * k_max;
        for (int k = 0; k < k_max; ++k) {
          const std::int64_t e = row[k];
          if (e < -1 || e >= a.num_experts) {
            // Only rank 0's pass reports, so the lowest bad entry wins
            // exactly as find_invalid_expert's first match does.
            if (dst == 0)
              atomicMin(reinterpret_cast<unsigned long long*>(a.ws.first_invalid),
                        static_cast<unsigned long long>(t) * k_max + k);
            continue;
          }
          if (e >= first && e < first + per_rank) {
            goes = 1;
            atomicAdd(&expert_count[e - first], 1);
          }
        }
      }
      int pos = 0;
      int tile_total = 0;
      scan(scan_storage).ExclusiveSum(goes, pos, tile_total);
      if (t < a.num_tokens)
        a.ws.send_pos[static_cast<std::size_t>(t) * world + dst] = goes ? base + pos : -1;
      base += tile_total;
      __syncthreads();  // scan_storage is reused by the next tile
    }
    if (threadIdx.x == 0) a.ws.tokens_per_rank[dst] = base;
    for (int i = threadIdx.x; i < per_rank; i += blockDim.x)
      a.ws.tokens_per_expert[first + i] = expert_count[i];
    __syncthreads();  // expert_count is cleared for the next rank
  }
}

}  // namespace epcomm::cuda::device
