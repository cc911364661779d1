// The bootstrap is how ranks find each other before any transport exists: an
// all-gather of small byte strings and a barrier, both bounded by a deadline.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "epcomm/core/deadline.hpp"

namespace epcomm {

// all_gather(mine, dl) returns world_size() blocks of mine.size() bytes, block
// r from rank r; every rank passes the same size. barrier(dl) returns once all
// ranks have entered it. Both throw epcomm::error when dl expires or a peer is
// lost. local_rank()/local_world_size() describe the node this rank runs on.
template <class B>
concept bootstrap = requires(B& b, const B& cb, std::span<const std::byte> mine, deadline dl) {
  { cb.rank() } -> std::same_as<int>;
  { cb.world_size() } -> std::same_as<int>;
  { cb.local_rank() } -> std::same_as<int>;
  { cb.local_world_size() } -> std::same_as<int>;
  { b.all_gather(mine, dl) } -> std::same_as<std::vector<std::byte>>;
  { b.barrier(dl) } -> std::same_as<void>;
};

// job_tag(): a name every rank of one job shares and no other job on the host
// uses (launch_local's, a subgroup's), so that what the job creates on the host
// (shared-memory segments) cannot collide with another job's.
template <class B>
concept has_job_tag = requires(const B& b) {
  { b.job_tag() } -> std::convertible_to<std::string_view>;
};

}  // namespace epcomm
