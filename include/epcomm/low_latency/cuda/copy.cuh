// Cooperative copies for the low-latency kernels: `n` threads (a warp or a
// block; this one is number `id`) copy one contiguous range. 16-byte vectors
// whenever both addresses and the length allow, narrower words otherwise.
//
// Loads are coherent (never __ldg): a receive kernel copies records that
// peers wrote while it was running, after an acquire of their signal.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/cuda/warp_copy.cuh"

namespace epcomm::cuda::device {

// `Unroll` loads in flight per thread before the stores: copies are
// latency-bound otherwise.
template <class V, int Unroll = 4>
__device__ __forceinline__ void group_copy_words(std::byte* dst, const std::byte* src,
                                                 std::size_t words, int id, int n) {
  const V* s = reinterpret_cast<const V*>(src);
  V* d = reinterpret_cast<V*>(dst);
  std::size_t i = static_cast<std::size_t>(id);
  const std::size_t step = static_cast<std::size_t>(n);
  for (; i + (Unroll - 1) * step < words; i += Unroll * step) {
    V v[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) v[u] = s[i + u * step];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) d[i + u * step] = v[u];
  }
  for (; i < words; i += step) d[i] = s[i];
}

__device__ inline void group_copy(std::byte* dst, const std::byte* src, std::size_t bytes, int id,
                                  int n) {
  const std::uintptr_t bits =
      reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | bytes;
  with_widest_word(bits, bytes, [&](auto word, std::size_t words) {
    group_copy_words<decltype(word)>(dst, src, words, id, n);
  });
}

// The compile-time version for hidden-specialised kernels: the caller
// guarantees 16-byte alignment, and the fixed trip count lets the compiler
// unroll the whole range.
template <std::size_t Bytes, int N>
__device__ __forceinline__ void group_copy(std::byte* dst, const std::byte* src, int id) {
  static_assert(Bytes % 16 == 0, "hidden-specialised rows are whole 16-byte vectors");
  group_copy_words<int4, unroll_of(Bytes, N)>(dst, src, Bytes / 16, id, N);
}

}  // namespace epcomm::cuda::device
