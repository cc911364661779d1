// The bootstrap is how ranks find each other before any transport exists: an
// all-gather of small byte strings and a barrier, both bounded by a deadline.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
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

}  // namespace epcomm
