// The CUDA device spellings, for g++ to compile kernel sources run by
// launch(): the execution-space keywords (empty), __shared__, the built-in
// indices, block barriers, warp collectives, atomics, fences and the integer
// and float intrinsics. Include it before the kernel source.
//
// __shared__ is `thread_local`: an SM (OS thread) runs one block at a time to
// completion, so its thread_local copy is that block's shared memory.
// Like CUDA's, it starts each block with whatever the last block left there.
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "support/cpu_cuda/block.hpp"
#include "support/cpu_cuda/dim3.hpp"
#include "support/cpu_cuda/grid.hpp"
#include "support/cpu_cuda/warp_collective.hpp"

namespace epcomm::test::cpu_cuda {

// Lets the block's other fibers run: device code that waits on memory calls it
// in its loop, as a GPU's other warps run while one spins.
inline void yield() {
  device_thread& t = current();
  t.owner->yield(t);
}

// %globaltimer: nanoseconds, monotonic.
inline std::uint64_t globaltimer_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

inline int syncthreads(barrier_kind kind, int predicate) {
  device_thread& t = current();
  return t.owner->barrier(t, kind, predicate);
}

template <class T>
concept shuffle_word = std::is_trivially_copyable_v<T> && sizeof(T) <= 8;

template <shuffle_word T>
T warp_collective(collective kind, unsigned mask, T value, int lane_arg = 0,
                  int width = warp_size) {
  device_thread& t = current();
  if (width <= 0 || width > warp_size || !std::has_single_bit(static_cast<unsigned>(width))) {
    throw device_fault(name(kind) + std::string(" with width ") + std::to_string(width) +
                       ": CUDA needs a power of two up to 32");
  }
  lane_call call{kind, mask, 0, sizeof(T), lane_arg, width};
  std::memcpy(&call.value, &value, sizeof(T));
  const std::uint64_t result = t.owner->warp_collective(t, call);
  T out;
  std::memcpy(&out, &result, sizeof(T));
  return out;
}

template <class T>
concept atomic_word =
    std::same_as<T, int> || std::same_as<T, unsigned> || std::same_as<T, unsigned long long>;

// CUDA's atomics are relaxed: ordering comes from the fences.
inline constexpr auto atomic_order = std::memory_order_relaxed;

}  // namespace epcomm::test::cpu_cuda

// (In place of the CUDA toolkit's definitions when its headers came first.)
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline  // as nvcc's, which implies inline
// thread_local alone: at block scope it implies static, and an
// `extern __shared__` array then names a thread_local the test defines.
#define __shared__ thread_local

#define threadIdx (::epcomm::test::cpu_cuda::current().thread_idx)
#define blockIdx (::epcomm::test::cpu_cuda::current().owner->block_idx())
#define blockDim (::epcomm::test::cpu_cuda::current().owner->block_dim())
#define gridDim (::epcomm::test::cpu_cuda::current().owner->grid_dim())
#define warpSize (::epcomm::test::cpu_cuda::warp_size)

// The toolkit's own dim3 when its headers came first (kernels.hpp).
#if !defined(__VECTOR_TYPES_H__)
using dim3 = ::epcomm::test::cpu_cuda::dim3;
#endif

inline void __syncthreads() {
  ::epcomm::test::cpu_cuda::syncthreads(::epcomm::test::cpu_cuda::barrier_kind::sync, 0);
}
inline int __syncthreads_and(int predicate) {
  return ::epcomm::test::cpu_cuda::syncthreads(::epcomm::test::cpu_cuda::barrier_kind::all,
                                               predicate);
}
inline int __syncthreads_or(int predicate) {
  return ::epcomm::test::cpu_cuda::syncthreads(::epcomm::test::cpu_cuda::barrier_kind::any,
                                               predicate);
}
inline int __syncthreads_count(int predicate) {
  return ::epcomm::test::cpu_cuda::syncthreads(::epcomm::test::cpu_cuda::barrier_kind::count,
                                               predicate);
}

