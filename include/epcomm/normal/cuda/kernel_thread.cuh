// What every thread of a normal-mode kernel that works in warps reads first
// of its arguments (dispatch_args, combine_args).
#pragma once

#include "epcomm/cuda/warp_copy.cuh"
#include "epcomm/normal/cuda/sync.cuh"

namespace epcomm::cuda::device {

// The rank's report (a kernel does nothing once the rank is broken), the
// group's size (Ranks when the kernel is specialised for a rank count), this
// rank, and the thread's warp and lane. A kernel takes it apart:
//   const auto [rep, world, rank, warp, lane] = thread_of<Ranks>(a);
// (a lambda would read `a` instead: clang before 16 cannot capture such names).
struct kernel_thread {
  report* rep;
  int world;
  int rank;
  int warp;
  int lane;
};

template <int Ranks, class Args>
__device__ __forceinline__ kernel_thread thread_of(const Args& a) {
  const int thread = static_cast<int>(threadIdx.x);
  return {a.ws.rep, Ranks > 0 ? Ranks : a.peers.world_size, a.peers.rank, thread / warp_size,
          thread % warp_size};
}

}  // namespace epcomm::cuda::device
