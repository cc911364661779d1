// The abort relay of the device kernels: a rank whose call breaks (a
// deadline, a protocol violation, a relayed abort) tells every peer at once,
// so that their waits end now, naming the root cause, instead of at their own
// deadlines, as the host transports' abort() does. Each rank's signal array
// ends with one word per rank, after the counters its wire format uses: word
// s is set, once, by rank s, to the abort word naming the rank it blamed
// (encode_abort, transport/peer_abort.hpp): stored with a
// release add where peers are mapped, or, over an RMA transport (whose
// counters live in host memory), added by the proxy through a channel kept
// for this one use, so that its single producer is whoever sets the word.
// Plain data, so that it travels in kernel arguments and compiles without
// CUDA; the device side is relay_abort / find_peer_abort in device_sync.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/transport/peer_table.hpp"

namespace epcomm::cuda {

struct abort_link {
  std::uint64_t* const* signals;  // every rank's signal array, as mapped here
  std::size_t first;              // slot of word 0
  int rank;
  int world;
  int via_proxy;         // 0: peers' words are stored through `signals`
  proxy::channel relay;  // via_proxy: the channel that adds to peers' words
};

// `first`: the signal slots the wire format uses, after which the words start.
EPCOMM_HD inline abort_link make_abort_link(const peer_table& peers, std::size_t first) {
  return {peers.signals, first, peers.rank, peers.world_size, 0, {}};
}

// Over an RMA transport: `peers` maps only this rank's counters.
EPCOMM_HD inline abort_link make_abort_link(const peer_table& peers, std::size_t first,
                                            const proxy::channel& relay) {
  return {peers.signals, first, peers.rank, peers.world_size, 1, relay};
}

// Signal slots a device buffer asks its transport for: its wire format's,
// then one abort word per rank.
EPCOMM_HD constexpr std::size_t with_abort_words(std::size_t wire_slots, int world) {
  return wire_slots + static_cast<std::size_t>(world);
}

}  // namespace epcomm::cuda