template <::epcomm::test::cpu_cuda::shuffle_word T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return ::epcomm::test::cpu_cuda::warp_collective(::epcomm::test::cpu_cuda::collective::shfl, mask,
                                                   var, src_lane, width);
}
template <::epcomm::test::cpu_cuda::shuffle_word T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ::epcomm::test::cpu_cuda::warp_collective(::epcomm::test::cpu_cuda::collective::shfl_up,
                                                   mask, var, static_cast<int>(delta), width);
}
template <::epcomm::test::cpu_cuda::shuffle_word T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return ::epcomm::test::cpu_cuda::warp_collective(::epcomm::test::cpu_cuda::collective::shfl_down,
                                                   mask, var, static_cast<int>(delta), width);
}
template <::epcomm::test::cpu_cuda::shuffle_word T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return ::epcomm::test::cpu_cuda::warp_collective(::epcomm::test::cpu_cuda::collective::shfl_xor,
                                                   mask, var, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::epcomm::test::cpu_cuda::warp_collective(::epcomm::test::cpu_cuda::collective::ballot,
                                                   mask, static_cast<unsigned>(predicate != 0));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(::epcomm::test::cpu_cuda::warp_collective(
      ::epcomm::test::cpu_cuda::collective::any, mask, static_cast<unsigned>(predicate != 0)));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(::epcomm::test::cpu_cuda::warp_collective(
      ::epcomm::test::cpu_cuda::collective::all, mask, static_cast<unsigned>(predicate != 0)));
}
template <class T>
requires(std::is_integral_v<T> &&
         (sizeof(T) == 4 || sizeof(T) == 8)) unsigned __match_any_sync(unsigned mask, T value) {
  const T same = ::epcomm::test::cpu_cuda::warp_collective(
      ::epcomm::test::cpu_cuda::collective::match_any, mask, value);
  return static_cast<unsigned>(same);
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  return ::epcomm::test::cpu_cuda::warp_collective(::epcomm::test::cpu_cuda::collective::reduce_add,
                                                   mask, value);
}
inline int __reduce_add_sync(unsigned mask, int value) {
  return ::epcomm::test::cpu_cuda::warp_collective(::epcomm::test::cpu_cuda::collective::reduce_add,
                                                   mask, value);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::epcomm::test::cpu_cuda::warp_collective(::epcomm::test::cpu_cuda::collective::syncwarp, mask,
                                            0u);
}
inline unsigned __activemask() {
  const auto& t = ::epcomm::test::cpu_cuda::current();
  return t.owner->active_lanes(t);
}

template <::epcomm::test::cpu_cuda::atomic_word T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value, ::epcomm::test::cpu_cuda::atomic_order);
}
inline float atomicAdd(float* address, float value) {
  return std::atomic_ref<float>(*address).fetch_add(value, ::epcomm::test::cpu_cuda::atomic_order);
}
template <::epcomm::test::cpu_cuda::atomic_word T>
T atomicMin(T* address, T value) {
  std::atomic_ref<T> word(*address);
  T old = word.load(::epcomm::test::cpu_cuda::atomic_order);
  while (value < old &&
         !word.compare_exchange_weak(old, value, ::epcomm::test::cpu_cuda::atomic_order)) {
  }
  return old;
}
template <::epcomm::test::cpu_cuda::atomic_word T>
T atomicMax(T* address, T value) {
  std::atomic_ref<T> word(*address);
  T old = word.load(::epcomm::test::cpu_cuda::atomic_order);
  while (value > old &&
         !word.compare_exchange_weak(old, value, ::epcomm::test::cpu_cuda::atomic_order)) {
  }
  return old;
}
template <::epcomm::test::cpu_cuda::atomic_word T>
T atomicExch(T* address, T value) {
  return std::atomic_ref<T>(*address).exchange(value, ::epcomm::test::cpu_cuda::atomic_order);
}
template <::epcomm::test::cpu_cuda::atomic_word T>
T atomicCAS(T* address, T compare, T value) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value,
                                                       ::epcomm::test::cpu_cuda::atomic_order);
  return compare;  // the old value, whether or not it matched
}

// The GPU's fences order a thread's accesses for its block, its device or the
// system; here every scope is the one CPU memory: a full fence.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
template <class T>
T __ldg(const T* address) {
  return *address;
}
// The _rn forms exist so nvcc will not contract them into FMAs; g++ builds the
// kernels with -ffp-contract=off, so plain operations round the same way.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
