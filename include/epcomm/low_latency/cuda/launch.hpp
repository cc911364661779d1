// Everything a low-latency kernel launch needs, as trivially copyable structs
// of plain pointers and integers (the host fills them without CUDA headers,
// the kernels receive them by value), and the launch geometry, which depends
// on the buffer's shape and the call's token count only: never on routing,
// so a captured CUDA graph replays with the right sizes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "epcomm/core/config.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/core/wire_basics.hpp"
#include "epcomm/cuda/abort_link.hpp"
#include "epcomm/low_latency/report.hpp"
#include "epcomm/low_latency/route.hpp"
#include "epcomm/low_latency/wire.hpp"
#include "epcomm/transport/peer_table.hpp"

namespace epcomm::cuda {

// The four kernels, in call order; indexes per-kernel counters.
enum class ll_kernel : int { dispatch_send = 0, dispatch_recv, combine_send, combine_recv };
inline constexpr int ll_kernel_count = 4;

// Per-rank device memory the kernels keep between launches; peers never
// touch it. Epochs and verdicts live here, not in launch arguments, so that
// every replay of a captured graph advances them like a fresh call.
struct ll_workspace {
  std::uint64_t* dispatch_epoch;  // [2] dispatches run per parity
  std::uint64_t* combine_epoch;   // [2] combines run per parity
  // [2] the parity's last dispatch delivered valid outputs (set by the send
  // phase from this rank's input, cleared by the receive phase when any rank
  // rejected): a combine of it is allowed.
  std::int32_t* dispatch_ok;
  std::int32_t* combine_ok;          // [2] this rank's input to the parity's last combine was valid
  std::uint32_t* blocks_done;        // [ll_kernel_count][2] finished blocks per kernel and parity
  std::uint64_t* wait_ns;            // [2][R] this call's longest wait per peer: dispatch, combine
  std::uint64_t* recv_tokens;        // [E_local] cumulative rows received (stats)
  std::uint64_t* dispatch_wait_sum;  // [R] cumulative wait per source (stats)
  std::uint64_t* combine_wait_sum;   // [R] cumulative wait per expert rank (stats)
  std::uint64_t* masked_contributions;  // [1] cumulative (stats)
  std::uint64_t* lost;                  // [R] set once a call went on without the rank
  // [R] set by the host's exit watch (cuda/exit_watch.hpp) once a peer's
  // process is gone; pinned host memory. Null over a transport that cannot
  // tell.
  const std::uint64_t* exited;
  // [2 kinds: dispatch, combine][2 parities][R]: what this rank decided about
  // each peer's part of its last call of that kind on that parity, once for
  // every block: 2 * epoch when it arrived, 2 * epoch + 1 when it was lost.
  std::uint64_t* peer_state;
  ll_report* rep;  // first failure since the host last read it
};

static_assert(std::is_trivially_copyable_v<ll_workspace>);

struct ll_args {
  // Over an RMA transport only this rank's buffer and (mapped) counters.
  peer_table peers;
  ll_route route;
  wire::ll::shape shape;
  wire::ll::plan plan;
  ll_workspace ws;
  int parity;
  int num_tokens;  // 0 when the host rejected the call: nothing is read
  int topk;
  int round_scale;
  int mask_lost_ranks;           // low_latency_config::mask_lost_ranks
  const bf16* x;                 // dispatch: [T][H]
  const std::int64_t* topk_idx;  // [T][K]
  const float* topk_weights;     // combine: [T][K]
  const bf16* y;                 // combine: [E_local][R * max_tokens][H]
  bf16* out;                     // combine: [T][H]
  int max_blocks;  // blocks any one kernel may launch (>= 1); see device_calls::block_budget
  std::uint64_t timeout_ns;
  // Non-empty when the host already rejected the input: the send phase
  // posts it as the reject record, so every rank fails together.
  char host_cause[wire::cause_bytes];
};

static_assert(std::is_trivially_copyable_v<ll_args> && sizeof(ll_args) <= 4096);

// Where a low-latency device buffer's abort words (cuda/abort_link.hpp) start,
// and how many signal slots it asks its transport for.
EPCOMM_HD constexpr std::size_t ll_abort_first_slot(const wire::ll::shape& s) {
  return wire::ll::signal_slots(s);
}
EPCOMM_HD constexpr std::size_t ll_device_signal_slots(const wire::ll::shape& s) {
  return with_abort_words(ll_abort_first_slot(s), s.world_size);
}

// Where this call's kernels relay an abort.
EPCOMM_HD inline abort_link abort_link_of(const ll_args& a) {
  if (a.route.via_proxy != 0)
    return make_abort_link(a.peers, ll_abort_first_slot(a.shape), a.route.abort);
  return make_abort_link(a.peers, ll_abort_first_slot(a.shape));
}

// Launch geometry. Every kernel uses ll_threads threads per block.
inline constexpr int ll_threads = 256;
inline constexpr int ll_warps = ll_threads / 32;

// Every kernel loops over its work, so any budget of max_blocks >= 1 blocks
// is correct; fewer blocks only take longer.

// Dispatch send: one block per token (a block casts the row once and writes
// it to every destination), contiguous chunks when tokens outnumber blocks.
inline int ll_dispatch_send_blocks(int tokens, int max_blocks) {
  return std::clamp(tokens, 1, max_blocks);
}

// Dispatch receive: one block per (local expert, source) region, or each
// block several regions in turn.
inline int ll_dispatch_recv_blocks(const wire::ll::shape& s, int max_blocks) {
  return std::clamp(s.local_experts() * s.world_size, 1, max_blocks);
}

// Combine send: one warp per received row, over the fixed row bound.
inline int ll_combine_send_blocks(const wire::ll::shape& s, int max_blocks) {
  const long long rows = static_cast<long long>(s.local_experts()) * s.rows_per_expert();
  return static_cast<int>(std::clamp<long long>((rows + ll_warps - 1) / ll_warps, 1, max_blocks));
}

// Combine receive: one block per token.
inline int ll_combine_recv_blocks(int tokens, int max_blocks) {
  return std::clamp(tokens, 1, max_blocks);
}

// Dynamic shared memory of the dispatch send kernel: the staged record body
// (payload, scales, padding), the destinations of one token, and two
// per-expert histograms.
EPCOMM_HD constexpr std::size_t ll_body_bytes(const wire::ll::shape& s) {
  return wire::ll::record_bytes(s) - sizeof(wire::ll::record_header);
}
EPCOMM_HD constexpr std::size_t ll_send_shared_bytes(const wire::ll::shape& s) {
  return ll_body_bytes(s) + sizeof(std::byte*) * static_cast<std::size_t>(s.max_topk) +
         2 * sizeof(int) * static_cast<std::size_t>(s.num_experts);
}

}  // namespace epcomm::cuda
