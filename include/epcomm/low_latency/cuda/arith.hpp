// The arithmetic of low-latency mode split the way a kernel computes it,
// host-tested against the host engine's sequential code so both produce the
// same bits:
//   - fp8 cast: a 128-channel block is read by 16 threads of 8 channels; each
//     takes the maximum magnitude of its piece, and the pieces' maxima are
//     merged pairwise. The maximum of non-NaN values does not depend on the
//     order, so the block's amax, and therefore its scale and every quantised
//     value (core/fp8_scaling.hpp), are exactly quantize_fp8_block's;
//   - combine: acc += w * v per routed top-k slot, in slot order, rounded per
//     operation (never fused into an FMA), as the host engine's loop does;
//   - the cut of a dispatch's tokens into contiguous chunks, one per block.
#pragma once

#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/core/token_types.hpp"

namespace epcomm::cuda {

// max(amax, |v[i]|) over n values, ignoring NaNs as quantize_fp8_block does
// (a NaN never compares greater).
EPCOMM_HD inline float fp8_partial_amax(const bf16* v, int n, float amax = 0.0f) {
  for (int i = 0; i < n; ++i) {
    const float a = ::epcomm::detail::bit_cast<float>(
        ::epcomm::detail::bit_cast<std::uint32_t>(to_float(v[i])) & 0x7FFF'FFFFu);
    if (a > amax) amax = a;
  }
  return amax;
}

// Merges two partial maxima (neither is NaN: partial maxima start at 0).
EPCOMM_HD constexpr float fp8_amax_merge(float a, float b) { return b > a ? b : a; }

// acc + w * v with both operations rounded: nvcc would otherwise contract
// them into one FMA and the result would differ from the host engine's.
EPCOMM_HD inline float weighted_add(float acc, float w, float v) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(acc, __fmul_rn(w, v));
#else
  return acc + w * v;
#endif
}

struct token_range {
  int first;
  int last;  // exclusive
};

// The tokens block b of `blocks` sends: contiguous chunks, so that a block
// knows every earlier (token, top-k slot) precedes its own in the host
// engine's slot order.
EPCOMM_HD constexpr token_range token_chunk(int tokens, int blocks, int b) {
  const int per = (tokens + blocks - 1) / blocks;
  const int first = b * per < tokens ? b * per : tokens;
  const int last = first + per < tokens ? first + per : tokens;
  return {first, last};
}

}  // namespace epcomm::cuda
