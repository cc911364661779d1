// How a low-latency dispatch lays out the fp8 scales it received, for the
// grouped GEMM that consumes them. The wire carries each token's scales next
// to its payload; the receiver writes them into recv_x_scales in the layout
// its buffer was built with. With S = rows_per_expert rounded up to a multiple
// of 4 (16 bytes of fp32 or int32: the alignment a TMA load of the token
// dimension needs), G = hidden / 128 and W = ceil(G / 4):
//
//   row_major    float [E_local][R * max_tokens][G]: a token's scales together.
//   token_major  float [E_local][G][S]: DeepEP's low-latency layout (its
//                [E_local][R * max_tokens][G] tensor transposed from a
//                token-contiguous one), which DeepGEMM reads directly.
//   ue8m0        int32 [E_local][W][S]: DeepEP's use_ue8m0 layout; byte k of
//                word (e, w, t) is the biased exponent of the power-of-two
//                scale of group 4w + k (0 past G). Needs round_scale.
//
// token_major and ue8m0 are bit-compatible with DeepEP wherever R * max_tokens
// is a multiple of 4, which DeepGEMM requires anyway.
#pragma once

#include <cstdint>

namespace epcomm {

enum class ll_scale_layout : std::int32_t { row_major = 0, token_major = 1, ue8m0 = 2 };

}  // namespace epcomm
