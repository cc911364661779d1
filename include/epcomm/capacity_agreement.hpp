// The capacities a normal-mode buffer is built with, agreed collectively: each
// rank checks its own configuration, all ranks exchange theirs, and every rank
// fails (naming the culprit) unless all are valid and identical. A mismatch
// would otherwise give ranks different region plans and hang the ones that
// agree. Same checks, messages and result as the host engine (buffer.hpp), so
// a device buffer and a host buffer built from one config share one plan.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/error.hpp"
#include "epcomm/normal_mode.hpp"
#include "epcomm/token_types.hpp"
#include "epcomm/wire.hpp"

namespace epcomm {

template <token_type Token, bootstrap B>
wire::capacity agree_capacity(B& boot, const buffer_config& cfg,
                              std::chrono::milliseconds timeout) {
  struct config_record {
    std::int32_t valid;
    std::int32_t num_experts, max_hidden, max_topk, max_tokens_per_rank, max_recv_tokens;
    std::int32_t token_id;
  };
  const int world = boot.world_size();
  std::string cause;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok && cause.empty()) cause = what;
  };
  need(cfg.num_experts >= world && cfg.num_experts % world == 0,
       "num_experts (" + std::to_string(cfg.num_experts) + ") must be a positive multiple of " +
           "world_size (" + std::to_string(world) + ")");
  need(cfg.max_hidden > 0, "max_hidden must be > 0");
  need(!token_traits<Token>::has_scales || cfg.max_hidden % 128 == 0,
       "max_hidden must be a multiple of 128 for fp8 tokens (one scale per 128 channels)");
  need(cfg.max_topk > 0 && cfg.max_topk <= cfg.num_experts, "max_topk must be in [1, num_experts]");
  need(cfg.max_tokens_per_rank >= 0, "max_tokens_per_rank must be >= 0");
  need(cfg.max_recv_tokens >= 0, "max_recv_tokens must be >= 0");
  const long long recv = cfg.max_recv_tokens > 0
                             ? cfg.max_recv_tokens
                             : static_cast<long long>(world) * cfg.max_tokens_per_rank;
  need(recv <= std::numeric_limits<std::int32_t>::max(), "max_recv_tokens overflows int32");

  const config_record mine{cause.empty() ? 1 : 0,   cfg.num_experts,
                           cfg.max_hidden,          cfg.max_topk,
                           cfg.max_tokens_per_rank, static_cast<std::int32_t>(recv),
                           token_traits<Token>::id};
  const auto bytes = boot.all_gather(std::as_bytes(std::span(&mine, 1)), deadline::after(timeout));
  std::vector<config_record> all(world);
  std::memcpy(all.data(), bytes.data(), bytes.size());
  if (!cause.empty()) throw error(boot.rank(), "buffer", no_peer, "invalid config: " + cause);
  for (int p = 0; p < world; ++p) {
    if (!all[p].valid) throw error(boot.rank(), "buffer", p, "peer rejected its config");
    if (std::memcmp(&all[p], &mine, sizeof mine) != 0)
      throw error(boot.rank(), "buffer", p,
                  "config differs from this rank's (num_experts, max_hidden, max_topk, "
                  "max_tokens_per_rank, max_recv_tokens and token type must agree)");
  }
  const int max_rows = cfg.max_tokens_per_rank * std::min(cfg.max_topk, world);
  return wire::capacity{world,
                        cfg.num_experts,
                        cfg.max_hidden,
                        cfg.max_topk,
                        cfg.max_tokens_per_rank,
                        static_cast<int>(recv),
                        max_rows,
                        static_cast<int>(sizeof(Token)),
                        static_cast<int>(sizeof(combine_type_t<Token>)),
                        token_traits<Token>::has_scales};
}

}  // namespace epcomm
