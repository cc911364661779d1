// Host-side checks of the device low-latency path, before any kernel runs:
// the collective configuration agreement and what the host can see of a
// call's input (counts, sizes, null pointers, the handle). Expert ids and the
// dispatched routing live in device memory and are checked by the kernels.
//
// The wording, and the order of the checks, are the host engine's
// (low_latency.hpp), and the configuration record is byte for byte the one
// its ranks exchange, so a device rank and a host rank agree on the same
// terms. A non-empty cause does not throw here: it travels as the rank's
// reject record, so every rank rejects the call together.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/deadline.hpp"
#include "epcomm/error.hpp"
#include "epcomm/fp8_scaling.hpp"
#include "epcomm/low_latency_mode.hpp"
#include "epcomm/low_latency_wire.hpp"
#include "epcomm/token_types.hpp"

namespace epcomm::cuda {

// The shape every rank of a low-latency buffer agrees on, checked
// collectively so that a mismatch fails on all ranks instead of hanging the
// ones that agree. `local_cause`, when not empty, rejects this rank's config
// for a reason only it can see (e.g. its device's shared memory).
template <class Wire, bootstrap B>
wire::ll::shape agree_ll_shape(B& boot, const low_latency_config& cfg,
                               std::chrono::milliseconds timeout,
                               const std::string& local_cause = {}) {
  struct config_record {
    std::int32_t valid;
    std::int32_t num_experts, hidden, max_topk, max_tokens_per_rank, round_scale;
    std::int32_t wire_id;
  };
  const int world = boot.world_size();
  constexpr bool fp8 = token_traits<Wire>::has_scales;
  std::string cause;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok && cause.empty()) cause = what;
  };
  need(cfg.num_experts >= world && cfg.num_experts % world == 0,
       "num_experts (" + std::to_string(cfg.num_experts) + ") must be a positive multiple of " +
           "world_size (" + std::to_string(world) + ")");
  need(cfg.hidden > 0, "hidden must be > 0");
  need(!fp8 || cfg.hidden % fp8_block == 0,
       "hidden must be a multiple of 128 on the fp8 wire (one scale per 128 channels)");
  need(fp8 || !cfg.round_scale, "round_scale applies to the fp8 wire only");
  need(cfg.max_topk > 0 && cfg.max_topk <= cfg.num_experts, "max_topk must be in [1, num_experts]");
  need(cfg.max_tokens_per_rank > 0, "max_tokens_per_rank must be > 0");
  need(static_cast<long long>(world) * cfg.max_tokens_per_rank <=
           std::numeric_limits<std::int32_t>::max(),
       "world_size * max_tokens_per_rank overflows int32");
  need(local_cause.empty(), local_cause);

  const config_record mine{cause.empty() ? 1 : 0, cfg.num_experts,         cfg.hidden,
                           cfg.max_topk,          cfg.max_tokens_per_rank, cfg.round_scale ? 1 : 0,
                           token_traits<Wire>::id};
  const auto bytes = boot.all_gather(std::as_bytes(std::span(&mine, 1)), deadline::after(timeout));
  std::vector<config_record> all(world);
  std::memcpy(all.data(), bytes.data(), bytes.size());
  if (!cause.empty())
    throw error(boot.rank(), "low_latency_buffer", no_peer, "invalid config: " + cause);
  for (int p = 0; p < world; ++p) {
    if (!all[p].valid)
      throw error(boot.rank(), "low_latency_buffer", p, "peer rejected its config");
    if (std::memcmp(&all[p], &mine, sizeof mine) != 0)
      throw error(boot.rank(), "low_latency_buffer", p,
                  "config differs from this rank's (num_experts, hidden, max_topk, "
                  "max_tokens_per_rank, round_scale and wire type must agree)");
  }
  return wire::ll::shape{world,        cfg.num_experts,         cfg.hidden,
                         cfg.max_topk, cfg.max_tokens_per_rank, static_cast<int>(sizeof(Wire)),
                         fp8};
}

// What the host sees of a dispatch: counts and whether the pointers are set.
struct ll_dispatch_request {
  int num_tokens;
  int topk;
  bool has_x;
  bool has_topk_idx;
};

inline std::string check_ll_dispatch(const wire::ll::shape& s, const ll_dispatch_request& in) {
  if (in.num_tokens < 0) return "num_tokens is negative";
  if (in.num_tokens > s.max_tokens_per_rank)
    return std::to_string(in.num_tokens) + " tokens exceed max_tokens_per_rank " +
           std::to_string(s.max_tokens_per_rank);
  if (in.topk < 1 || in.topk > s.max_topk)
    return "topk " + std::to_string(in.topk) + " is outside [1, " + std::to_string(s.max_topk) +
           "]";
  // The host engine checks span sizes here; device pointers carry none.
  if (in.num_tokens > 0 && !in.has_x)
    return "x is null with " + std::to_string(in.num_tokens) + " tokens";
  if (in.num_tokens > 0 && !in.has_topk_idx)
    return "topk_idx is null with " + std::to_string(in.num_tokens) + " tokens";
  return {};
}

// What the host sees of a combine: the handle against the dispatch this rank
// last issued on the handle's parity, and the pointers.
struct ll_combine_request {
  int parity;
  std::uint64_t handle_dispatch;  // the handle's dispatch number on its parity
  std::uint64_t last_dispatch;    // the parity's last dispatch number
  bool dispatch_accepted;         // that dispatch was not rejected on the host
  int handle_tokens, handle_topk;
  int dispatch_tokens, dispatch_topk;
  bool has_y, has_topk_idx, has_topk_weights;
};

inline std::string check_ll_combine(const ll_combine_request& in) {
  const auto n = [](auto v) { return std::to_string(v); };
  if (!in.dispatch_accepted || in.handle_dispatch != in.last_dispatch)
    return "handle is stale: it names dispatch " + n(in.handle_dispatch) + " of parity " +
           n(in.parity) + ", whose outputs a later dispatch replaced";
  if (in.handle_tokens != in.dispatch_tokens || in.handle_topk != in.dispatch_topk)
    return "handle says T=" + n(in.handle_tokens) + ", K=" + n(in.handle_topk) +
           " but its dispatch had T=" + n(in.dispatch_tokens) + ", K=" + n(in.dispatch_topk);
  if (!in.has_y) return "y is null";
  const long long tk = static_cast<long long>(in.handle_tokens) * in.handle_topk;
  if (tk > 0 && (!in.has_topk_idx || !in.has_topk_weights))
    return std::string(!in.has_topk_idx ? "topk_idx" : "topk_weights") +
           " is null with T*K = " + n(tk) + " values";
  return {};
}

}  // namespace epcomm::cuda
