// Explicit instantiation of the normal-mode kernels, and their registration in
// the runtime switch (normal/cuda/registry.hpp). Include this from a .cu file only.
//
//   EPCOMM_CUDA_INSTANTIATE_NORMAL(Token, Ranks, Hidden);
//       one combination; Ranks / Hidden of 0 read the value from the call.
//       Put it at namespace scope in any .cu of your own to add a shape the
//       default matrix lacks (e.g. 16 ranks, hidden 2880).
//   EPCOMM_CUDA_INSTANTIATE_DEFAULT_MATRIX(Token);
//       the combinations epcomm's own build uses: ranks {any, 2, 4, 8} x
//       hidden {any, 4096, 7168}.
//
// Registration happens during static initialisation of the object file that
// holds the macro: link such files as objects (an OBJECT library or the
// executable's own sources), not from a static archive, whose members the
// linker drops when nothing references them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "epcomm/core/token_types.hpp"
#include "epcomm/cuda/kernel_launch.hpp"
#include "epcomm/normal/cuda/combine.cuh"
#include "epcomm/normal/cuda/dispatch.cuh"
#include "epcomm/normal/cuda/layout.cuh"
#include "epcomm/normal/cuda/notify.cuh"
#include "epcomm/normal/cuda/registry.hpp"

namespace epcomm::cuda {

namespace detail {

// Enough blocks to cover `work` warp-sized items, within a budget of
// max_blocks >= 1: the kernels loop, so fewer blocks only take longer.
inline unsigned blocks_for(long long work, int warps_per_block, int max_blocks) {
  const long long wanted = (work + warps_per_block - 1) / warps_per_block;
  return static_cast<unsigned>(std::clamp<long long>(wanted, 1, max_blocks));
}

}  // namespace detail

template <class Token, int Ranks, int Hidden>
int launch_dispatch(const dispatch_args& a, stream_t stream) {
  const int world = a.peers.world_size;
  const auto expert_bytes = static_cast<std::size_t>(a.num_experts / world) * sizeof(int);
  // One block per destination rank, or each block several in turn. A cached
  // dispatch has its layout already.
  if (a.cached == 0) {
    EPCOMM_KERNEL_LAUNCH(std::min(world, a.max_blocks), device::layout_threads, expert_bytes,
                         stream, device::layout_kernel<Ranks>)
    (a);
  }
  EPCOMM_KERNEL_LAUNCH(1, device::notify_threads, 0, stream, device::notify_kernel<Ranks>)(a);
  // The budget's last block receives.
  const unsigned senders =
      detail::blocks_for(a.num_tokens, device::dispatch_warps, a.max_blocks - 1);
  EPCOMM_KERNEL_LAUNCH(senders + 1, device::dispatch_threads, device::dispatch_shared_bytes(world),
                       stream, device::dispatch_kernel<Token, Ranks, Hidden>)
  (a);
  return static_cast<int>(cudaGetLastError());
}

template <class Out, int Ranks, int Hidden>
int launch_combine(const combine_args& a, stream_t stream) {
  const int world = a.peers.world_size;
  EPCOMM_KERNEL_LAUNCH(1, device::notify_threads, 0, stream, device::combine_ready_kernel<Ranks>)
  (a);
  const unsigned senders = detail::blocks_for(a.y_rows, device::combine_warps, a.max_blocks);
  EPCOMM_KERNEL_LAUNCH(senders, device::combine_threads, 0, stream,
                       device::combine_send_kernel<Out, Ranks, Hidden>)
  (a);
  const unsigned reducers = detail::blocks_for(a.num_tokens, device::combine_warps, a.max_blocks);
  EPCOMM_KERNEL_LAUNCH(reducers, device::combine_threads, device::reduce_shared_bytes(world),
                       stream, device::combine_reduce_kernel<Out, Ranks, Hidden>)
  (a);
  return static_cast<int>(cudaGetLastError());
}

template <class Token, int Ranks, int Hidden>
bool register_normal_kernels() {
  using Out = combine_type_t<Token>;
  static_assert(Ranks >= 0 && Ranks <= peer_table::max_ranks);
  static_assert(Hidden >= 0);
  static_assert(Hidden == 0 || (Hidden * sizeof(Token)) % 16 == 0,
                "hidden-specialised kernels move whole 16-byte vectors per row");
  static_assert(Hidden == 0 || (Hidden * sizeof(Out)) % 16 == 0);
  static_assert(Hidden == 0 || !token_traits<Token>::has_scales || Hidden % 128 == 0,
                "fp8 rows carry one scale per 128 channels");
  kernel_registry::global().add({{token_traits<Token>::id, Ranks, Hidden},
                                 &launch_dispatch<Token, Ranks, Hidden>,
                                 &launch_combine<Out, Ranks, Hidden>});
  return true;
}

}  // namespace epcomm::cuda

#define EPCOMM_CUDA_CONCAT_IMPL(a, b) a##b
#define EPCOMM_CUDA_CONCAT(a, b) EPCOMM_CUDA_CONCAT_IMPL(a, b)

#define EPCOMM_CUDA_INSTANTIATE_NORMAL(TOKEN, RANKS, HIDDEN)                                \
  [[maybe_unused]] static const bool EPCOMM_CUDA_CONCAT(epcomm_cuda_normal_, __COUNTER__) = \
      ::epcomm::cuda::register_normal_kernels<TOKEN, RANKS, HIDDEN>()

#define EPCOMM_CUDA_INSTANTIATE_RANKS(TOKEN, RANKS)   \
  EPCOMM_CUDA_INSTANTIATE_NORMAL(TOKEN, RANKS, 0);    \
  EPCOMM_CUDA_INSTANTIATE_NORMAL(TOKEN, RANKS, 4096); \
  EPCOMM_CUDA_INSTANTIATE_NORMAL(TOKEN, RANKS, 7168)

#define EPCOMM_CUDA_INSTANTIATE_DEFAULT_MATRIX(TOKEN) \
  EPCOMM_CUDA_INSTANTIATE_RANKS(TOKEN, 0);            \
  EPCOMM_CUDA_INSTANTIATE_RANKS(TOKEN, 2);            \
  EPCOMM_CUDA_INSTANTIATE_RANKS(TOKEN, 4);            \
  EPCOMM_CUDA_INSTANTIATE_RANKS(TOKEN, 8)
