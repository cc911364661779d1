// The host-side checks of a low-latency buffer, shared by the host engine
// (low_latency/buffer.hpp) and the device buffer (low_latency/cuda/device_buffer.hpp) so
// that both check in the same order and word their errors alike: the
// collective agreement on the buffer's shape (its record is byte for byte the
// same on both, so a device rank and a host rank agree on the same terms),
// whether a parity may take a new call, and what a call's counts and handle
// must satisfy. Input checks return the cause (empty: none) rather than
// throw: a rejected call still runs its exchange, so that every rank rejects
// it together.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/host/config_agreement.hpp"
#include "epcomm/low_latency/arguments.hpp"
#include "epcomm/low_latency/wire.hpp"

namespace epcomm {

// The shape every rank of a low-latency buffer agrees on. `local_cause`,
// when not empty, rejects this rank's config for a reason only it can see
// (e.g. its device's shared memory). `can_mask_lost_ranks` says whether the
// caller's engine and transport implement cfg.mask_lost_ranks; where they do
// not, asking for it fails every rank rather than being ignored. `Wires` are
// the wires the buffer serves: the shape's record is as wide as the widest,
// with scales if fp8 is among them, and every rank must serve the same ones.
template <class... Wires, bootstrap B>
requires(sizeof...(Wires) > 0) wire::ll::shape
    agree_ll_shape(B& boot, const low_latency_config& cfg, std::chrono::milliseconds timeout,
                   const std::string& local_cause = {}, bool can_mask_lost_ranks = false) {
  struct config_record {
    std::int32_t valid;
    std::int32_t num_experts, hidden, max_topk, max_tokens_per_rank, round_scale;
    std::int32_t wire_ids;  // a bit per served wire's token_traits id
    std::int32_t mask_lost_ranks;
    std::int32_t scale_layout;
  };
  const int world = boot.world_size();
  constexpr bool fp8 = (token_traits<Wires>::has_scales || ...);
  // A buffer that also serves a wire without scales takes any hidden (a
  // gpt-oss hidden of 2880 in bf16); its fp8 calls are then refused
  // (check_ll_counts), as the normal-mode engines refuse them.
  constexpr bool fp8_only = (token_traits<Wires>::has_scales && ...);
  constexpr int wire_bytes = static_cast<int>(std::max({sizeof(Wires)...}));
  config_checks checks;
  checks.need_experts_per_rank(cfg.num_experts, world);
  checks.need(cfg.hidden > 0, "hidden must be > 0");
  checks.need(!fp8_only || cfg.hidden % fp8_block == 0,
              "hidden must be a multiple of 128 on the fp8 wire (one scale per 128 channels)");
  checks.need(fp8 || !cfg.round_scale, "round_scale applies to the fp8 wire only");
  checks.need(fp8 || cfg.scale_layout == ll_scale_layout::row_major,
              "scale_layout applies to the fp8 wire only");
  checks.need(cfg.scale_layout == ll_scale_layout::row_major ||
                  cfg.scale_layout == ll_scale_layout::token_major ||
                  cfg.scale_layout == ll_scale_layout::ue8m0,
              "scale_layout is not one of row_major, token_major, ue8m0");
  checks.need(cfg.scale_layout != ll_scale_layout::ue8m0 || cfg.round_scale,
              "the ue8m0 scale layout needs round_scale (power-of-two scales)");
  checks.need_topk_within_experts(cfg.max_topk, cfg.num_experts);
  checks.need(cfg.max_tokens_per_rank > 0, "max_tokens_per_rank must be > 0");
  checks.need(static_cast<long long>(world) * cfg.max_tokens_per_rank <=
                  std::numeric_limits<std::int32_t>::max(),
              "world_size * max_tokens_per_rank overflows int32");
  checks.need(cfg.max_blocks >= 0, "max_blocks must be >= 0 (0: two per SM)");
  checks.need(!cfg.mask_lost_ranks || can_mask_lost_ranks,
              "mask_lost_ranks needs a transport that can tell a peer's exit and go on without "
              "it (shm, nvlink_ipc, libfabric, UCX over transports that report peer failures)");
  checks.need(local_cause.empty(), local_cause);

  const config_record mine{checks.cause().empty() ? 1 : 0,
                           cfg.num_experts,
                           cfg.hidden,
                           cfg.max_topk,
                           cfg.max_tokens_per_rank,
                           cfg.round_scale ? 1 : 0,
                           ((std::int32_t{1} << token_traits<Wires>::id) | ...),
                           cfg.mask_lost_ranks ? 1 : 0,
                           static_cast<std::int32_t>(cfg.scale_layout)};
  agree_config(boot, mine, checks.cause(), timeout, "low_latency_buffer",
               "num_experts, hidden, max_topk, max_tokens_per_rank, round_scale, "
               "mask_lost_ranks, scale_layout and wire types");
  return wire::ll::shape{world,        cfg.num_experts,         cfg.hidden,
                         cfg.max_topk, cfg.max_tokens_per_rank, wire_bytes,
                         fp8,          cfg.scale_layout};
}

// A handle names parity 0 or 1; anything else was not made by a dispatch.
inline void check_ll_handle_parity(int rank, const char* op, int parity) {
  if (parity != 0 && parity != 1)
    throw error(rank, op, no_peer,
                "handle has parity " + std::to_string(parity) + ": not from a dispatch");
}

// A dispatch's wire and counts against the buffer's shape as the call lays
// it out (wire::ll::call_shape): an fp8 call needs whole 128-channel blocks.
inline std::string check_ll_counts(const wire::ll::shape& s, int num_tokens, int topk) {
  if (s.has_scales && s.hidden % fp8_block != 0)
    return input_error_text(describe_unscaled_hidden, s.hidden);
  if (num_tokens < 0) return "num_tokens is negative";
  if (num_tokens > s.max_tokens_per_rank)
    return std::to_string(num_tokens) + " tokens exceed max_tokens_per_rank " +
           std::to_string(s.max_tokens_per_rank);
  if (topk < 1 || topk > s.max_topk)
    return "topk " + std::to_string(topk) + " is outside [1, " + std::to_string(s.max_topk) + "]";
  return {};
}

// A combine's handle against the dispatch it names: the last one this rank
// issued on the handle's parity, accepted, with the handle's T and K.
struct ll_handle_check {
  int parity;
  std::uint64_t handle_dispatch;  // the handle's dispatch number on its parity
  std::uint64_t last_dispatch;    // the parity's last dispatch number
  bool dispatch_accepted;         // that dispatch was not rejected
  int handle_tokens, handle_topk;
  int dispatch_tokens, dispatch_topk;
};

inline std::string check_ll_handle(const ll_handle_check& in) {
  const auto n = [](auto v) { return std::to_string(v); };
  if (!in.dispatch_accepted || in.handle_dispatch != in.last_dispatch)
    return "handle is stale: it names dispatch " + n(in.handle_dispatch) + " of parity " +
           n(in.parity) + ", whose outputs a later dispatch replaced";
  if (in.handle_tokens != in.dispatch_tokens || in.handle_topk != in.dispatch_topk)
    return "handle says T=" + n(in.handle_tokens) + ", K=" + n(in.handle_topk) +
           " but its dispatch had T=" + n(in.dispatch_tokens) + ", K=" + n(in.dispatch_topk);
  return {};
}

}  // namespace epcomm
