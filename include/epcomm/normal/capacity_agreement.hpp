// The capacities a normal-mode buffer is built with, agreed collectively
// (host/config_agreement.hpp). Same checks, messages and result as the host engine
// (normal/buffer.hpp), so a device buffer and a host buffer built from one config
// share one plan.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/host/config_agreement.hpp"
#include "epcomm/normal/arguments.hpp"
#include "epcomm/normal/window.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm {

// What the calling engine implements, and how it plans its regions. Where an
// engine does not implement an option (mask_lost_ranks, max_buffer_bytes),
// asking for it fails every rank rather than being ignored.
struct engine_support {
  bool mask_lost_ranks = false;
  bool byte_budget = false;
  // wire::plan_regions' options, which the window a budget leaves depends on.
  bool staging = false;
  bool in_place_combine = false;
};

// Rows a rank of `cfg` can receive in one dispatch (max_recv_tokens, or
// every rank's whole max_tokens_per_rank), before the int32 check.
inline long long recv_rows(const buffer_config& cfg, int world) {
  return cfg.max_recv_tokens > 0 ? cfg.max_recv_tokens
                                 : static_cast<long long>(world) * cfg.max_tokens_per_rank;
}

// The capacity of a buffer of `cfg` serving Tokens on `world` ranks, its
// regions sized for whole calls (no window): the plan agree_capacity starts
// from. Meaningful for a config agree_capacity accepts.
template <token_type... Tokens>
wire::capacity whole_capacity(const buffer_config& cfg, int world) {
  const long long recv = recv_rows(cfg, world);
  return {world,
          cfg.num_experts,
          cfg.max_hidden,
          cfg.max_topk,
          cfg.max_tokens_per_rank,
          static_cast<int>(recv),
          cfg.max_tokens_per_rank * std::min(cfg.max_topk, world),
          static_cast<int>(std::max({sizeof(Tokens)...})),
          static_cast<int>(std::max({sizeof(combine_type_t<Tokens>)...})),
          (token_traits<Tokens>::has_scales || ...),
          0};
}

// Tokens: the types the buffer serves; regions are sized for the widest
// (wire::capacity's token and combine bytes, scales if any type has them).
// With cfg.max_buffer_bytes, the capacity's window is the one that budget
// leaves (normal/window.hpp); a budget that holds no window is this rank's
// cause, agreed like any other.
template <token_type... Tokens, bootstrap B>
wire::capacity agree_capacity(B& boot, const buffer_config& cfg, std::chrono::milliseconds timeout,
                              engine_support engine = {}) {
  struct config_record {
    std::int32_t valid;
    std::int32_t num_experts, max_hidden, max_topk, max_tokens_per_rank, max_recv_tokens;
    std::int32_t token_ids;  // bit token_traits<T>::id for each served T
    std::int32_t mask_lost_ranks;
    std::uint64_t max_buffer_bytes;
  };
  const int world = boot.world_size();
  config_checks checks;
  checks.need_experts_per_rank(cfg.num_experts, world);
  checks.need(cfg.max_hidden > 0, "max_hidden must be > 0");
  // A buffer that also serves unscaled types checks fp8 hidden per call.
  checks.need(!(token_traits<Tokens>::has_scales && ...) || cfg.max_hidden % 128 == 0,
              "max_hidden must be a multiple of 128 for fp8 tokens (one scale per 128 channels)");
  checks.need_topk_within_experts(cfg.max_topk, cfg.num_experts);
  checks.need(cfg.max_tokens_per_rank >= 0, "max_tokens_per_rank must be >= 0");
  checks.need(cfg.max_recv_tokens >= 0, "max_recv_tokens must be >= 0");
  const long long recv = recv_rows(cfg, world);
  checks.need(recv <= std::numeric_limits<std::int32_t>::max(), "max_recv_tokens overflows int32");
  checks.need(cfg.max_blocks == 0 || cfg.max_blocks >= 2,
              "max_blocks must be 0 (two per SM) or >= 2 (a receiving and a sending block)");
  checks.need(cfg.max_live_handles >= 1, "max_live_handles must be >= 1");
  checks.need(!cfg.mask_lost_ranks || engine.mask_lost_ranks,
              "mask_lost_ranks needs the flat host engine over a peer-mapped transport that can "
              "tell a peer's exit (shm)");
  checks.need(cfg.max_buffer_bytes == 0 || engine.byte_budget,
              "max_buffer_bytes needs the flat host engine (the device buffer and the "
              "hierarchical engine size their regions for a whole call)");

  const wire::capacity whole = whole_capacity<Tokens...>(cfg, world);
  wire::capacity cap = whole;
  if (checks.cause().empty()) {
    cap.window_rows = wire::window_for_budget(whole, cfg.max_buffer_bytes, engine.staging,
                                              engine.in_place_combine);
    if (cap.window_rows < 0) {
      cap.window_rows = 1;
      checks.need(false, "max_buffer_bytes " + std::to_string(cfg.max_buffer_bytes) +
                             " holds no receive window: one row per peer needs " +
                             std::to_string(wire::plan_regions(cap, engine.staging).total) +
                             " bytes");
    }
  }

  const config_record mine{checks.cause().empty() ? 1 : 0,
                           cfg.num_experts,
                           cfg.max_hidden,
                           cfg.max_topk,
                           cfg.max_tokens_per_rank,
                           static_cast<std::int32_t>(recv),
                           ((1 << token_traits<Tokens>::id) | ...),
                           cfg.mask_lost_ranks ? 1 : 0,
                           static_cast<std::uint64_t>(cfg.max_buffer_bytes)};
  agree_config(boot, mine, checks.cause(), timeout, "buffer",
               "num_experts, max_hidden, max_topk, max_tokens_per_rank, max_recv_tokens, "
               "mask_lost_ranks, max_buffer_bytes and token types");
  return cap;
}

}  // namespace epcomm
