// Layout: where each token of one rank goes. A token is sent once to each rank
// that owns at least one of its top-k experts, however many of that rank's
// experts it picked. Everything here is a pure function of (topology,
// topk_idx), so every rank can recompute any other rank's layout, which is
// what the tests' independent reference does.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "epcomm/core/config.hpp"
#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/topology.hpp"

namespace epcomm {

// The rank that receives `expert`, or -1 for the "no expert" id -1.
EPCOMM_HD inline int destination_rank(std::int64_t expert, int experts_per_rank) {
  return expert < 0 ? -1 : static_cast<int>(expert / experts_per_rank);
}

// The id of `expert` among `rank`'s local experts, or -1 when it lives elsewhere.
// This is the rewrite a receiver sees in its recv_topk_idx.
EPCOMM_HD inline std::int64_t local_expert_id(std::int64_t expert, int rank, int experts_per_rank) {
  const std::int64_t first = static_cast<std::int64_t>(rank) * experts_per_rank;
  return expert >= first && expert < first + experts_per_rank ? expert - first : -1;
}

// Describes the first entry of topk_idx[T][K] outside [-1, E), or nullopt.
inline std::optional<std::string> find_invalid_expert(std::span<const std::int64_t> topk_idx,
                                                      int topk, int num_experts) {
  for (std::size_t i = 0; i < topk_idx.size(); ++i) {
    const std::int64_t e = topk_idx[i];
    if (e < -1 || e >= num_experts)
      return input_error_text(describe_invalid_expert, static_cast<long long>(i), topk, e,
                              num_experts);
  }
  return std::nullopt;
}

struct layout {
  int num_tokens = 0;
  int world_size = 0;
  std::vector<int> tokens_per_rank;    // [R] tokens sent to each rank
  std::vector<int> tokens_per_expert;  // [E] (token, k) entries naming each expert
  // [T][R]: the index of token t among the tokens sent to rank r (tokens keep
  // their source order), or -1 when t does not go to r.
  std::vector<int> send_pos;

  bool in_rank(int token, int rank) const { return send_pos[token * world_size + rank] >= 0; }
  int position(int token, int rank) const { return send_pos[token * world_size + rank]; }
};

// Requires every id of topk_idx[T][topo.topk] to be valid (find_invalid_expert).
inline layout make_layout(const topology& topo, std::span<const std::int64_t> topk_idx,
                          int num_tokens) {
  const int world = topo.world_size;
  const int per_rank = topo.experts_per_rank();
  layout out;
  out.num_tokens = num_tokens;
  out.world_size = world;
  out.tokens_per_rank.assign(world, 0);
  out.tokens_per_expert.assign(topo.num_experts, 0);
  out.send_pos.assign(static_cast<std::size_t>(num_tokens) * world, -1);
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < topo.topk; ++k) {
      const std::int64_t e = topk_idx[static_cast<std::size_t>(t) * topo.topk + k];
      if (e < 0) continue;
      ++out.tokens_per_expert[e];
      const int r = destination_rank(e, per_rank);
      int& pos = out.send_pos[static_cast<std::size_t>(t) * world + r];
      if (pos < 0) pos = out.tokens_per_rank[r]++;
    }
  }
  return out;
}

}  // namespace epcomm
