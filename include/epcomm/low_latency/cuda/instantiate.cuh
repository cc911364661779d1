// Explicit instantiation of the low-latency kernels and their registration in
// the runtime switch (low_latency/cuda/registry.hpp). Include from a .cu file only.
//
//   EPCOMM_CUDA_INSTANTIATE_LOW_LATENCY(Wire, Hidden);
//       dispatch kernels for one wire type (epcomm::bf16 or epcomm::fp8_e4m3)
//       and the combine kernels, for one hidden size (0 = any, read at run
//       time). Put it at namespace scope in a .cu of your own to add a hidden
//       size the default matrix lacks, e.g. (epcomm::fp8_e4m3, 2880).
//   EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH(Wire, Hidden);
//   EPCOMM_CUDA_INSTANTIATE_LL_COMBINE(Hidden);
//       the two halves on their own: combine kernels do not depend on the
//       wire type, so epcomm's own build compiles them once.
//   EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH_DEFAULT(Wire);
//   EPCOMM_CUDA_INSTANTIATE_LL_COMBINE_DEFAULT();
//       what epcomm's own build uses: hidden {any, 4096, 7168}.
//
// Registration happens during static initialisation of the object file that
// holds the macro: link such files as objects, not from a static archive.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "epcomm/core/token_types.hpp"
#include "epcomm/cuda/kernel_launch.hpp"
#include "epcomm/low_latency/cuda/combine.cuh"
#include "epcomm/low_latency/cuda/dispatch.cuh"
#include "epcomm/low_latency/cuda/launch.hpp"
#include "epcomm/low_latency/cuda/registry.hpp"

namespace epcomm::cuda {

namespace detail {

// Kernels whose dynamic shared memory exceeds the default 48 KiB must say so
// first (the buffer checked at construction that the device has enough).
template <class Kernel>
int allow_shared(Kernel kernel, std::size_t bytes) {
  constexpr std::size_t default_limit = 48 * 1024;
  if (bytes <= default_limit) return 0;
  return static_cast<int>(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes)));
}

}  // namespace detail

template <class Wire, int Hidden>
int launch_ll_dispatch_send(const ll_args& a, stream_t stream) {
  const auto kernel = &device::ll_dispatch_send_kernel<Wire, Hidden>;
  const std::size_t shared = ll_send_shared_bytes(a.shape);
  if (const int e = detail::allow_shared(kernel, shared); e != 0) return e;
  EPCOMM_KERNEL_LAUNCH(ll_dispatch_send_blocks(a.num_tokens, a.max_blocks), ll_threads, shared,
                       stream, kernel)
  (a);
  return static_cast<int>(cudaGetLastError());
}

template <class Wire, int Hidden>
int launch_ll_dispatch_recv(const ll_args& a, stream_t stream) {
  EPCOMM_KERNEL_LAUNCH(ll_dispatch_recv_blocks(a.shape, a.max_blocks), ll_threads, 0, stream,
                       device::ll_dispatch_recv_kernel<Wire, Hidden>)
  (a);
  return static_cast<int>(cudaGetLastError());
}

template <int Hidden>
int launch_ll_combine_send(const ll_args& a, stream_t stream) {
  const auto kernel = &device::ll_combine_send_kernel<Hidden>;
  const std::size_t shared = sizeof(int) * (a.shape.local_experts() + 1);
  if (const int e = detail::allow_shared(kernel, shared); e != 0) return e;
  EPCOMM_KERNEL_LAUNCH(ll_combine_send_blocks(a.shape, a.max_blocks), ll_threads, shared, stream,
                       kernel)
  (a);
  return static_cast<int>(cudaGetLastError());
}

template <int Hidden>
int launch_ll_combine_recv(const ll_args& a, stream_t stream) {
  const std::size_t shared = (sizeof(std::byte*) + sizeof(float)) * a.shape.max_topk;
  EPCOMM_KERNEL_LAUNCH(ll_combine_recv_blocks(a.num_tokens, a.max_blocks), ll_threads, shared,
                       stream, device::ll_combine_recv_kernel<Hidden>)
  (a);
  return static_cast<int>(cudaGetLastError());
}

template <class Wire, int Hidden>
bool register_ll_dispatch_kernels() {
  static_assert(std::is_same_v<Wire, bf16> || std::is_same_v<Wire, fp8_e4m3>,
                "the low-latency wire is bf16 or fp8_e4m3");
  static_assert(Hidden >= 0);
  static_assert(Hidden == 0 || (Hidden * sizeof(bf16)) % 16 == 0,
                "hidden-specialised kernels move whole 16-byte vectors per row");
  static_assert(Hidden == 0 || !token_traits<Wire>::has_scales || Hidden % 128 == 0,
                "fp8 rows carry one scale per 128 channels");
  ll_kernel_registry::dispatch().add({{token_traits<Wire>::id, Hidden},
                                      &launch_ll_dispatch_send<Wire, Hidden>,
                                      &launch_ll_dispatch_recv<Wire, Hidden>});
  return true;
}

template <int Hidden>
bool register_ll_combine_kernels() {
  static_assert(Hidden >= 0);
  static_assert(Hidden == 0 || (Hidden * sizeof(bf16)) % 16 == 0,
                "hidden-specialised kernels move whole 16-byte vectors per row");
  ll_kernel_registry::combine().add({{token_traits<bf16>::id, Hidden},
                                     &launch_ll_combine_send<Hidden>,
                                     &launch_ll_combine_recv<Hidden>});
  return true;
}

}  // namespace epcomm::cuda

#define EPCOMM_CUDA_LL_CONCAT_IMPL(a, b) a##b
#define EPCOMM_CUDA_LL_CONCAT(a, b) EPCOMM_CUDA_LL_CONCAT_IMPL(a, b)

#define EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH(WIRE, HIDDEN)                                  \
  [[maybe_unused]] static const bool EPCOMM_CUDA_LL_CONCAT(epcomm_cuda_ll_, __COUNTER__) = \
      ::epcomm::cuda::register_ll_dispatch_kernels<WIRE, HIDDEN>()

#define EPCOMM_CUDA_INSTANTIATE_LL_COMBINE(HIDDEN)                                         \
  [[maybe_unused]] static const bool EPCOMM_CUDA_LL_CONCAT(epcomm_cuda_ll_, __COUNTER__) = \
      ::epcomm::cuda::register_ll_combine_kernels<HIDDEN>()

#define EPCOMM_CUDA_INSTANTIATE_LOW_LATENCY(WIRE, HIDDEN) \
  EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH(WIRE, HIDDEN);      \
  EPCOMM_CUDA_INSTANTIATE_LL_COMBINE(HIDDEN)

// epcomm's own matrix: hidden {any, 4096, 7168}.
#define EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH_DEFAULT(WIRE) \
  EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH(WIRE, 0);           \
  EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH(WIRE, 4096);        \
  EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH(WIRE, 7168)

#define EPCOMM_CUDA_INSTANTIATE_LL_COMBINE_DEFAULT() \
  EPCOMM_CUDA_INSTANTIATE_LL_COMBINE(0);             \
  EPCOMM_CUDA_INSTANTIATE_LL_COMBINE(4096);          \
  EPCOMM_CUDA_INSTANTIATE_LL_COMBINE(7168)
