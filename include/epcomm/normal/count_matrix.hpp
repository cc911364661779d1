// Row offsets derived from the count matrix every rank learns in the notify
// phase: counts[s * R + r] is the number of tokens rank s sends to rank r.
// The host engine (dispatch_handle) and the CUDA kernels place rows with these
// same sums, which is what makes their buffers interchangeable.
#pragma once

#include <cstdint>

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

// One FNV-1a step per byte of the low `bytes` bytes of v.
EPCOMM_HD constexpr unsigned fnv1a_bytes(unsigned h, std::uint64_t v, int bytes) {
  for (int b = 0; b < bytes; ++b, v >>= 8) h = (h ^ static_cast<unsigned>(v & 0xffu)) * 16777619u;
  return h;
}

// Which dispatch a handle comes from, as every rank can compare it: a
// dispatch from a cached handle exchanges no counts and a combine sends rows
// where its handle says, so every rank must pass its handle of the same
// dispatch. Each rank numbers its dispatches alike (`origin`, the dispatch's
// call number, in step on every rank), and the count matrix is the same on
// every rank: the fingerprint is 32-bit FNV-1a over the R*R counts and the
// origin, never 0 so that 0 can mean "no handle". The origin tells apart two
// dispatches whose counts are equal.
EPCOMM_HD constexpr int routing_fingerprint(const int* counts, int world, std::uint64_t origin) {
  unsigned h = 2166136261u;
  for (int i = 0; i < world * world; ++i) h = fnv1a_bytes(h, static_cast<unsigned>(counts[i]), 4);
  h = fnv1a_bytes(h, origin, 8);
  return static_cast<int>(h == 0 ? 1u : h);
}

}  // namespace epcomm
