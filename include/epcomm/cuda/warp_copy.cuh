// Warp-cooperative copies of one source row to several destinations (a token
// goes to each of its ranks; the source row is read once). 16-byte vectors
// whenever every address and the length allow it, narrower words otherwise,
// so any hidden size and any caller pointer works, only slower.
#pragma once

#include <cstddef>
#include <cstdint>

namespace epcomm::cuda::device {

inline constexpr int warp_size = 32;

// Runs copy(Word{}, bytes / sizeof(Word)) with the widest word (int4, int2,
// int, short or char) whose size divides every address and the length or'ed
// into `bits`: one choice of width for every copy of this file and its users.
template <class Copy>
__device__ __forceinline__ void with_widest_word(std::uintptr_t bits, std::size_t bytes,
                                                 Copy&& copy) {
  if ((bits & 15u) == 0)
    copy(int4{}, bytes / 16);
  else if ((bits & 7u) == 0)
    copy(int2{}, bytes / 8);
  else if ((bits & 3u) == 0)
    copy(int{}, bytes / 4);
  else if ((bits & 1u) == 0)
    copy(short{}, bytes / 2);
  else
    copy(char{}, bytes);
}

// The loads in flight per thread when `threads` threads copy a row of
// `bytes` (whole 16-byte vectors) of known length: the thread's share, up to
// 8 vectors (128 bytes) held in registers; longer rows loop.
__host__ __device__ constexpr int unroll_of(std::size_t bytes, int threads) {
  const std::size_t n = static_cast<std::size_t>(threads);
  const std::size_t share = (bytes / 16 + n - 1) / n;
  return share < 8 ? static_cast<int>(share) : 8;
}

// Loads `Unroll` vectors per lane before storing them, so each lane keeps
// several loads in flight: the copy is latency-bound otherwise.
template <class V, int Unroll>
__device__ __forceinline__ void copy_words(const std::byte* src, std::byte* const* dst, int ndst,
                                           std::size_t words, int lane) {
  const V* s = reinterpret_cast<const V*>(src);
  const std::size_t step = static_cast<std::size_t>(warp_size) * Unroll;
  for (std::size_t base = 0; base < words; base += step) {
    V v[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const std::size_t i = base + static_cast<std::size_t>(u) * warp_size + lane;
      if (i < words) v[u] = __ldg(s + i);
    }
    for (int d = 0; d < ndst; ++d) {
      V* out = reinterpret_cast<V*>(dst[d]);
#pragma unroll
      for (int u = 0; u < Unroll; ++u) {
        const std::size_t i = base + static_cast<std::size_t>(u) * warp_size + lane;
        if (i < words) out[i] = v[u];
      }
    }
  }
}

// Copies `bytes` from src to each of dst[0..ndst) (dst may live in shared
// memory). `dst_align` is a bit pattern every destination address is known to
// share (e.g. the row stride of a 256-aligned region), so the width check
// needs no loop over destinations.
__device__ inline void warp_copy_to_all(const std::byte* src, std::byte* const* dst, int ndst,
                                        std::size_t bytes, std::uintptr_t dst_align, int lane) {
  with_widest_word(reinterpret_cast<std::uintptr_t>(src) | dst_align | bytes, bytes,
                   [&](auto word, std::size_t words) {
                     copy_words<decltype(word), 4>(src, dst, ndst, words, lane);
                   });
}

// The compile-time-length version for hidden-specialised kernels: the caller
// guarantees 16-byte alignment (kernel_registry only picks them then), and
// the fixed trip count lets the compiler unroll the whole row.
template <std::size_t Bytes>
__device__ __forceinline__ void warp_copy_to_all(const std::byte* src, std::byte* const* dst,
                                                 int ndst, int lane) {
  static_assert(Bytes % 16 == 0, "hidden-specialised rows are whole 16-byte vectors");
  copy_words<int4, unroll_of(Bytes, warp_size)>(src, dst, ndst, Bytes / 16, lane);
}

}  // namespace epcomm::cuda::device
