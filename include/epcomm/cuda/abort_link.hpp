// The abort relay of the device kernels: a rank whose call breaks (a
// deadline, a protocol violation, a relayed abort) tells every peer at once,
// so that their waits end now, naming the root cause, instead of at their own
// deadlines, as the host transports' abort() does. Each rank's signal array
// ends with one word per rank, after the counters its wire format uses: word
// s is set, once, by rank s, to 1 + the rank it blamed. Plain data, so that
// it travels in kernel arguments and compiles without CUDA; the device side
// is relay_abort / find_peer_abort in device_sync.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/config.hpp"
#include "epcomm/cuda/peer_table.hpp"

namespace epcomm::cuda {

struct abort_link {
  std::uint64_t* const* signals;  // every rank's signal array, as mapped here
  std::size_t first;              // slot of word 0
  int rank;
  int world;
};

// `first`: the signal slots the wire format uses, after which the words start.
EPCOMM_HD inline abort_link make_abort_link(const peer_table& peers, std::size_t first) {
  return {peers.signals, first, peers.rank, peers.world_size};
}

// Signal slots a device buffer asks its transport for: its wire format's,
// then one abort word per rank.
EPCOMM_HD constexpr std::size_t with_abort_words(std::size_t wire_slots, int world) {
  return wire_slots + static_cast<std::size_t>(world);
}

}  // namespace epcomm::cuda
