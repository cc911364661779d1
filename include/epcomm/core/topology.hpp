// The shape of one expert-parallel group: how many ranks, how they group into
// nodes, and the model dimensions every rank must agree on.
#pragma once

#include <string>

#include "epcomm/core/error.hpp"

namespace epcomm {

struct topology {
  int world_size = 1;
  int ranks_per_node = 1;  // ranks sharing peer-mapped memory (NVLink / one host)
  int num_experts = 1;     // expert e lives on rank e / experts_per_rank()
  int hidden = 0;          // channels per token
  int topk = 1;            // experts chosen per token (-1 entries allowed)

  int experts_per_rank() const { return num_experts / world_size; }
  int num_nodes() const { return world_size / ranks_per_node; }
  int node_of(int rank) const { return rank / ranks_per_node; }
  int local_index(int rank) const { return rank % ranks_per_node; }
  int owner_of(int expert) const { return expert / experts_per_rank(); }

  // Throws epcomm::error (attributed to `rank`, in `op`) when the shape cannot
  // be served: the checks a user gets wrong first, each with its own message.
  void validate(int rank, const std::string& op) const {
    auto fail = [&](const std::string& cause) { throw error(rank, op, no_peer, cause); };
    if (world_size < 1) fail("world_size must be >= 1, got " + std::to_string(world_size));
    if (ranks_per_node < 1 || world_size % ranks_per_node != 0)
      fail("ranks_per_node (" + std::to_string(ranks_per_node) + ") must divide world_size (" +
           std::to_string(world_size) + ")");
    if (num_experts < world_size || num_experts % world_size != 0)
      fail("num_experts (" + std::to_string(num_experts) + ") must be a positive multiple of " +
           "world_size (" + std::to_string(world_size) + ")");
    if (hidden < 1) fail("hidden must be >= 1, got " + std::to_string(hidden));
    if (topk < 1 || topk > num_experts)
      fail("topk must be in [1, num_experts], got " + std::to_string(topk));
  }
};

}  // namespace epcomm
