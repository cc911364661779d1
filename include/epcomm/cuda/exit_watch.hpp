// How kernels learn that a peer's process is gone, so that a wait for it
// fails at once instead of at its deadline (normal/cuda/sync.cuh,
// low_latency/cuda/lost_peers.cuh) or, with low_latency_config::
// mask_lost_ranks, goes on without it: a kernel cannot ask, so a host thread
// asks the transport (peer_exited) about every peer once a millisecond and
// sets that peer's word in pinned host memory, which kernels read while they
// wait. A word, once set, stays set: an exited process never writes again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stop_token>
#include <thread>
#include <vector>

#include "epcomm/transport/concepts.hpp"

namespace epcomm::cuda {

// Over an RMA transport what a peer put before it exited may still be on its
// way through the fabric and this rank's proxy: its word is set only once it
// has been gone this long (the libfabric transport waits as long before it
// fails operations to an exited peer). Peer stores need none.
inline constexpr std::chrono::milliseconds exit_grace_over_rma{250};

class exit_watch {
 public:
  exit_watch() = default;

  // Watches every peer of `transport` but `rank`, setting words[peer] (world
  // of them, zeroed, readable by kernels) once it has been gone for `grace`;
  // stops at destruction. peer_exited must be safe beside the transport's
  // other users.
  template <class Transport>
  requires has_peer_exit<Transport>
  void start(const Transport& transport, std::uint64_t* words, int world, int rank,
             std::chrono::milliseconds grace) {
    thread_ = std::jthread([&transport, words, world, rank, grace](std::stop_token stop) {
      using clock = std::chrono::steady_clock;
      std::vector<clock::time_point> gone_since(world, clock::time_point::max());
      while (!stop.stop_requested()) {
        const clock::time_point now = clock::now();
        for (int r = 0; r < world; ++r) {
          if (r == rank || std::atomic_ref(words[r]).load(std::memory_order_relaxed) != 0) continue;
          if (gone_since[r] == clock::time_point::max() && transport.peer_exited(r))
            gone_since[r] = now;
          if (gone_since[r] != clock::time_point::max() && now - gone_since[r] >= grace)
            std::atomic_ref(words[r]).store(1, std::memory_order_release);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }

 private:
  std::jthread thread_;
};

}  // namespace epcomm::cuda
