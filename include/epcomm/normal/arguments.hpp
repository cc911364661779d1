// Arguments and results of normal (throughput) mode dispatch and combine.
// Shapes follow DeepEP's Buffer.dispatch / Buffer.combine so frameworks port
// directly; spans are row-major.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/count_matrix.hpp"

namespace epcomm {

// Sizes a buffer is built for; every rank passes the same values (checked).
struct buffer_config {
  int num_experts = 0;
  int max_hidden = 0;
  int max_topk = 0;
  int max_tokens_per_rank = 0;
  // Rows a rank can receive in one dispatch; 0 means world_size *
  // max_tokens_per_rank, which no routing can exceed.
  int max_recv_tokens = 0;
  std::chrono::milliseconds timeout = default_timeout;  // EPCOMM_TIMEOUT_MS overrides
  // Keep going without a rank whose process exited (DeepEP's shrink mode):
  // calls go on without it, its rows and its experts' outputs are skipped and
  // counted instead of failing the group. Host engine over a peer-mapped
  // transport that can tell a peer's exit (shm) only; see docs/reliability.md.
  bool mask_lost_ranks = false;
  // Bound on construction (config agreement, transport set-up, connections);
  // 0: the call timeout in force. See setup_timeout_of.
  std::chrono::milliseconds setup_timeout{0};
  // Device buffers: at most this many thread blocks per kernel launch, the
  // share of the GPU communication may take (DeepEP's num_sms). 0: two per
  // SM. At least 2: dispatch runs a receiving block beside its senders.
  int max_blocks = 0;
  // Device buffers: dispatch handles that may be alive at once. Each pins a
  // slot holding its routing ((R + max_tokens_per_rank) * R * 4 bytes), so
  // that its combine may come after later dispatches (a layer's handle kept
  // from forward to backward); a dispatch while every slot is pinned fails.
  int max_live_handles = 8;
  // Flat host engine: the symmetric buffer's bytes at most (DeepEP's
  // num_nvl_bytes / num_rdma_bytes). 0, or a budget the regions for a whole
  // call fit in: sized for a whole call (docs/design.md section 7). Else the
  // buffer holds a window of rows per peer and calls larger than it move in
  // rounds (normal/window.hpp), with the same results; capacity().window_rows
  // says how many. A budget too small for one row per peer fails every rank.
  std::size_t max_buffer_bytes = 0;
};

template <token_type Token>
struct dispatch_input {
  int num_tokens = 0;
  int hidden = 0;
  int topk = 0;
  std::span<const Token> x;                // [T][H]
  std::span<const float> x_scales;         // [T][H/128] for fp8, else empty
  std::span<const std::int64_t> topk_idx;  // [T][K], -1 = no expert
  std::span<const float> topk_weights;     // [T][K]
};

// A dispatch along the routing of an earlier one (DeepEP's dispatch(handle=)):
// the rows only, [handle.num_tokens][handle.hidden], in the handle's token order.
template <token_type Token>
struct cached_dispatch_input {
  std::span<const Token> x;         // [T][H]
  std::span<const float> x_scales;  // [T][H/128] for fp8, else empty
};

struct dispatch_options {
  // A worst-case receive bound: results are padded to exactly this many rows
  // (topk_idx -1, weight 0 in the padding), so no result shape depends on the
  // routing. Exceeding it is an error on every rank. 0 = no bound.
  int worst_case_recv_tokens = 0;
  // DeepEP's expert_alignment: num_recv_tokens_per_expert rounded up to a
  // multiple of it (aligned_expert_count), for a grouped GEMM's row blocks.
  int expert_alignment = 1;
};

// What every engine requires of the options, worded once; empty when valid.
inline std::string check_dispatch_options(const dispatch_options& opt, int max_recv_tokens) {
  if (opt.worst_case_recv_tokens < 0 || opt.worst_case_recv_tokens > max_recv_tokens)
    return "worst_case_recv_tokens " + std::to_string(opt.worst_case_recv_tokens) +
           " is outside [0, max_recv_tokens " + std::to_string(max_recv_tokens) + "]";
  if (opt.expert_alignment < 1)
    return "expert_alignment " + std::to_string(opt.expert_alignment) + " is not >= 1";
  return {};
}

// The dispatch a handle answers: its group and its input's sizes, which a
// combine or a dispatch along the handle must match. The host handle and the
// device one (cuda/device_buffer.hpp) both start with it.
struct handle_shape {
  int world_size = 0;
  int rank = 0;
  int num_tokens = 0;
  int hidden = 0;
  int topk = 0;
};

// What combine needs to send rows back: the counts every rank exchanged and
// where each of this rank's tokens went.
struct dispatch_handle : handle_shape {
  int num_recv_tokens = 0;
  std::vector<int> count_matrix;  // [R][R]: tokens rank s sent to rank r
  std::vector<int> send_pos;      // [T][R]: row of token t among those sent to r, or -1
  // The dispatch that exchanged these counts: its call number, the same on
  // every rank (a dispatch from this handle keeps it).
  std::uint64_t origin = 0;

