// Row offsets derived from the count matrix every rank learns in the notify
// phase: counts[s * R + r] is the number of tokens rank s sends to rank r.
// The host engine (dispatch_handle) and the CUDA kernels place rows with these
// same sums, which is what makes their buffers interchangeable.
#pragma once

#include "epcomm/core/config.hpp"

namespace epcomm {

// First row, in dst's receive order, of the tokens src sent to dst: receivers
// order rows by source rank.
EPCOMM_HD constexpr int recv_offset(const int* counts, int world, int src, int dst) {
  int off = 0;
  for (int s = 0; s < src; ++s) off += counts[s * world + dst];
  return off;
}

// First row, in src's combine region, of the rows dst returns: a source
// receives its combined rows grouped by the rank that returns them. Also the
// first row, in src's send staging (RMA path), of the tokens src sends to
// dst: staging holds them in that same order, by destination.
EPCOMM_HD constexpr int return_offset(const int* counts, int world, int src, int dst) {
  int off = 0;
  for (int r = 0; r < dst; ++r) off += counts[src * world + r];
  return off;
}

// Rows dst receives in one dispatch, summed in 64 bits so a hostile count
// cannot wrap before it is compared with the buffer's capacity.
EPCOMM_HD constexpr long long total_received(const int* counts, int world, int dst) {
  long long n = 0;
  for (int s = 0; s < world; ++s) n += counts[s * world + dst];
  return n;
}

// A local expert's received (token, k) count as DeepEP's expert_alignment
// reports it: rounded up to a multiple of `alignment` (>= 1), the row
// alignment a grouped GEMM such as DeepGEMM lays each expert's block out with.
EPCOMM_HD constexpr int aligned_expert_count(int count, int alignment) {
  return (count + alignment - 1) / alignment * alignment;
}

// A dispatch from a cached handle exchanges no counts, so every rank must
// hold the same matrix: they compare this fingerprint of it (32-bit FNV-1a
// over the R*R counts, never 0 so that 0 can mean "not a cached dispatch").
EPCOMM_HD constexpr int routing_fingerprint(const int* counts, int world) {
  unsigned h = 2166136261u;
  for (int i = 0; i < world * world; ++i) {
    unsigned v = static_cast<unsigned>(counts[i]);
    for (int b = 0; b < 4; ++b, v >>= 8) h = (h ^ (v & 0xffu)) * 16777619u;
  }
  return static_cast<int>(h == 0 ? 1u : h);
}

}  // namespace epcomm
