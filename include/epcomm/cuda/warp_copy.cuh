// Warp-cooperative copies of one source row to several destinations (a token
// goes to each of its ranks; the source row is read once). 16-byte vectors
// whenever every address and the length allow it, narrower words otherwise,
// so any hidden size and any caller pointer works, only slower.
#pragma once

#include <cstddef>
#include <cstdint>

namespace epcomm::cuda::device {

inline constexpr int warp_size = 32;

// The widest power of two <= 16 dividing every given address or length.
__device__ __forceinline__ int vector_width(std::uintptr_t bits) {
  if ((bits & 15u) == 0) return 16;
  if ((bits & 7u) == 0) return 8;
  if ((bits & 3u) == 0) return 4;
  if ((bits & 1u) == 0) return 2;
  return 1;
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
  const int w = vector_width(reinterpret_cast<std::uintptr_t>(src) | dst_align | bytes);
  switch (w) {
    case 16:
      copy_words<int4, 4>(src, dst, ndst, bytes / 16, lane);
      break;
    case 8:
      copy_words<int2, 4>(src, dst, ndst, bytes / 8, lane);
      break;
    case 4:
      copy_words<int, 4>(src, dst, ndst, bytes / 4, lane);
      break;
    case 2:
      copy_words<short, 4>(src, dst, ndst, bytes / 2, lane);
      break;
    default:
      copy_words<char, 4>(src, dst, ndst, bytes, lane);
      break;
  }
}

// The compile-time-length version for hidden-specialised kernels: the caller
// guarantees 16-byte alignment (kernel_registry only picks them then), and
// the fixed trip count lets the compiler unroll the whole row.
template <std::size_t Bytes>
__device__ __forceinline__ void warp_copy_to_all(const std::byte* src, std::byte* const* dst,
                                                 int ndst, int lane) {
  static_assert(Bytes % 16 == 0, "hidden-specialised rows are whole 16-byte vectors");
  constexpr std::size_t words = Bytes / 16;
  constexpr int per_lane = static_cast<int>((words + warp_size - 1) / warp_size);
  // Up to 8 vectors (128 bytes) per lane stay in registers; longer rows loop.
  constexpr int unroll = per_lane < 8 ? per_lane : 8;
  copy_words<int4, unroll>(src, dst, ndst, words, lane);
}

}  // namespace epcomm::cuda::device