  int sent(int src, int dst) const { return count_matrix[src * world_size + dst]; }
  // The count matrix's prefix sums (normal/count_matrix.hpp), as the kernels take them.
  int recv_offset(int src, int dst) const {
    return epcomm::recv_offset(count_matrix.data(), world_size, src, dst);
  }
  int return_offset(int src, int dst) const {
    return epcomm::return_offset(count_matrix.data(), world_size, src, dst);
  }
  // What a cached dispatch's and a combine's headers carry, so that every
  // rank checks the others call along a handle of the same dispatch.
  int routing() const { return routing_fingerprint(count_matrix.data(), world_size, origin); }
};

// Empty when `h` can be a handle a dispatch of this rank returned, within the
// buffer's limits; else why not. Handles are plain data a caller could build
// or mix up, and a combine or cached dispatch trusts their counts.
inline std::string check_handle(const dispatch_handle& h, int rank, int world, int max_tokens,
                                int max_hidden, int max_topk) {
  if (h.world_size != world || h.rank != rank)
    return input_error_text(describe_foreign_handle, h.rank, h.world_size);
  const auto r = static_cast<std::size_t>(world);
  if (h.num_tokens < 0 || h.num_tokens > max_tokens || h.hidden < 1 || h.hidden > max_hidden ||
      h.topk < 1 || h.topk > max_topk || h.count_matrix.size() != r * r ||
      h.send_pos.size() != static_cast<std::size_t>(h.num_tokens) * r ||
      h.num_recv_tokens != h.recv_offset(world, rank))
    return input_error_text(describe_malformed_handle);
  return {};
}

// Received tokens ordered by (source rank, source token index). The spans view
// the buffer and stay valid until the next dispatch on it.
template <token_type Token>
struct dispatch_result {
  int num_recv_tokens = 0;                      // real rows; the spans may be padded
  std::span<const Token> recv_x;                // [N][H]
  std::span<const float> recv_x_scales;         // [N][H/128] for fp8
  std::span<const std::int64_t> recv_topk_idx;  // [N][K], local expert ids, -1 elsewhere
  std::span<const float> recv_topk_weights;     // [N][K], 0 where the id is -1
  std::span<const std::int32_t> recv_src_idx;   // [N] token index on its source rank
  // [E/R] (token, k) entries per local expert, rounded up to expert_alignment
  std::vector<int> num_recv_tokens_per_expert;
  dispatch_handle handle;
};

template <class Out>
struct combine_input {
  std::span<const Out> y;  // [N][H], aligned with what this rank received
  // [N][K] recv weights, summed back per source token; every rank passes them
  // or none does (a rank that received nothing passes an empty span).
  std::optional<std::span<const float>> topk_weights;
  std::span<const Out> bias_0;  // optional [T][H], added to the result
  std::span<const Out> bias_1;  // optional [T][H], added to the result
};

// Cumulative per-rank counters that point at stragglers.
struct buffer_stats {
  std::vector<std::chrono::nanoseconds> wait_per_peer;  // [R] time blocked on each rank's signals
  // mask_lost_ranks: (token, expert rank) rows that combine skipped because
  // that rank was lost, each counted once, by the token's combine.
  std::uint64_t masked_contributions = 0;
};

template <class Out>
struct combine_result {
  std::vector<Out> x;               // [T][H]: sum over destination ranks, fp32 accumulation
  std::vector<float> topk_weights;  // [T][K] when weights were given
};

}  // namespace epcomm
