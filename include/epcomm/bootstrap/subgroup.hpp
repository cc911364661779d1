// The bootstrap of one part of a split of a parent bootstrap's ranks, as
// MPI_Comm_split does it: every parent rank passes a colour; the ranks of one
// colour form a group, numbered in parent-rank order. This is how the
// hierarchical engine brings up a transport over each node and one over each
// rail (the ranks with the same local index on every node).
//
// Each collective is the parent's, and every parent rank takes part: the
// groups of one split call all_gather and barrier in step, each rank for its
// own group, and a rank keeps only its members' blocks. That suits groups
// that run the same code at the same time (a transport per group, built by
// every rank at once) and makes construction collective over the parent. A
// block travels padded to the largest block of the round, so groups may
// gather different sizes. Errors of the parent's collectives pass through
// unchanged: they name parent ranks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/error.hpp"

namespace epcomm {

// What local_rank() and local_world_size() of a group describe.
enum class subgroup_locality {
  // The parent's nodes: members on one parent node form one node of the
  // group. Every node must hold the same number of members, numbered
  // consecutively (which parent-rank order gives when the parent's nodes are
  // consecutive ranks, as every epcomm bootstrap numbers them).
  parent_nodes,
  // One node: the group declares that its members share peer-mapped memory
  // even across the parent's nodes (virtual nodes on one host, or an NVLink
  // domain that spans hosts).
  one_node,
};

template <bootstrap B>
class subgroup_bootstrap {
 public:
  // Collective over `parent`. `name` tells this split apart from others of
  // the same parent in the job tag that transports name OS resources with.
  subgroup_bootstrap(B& parent, int colour, std::string_view name, deadline dl,
                     subgroup_locality locality = subgroup_locality::parent_nodes)
      : parent_(&parent) {
    struct entry {
      std::int32_t colour, local_rank;
    };
    const entry mine{colour, parent.local_rank()};
    const auto bytes = parent.all_gather(std::as_bytes(std::span(&mine, 1)), dl);
    std::vector<entry> all(parent.world_size());
    std::memcpy(all.data(), bytes.data(), bytes.size());
    for (int p = 0; p < parent.world_size(); ++p)
      if (all[p].colour == colour) members_.push_back(p);
    rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), parent.rank()) -
                             members_.begin());
    if constexpr (has_job_tag<B>)
      job_tag_ = std::string(parent.job_tag()) + "-" + std::string(name) + std::to_string(colour);
    if (locality == subgroup_locality::one_node) {
      local_rank_ = rank_;
      local_world_size_ = world_size();
      return;
    }
    // Every rank checks every group, so a bad split fails everywhere alike.
    for (int p = 0; p < parent.world_size(); ++p) {
      const node_shape shape = shape_of(all, p);
      if (!shape.regular)
        throw error(parent.rank(), "subgroup bootstrap", no_peer,
                    "the ranks of colour " + std::to_string(all[p].colour) +
                        " are spread unevenly over the parent's nodes (each node must hold the "
                        "same number of them); this group's nodes cannot be described");
      if (p == parent.rank()) {
        local_rank_ = shape.index;
        local_world_size_ = shape.size;
      }
    }
  }

  int rank() const { return rank_; }
  int world_size() const { return static_cast<int>(members_.size()); }
  int local_rank() const { return local_rank_; }
  int local_world_size() const { return local_world_size_; }
  // The parent rank of each member, in group order.
  std::span<const int> members() const { return members_; }

  const std::string& job_tag() const requires has_job_tag<B> { return job_tag_; }

  std::vector<std::byte> all_gather(std::span<const std::byte> mine, deadline dl) {
    const std::uint64_t size = mine.size();
    const auto sizes_bytes = parent_->all_gather(std::as_bytes(std::span(&size, 1)), dl);
    std::vector<std::uint64_t> sizes(parent_->world_size());
    std::memcpy(sizes.data(), sizes_bytes.data(), sizes_bytes.size());
    const std::uint64_t widest = *std::max_element(sizes.begin(), sizes.end());
    std::vector<std::byte> padded(widest);
    std::copy(mine.begin(), mine.end(), padded.begin());
    const auto blocks = parent_->all_gather(padded, dl);
    // Checked after both rounds, so that no parent rank is left waiting in one.
    for (int r = 0; r < world_size(); ++r)
      if (sizes[members_[r]] != size)
        throw error(rank_, "subgroup all_gather", r,
                    "block sizes disagree: " + std::to_string(sizes[members_[r]]) +
                        " bytes from the peer, " + std::to_string(size) + " here");
    std::vector<std::byte> out(size * members_.size());
    for (int r = 0; r < world_size(); ++r)
      std::copy_n(blocks.begin() + members_[r] * widest, size, out.begin() + r * size);
    return out;
  }

  void barrier(deadline dl) { parent_->barrier(dl); }

 private:
  struct node_shape {
    bool regular;  // the colour's members on each parent node are equally many
    int index;     // of parent rank p among its colour's members on its node
    int size;      // members of the colour per node
  };

  // The group of parent rank p, seen node by node. Members are in
  // parent-rank order, so the members on one consecutive parent node are
  // consecutive in the group too.
  template <class Entry>
  static node_shape shape_of(const std::vector<Entry>& all, int p) {
    const auto node_of = [&](int q) { return q - all[q].local_rank; };  // its node's first rank
    std::vector<int> per_node;  // members of p's colour on each node, in node order
    int last_node = -1, index = 0;
    for (int q = 0; q < static_cast<int>(all.size()); ++q) {
      if (all[q].colour != all[p].colour) continue;
      if (node_of(q) != last_node) {
        per_node.push_back(0);
        last_node = node_of(q);
      }
      if (q == p) index = per_node.back();
      ++per_node.back();
    }
    const bool regular =
        std::all_of(per_node.begin(), per_node.end(), [&](int n) { return n == per_node[0]; });
    return {regular, index, per_node[0]};
  }

  B* parent_;
  std::vector<int> members_;  // parent ranks, in group order
  int rank_ = 0;
  int local_rank_ = 0;
  int local_world_size_ = 1;
  std::string job_tag_;
};

}  // namespace epcomm
