// Everything one normal-mode dispatch or combine launch needs, as trivially
// copyable structs of plain pointers and integers: the host side fills them
// without CUDA headers, the kernels receive them by value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "epcomm/cuda/abort_link.hpp"
#include "epcomm/normal/report.hpp"
#include "epcomm/normal/route.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/transport/peer_table.hpp"

namespace epcomm::cuda {

// Per-rank device memory the kernels keep between launches (never touched by
// peers). Counters live on the device so that a captured CUDA graph advances
// them on every replay.
struct workspace {
  std::int32_t* send_pos;           // [max_tokens][R]: row of token t among those sent to r, or -1
  std::int32_t* tokens_per_rank;    // [R] this call
  std::int32_t* tokens_per_expert;  // [E] this call
  std::int32_t* count_matrix;       // [R][R] from the notify phase; zero after a rejected call
  std::uint64_t* origin;            // the dispatch (its epoch) that wrote count_matrix
  std::int32_t* recv_per_expert;    // [E/R] rows received per local expert
  std::uint64_t* first_invalid;     // lowest bad topk_idx entry, or ~0
  std::uint64_t* dispatch_epoch;    // dispatch calls so far
  std::uint64_t* combine_epoch;     // combine calls so far
  std::uint32_t* blocks_done;       // [2] sender blocks finished: dispatch, combine
  std::int32_t* accepted;           // [2] whether the last dispatch / combine went through
  std::int32_t* num_recv;           // rows the last dispatch delivered here (0 if rejected)
  // [R] set by the host's exit watch (cuda/exit_watch.hpp) once a peer's
  // process is gone; pinned host memory. Null over a transport that cannot tell.
  const std::uint64_t* exited;
  report* rep;  // first failure since the host last read it
};

static_assert(std::is_trivially_copyable_v<workspace>);

struct dispatch_args {
  peer_table peers;  // over an RMA transport only this rank's buffer and (mapped) counters
  normal_route route;
  wire::region_plan plan;
  workspace ws;
  const void* x;                 // [T][H] Token
  const float* x_scales;         // [T][H/128] (fp8), else null
  const std::int64_t* topk_idx;  // [T][K]
  const float* topk_weights;     // [T][K]
  int num_tokens;
  int hidden;
  int topk;
  int num_experts;
  int max_recv_tokens;
  int recv_bound;        // worst_case_recv_tokens, 0 = none
  int expert_alignment;  // >= 1: num_recv_tokens_per_expert rounded up to a multiple
  int token_id;
  int max_blocks;  // blocks any one kernel may launch (>= 2); see device_calls::block_budget
  // 1: a dispatch from a cached handle, along the routing already in ws
  // (count matrix, send_pos): no layout, a notify round of headers carrying
  // the count matrix's fingerprint, no top-k arrays (topk 0); ws's count
  // matrix and send_pos are read, never written.
  int cached;
  std::uint64_t timeout_ns;
  // Non-empty when the host already rejected the input (shape, sizes): the
  // notify phase posts it so every rank fails together.
  char host_cause[wire::cause_bytes];
};

struct combine_args {
  peer_table peers;
  normal_route route;
  wire::region_plan plan;
  workspace ws;
  const void* y;           // [y_rows][H] combine elements
  const float* y_weights;  // [y_rows][K] or null (then no rank passes weights)
  const void* bias_0;      // [T][H] or null
  const void* bias_1;      // [T][H] or null
  void* out_x;             // [T][H]
  float* out_weights;      // [T][K] when y_weights is given
  long long y_rows;
  int num_tokens;
  int hidden;
  int topk;
  int out_id;      // token_traits id of y's elements, posted in the combine header
  int max_blocks;  // blocks any one kernel may launch (>= 2); see device_calls::block_budget
  std::uint64_t timeout_ns;
  char host_cause[wire::cause_bytes];
};

// Where a normal-mode call's kernels relay an abort (abort_link.hpp): the
// words follow the wire format's signal slots.
EPCOMM_HD inline abort_link normal_abort_link(const peer_table& peers, const normal_route& route) {
  const std::size_t first = wire::signal_slots(peers.world_size);
  if (route.via_proxy != 0) return make_abort_link(peers, first, route.abort);
  return make_abort_link(peers, first);
}
EPCOMM_HD inline abort_link abort_link_of(const dispatch_args& a) {
  return normal_abort_link(a.peers, a.route);
}
EPCOMM_HD inline abort_link abort_link_of(const combine_args& a) {
  return normal_abort_link(a.peers, a.route);
}

static_assert(std::is_trivially_copyable_v<dispatch_args> && sizeof(dispatch_args) <= 4096);
static_assert(std::is_trivially_copyable_v<combine_args> && sizeof(combine_args) <= 4096);

}  // namespace epcomm::cuda
