// Arguments and results of low-latency (decode / rollout) dispatch and combine.
// Shapes follow DeepEP's Buffer.low_latency_dispatch / low_latency_combine so
// frameworks port directly; spans are row-major. Results are views into the
// buffer's preallocated memory: no call allocates, and no shape depends on the
// routing.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/low_latency/scale_layout.hpp"
#include "epcomm/low_latency/wire.hpp"

namespace epcomm {

// What low-latency mode carries on the wire: bf16, or fp8 with one scale per 128 channels.
template <class W>
concept low_latency_wire = std::same_as<W, bf16> || std::same_as<W, fp8_e4m3>;

// Sizes a low-latency buffer is built for; every rank passes the same values
// (checked when the buffer is built).
struct low_latency_config {
  int num_experts = 0;
  int hidden = 0;  // channels per token; fixed for the buffer's life
  int max_topk = 0;
  int max_tokens_per_rank = 0;  // DeepEP's num_max_dispatch_tokens_per_rank
  // fp8 wire only: fp8 scales rounded up to powers of two (DeepEP's round_scale).
  bool round_scale = false;
  std::chrono::milliseconds timeout = default_timeout;  // EPCOMM_TIMEOUT_MS overrides
  // Keep going without a rank whose process exited (DeepEP's shrink mode):
  // its experts' contributions are skipped and counted instead of failing the
  // group. Host engine over shm, or over libfabric and UCX on fabrics that
  // serve the survivors after a peer's exit; see docs/low_latency.md.
  bool mask_lost_ranks = false;
  // Bound on construction (config agreement, transport set-up, connections);
  // 0: the call timeout in force. See setup_timeout_of.
  std::chrono::milliseconds setup_timeout{0};
  // fp8 wire only: how recv_x_scales is laid out (low_latency/scale_layout.hpp);
  // token_major and ue8m0 are DeepEP's, for DeepGEMM. ue8m0 needs round_scale.
  ll_scale_layout scale_layout = ll_scale_layout::row_major;
  // Device buffers: at most this many thread blocks per kernel launch, the
  // share of the GPU communication may take (DeepEP's num_sms). 0: two per SM.
  int max_blocks = 0;
};

struct ll_dispatch_input {
  int num_tokens = 0;
  int topk = 0;
  std::span<const bf16> x;                 // [T][hidden]
  std::span<const std::int64_t> topk_idx;  // [T][K], -1 = no expert
};

// Names one dispatch, so that combine can send expert outputs back along it.
// Plain data; valid until the next dispatch on the same parity.
struct ll_handle {
  int parity = -1;
  std::uint64_t epoch = 0;  // the dispatch's epoch on its parity
  int num_tokens = 0;
  int topk = 0;
};

// Every (token, top-k slot) whose expert lives here is one row of that local
// expert. Rows are packed per expert, by source rank, then by token, then by
// top-k slot: expert e's rows [0, recv_count[e]) are valid, and
// recv_range[e][s] says which of them came from rank s. The views stay valid
// until the next dispatch on the same parity (two dispatches later).
template <class Wire>
struct ll_dispatch_result {
  std::span<const Wire> recv_x;  // [E_local][R * max_tokens][H]
  // fp8 wire, in the buffer's scale_layout: row_major and token_major fill
  // recv_x_scales, ue8m0 fills recv_x_scales_ue8m0 (the other stays empty).
  std::span<const float> recv_x_scales;
  std::span<const std::int32_t> recv_x_scales_ue8m0;
  std::span<const std::int32_t> recv_count;     // [E_local]
  std::span<const wire::ll::source> recv_src;   // [E_local][R * max_tokens]
  std::span<const wire::ll::range> recv_range;  // [E_local][R]
  ll_handle handle;
};

struct ll_combine_input {
  // [E_local][R * max_tokens][H] expert outputs aligned with recv_x; may be
  // the buffer's combine_send_buffer(handle) (zero copy).
  std::span<const bf16> y;
  std::span<const std::int64_t> topk_idx;  // [T][K], the dispatched ids
  std::span<const float> topk_weights;     // [T][K]
};

// Cumulative per-rank counters that point at stragglers: a source whose wait
// time grows faster than the others' arrives late.
struct ll_stats {
  std::vector<std::uint64_t> recv_tokens_per_expert;    // [E_local] rows received
  std::vector<std::chrono::nanoseconds> dispatch_wait;  // [R] blocked on each source's records
  std::vector<std::chrono::nanoseconds> combine_wait;   // [R] blocked on each expert rank's rows
  // mask_lost_ranks: routed (token, top-k slot) rows that combine skipped
  // because their expert's rank was lost (each counted once, by the combine).
  std::uint64_t masked_contributions = 0;
};

}  // namespace epcomm
