// The peers an RMA transport has lost while masking lost peers
// (has_lost_peer_masking): which, and how each was lost. A transport marks a
// peer under its mutex, from its progress; waiters on other threads read the
// marks without it, so each cause is written before its flag and never again.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace epcomm::proxy {

class lost_peers {
 public:
  explicit lost_peers(int world)
      : lost_(std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(world))),
        causes_(static_cast<std::size_t>(world)) {}

  // Whether losses are masked (set once, before the first operation).
  bool masking() const { return masking_.load(std::memory_order_acquire); }
  void start_masking() { masking_.store(true, std::memory_order_release); }

  bool lost(int peer) const { return lost_[peer].load(std::memory_order_acquire); }

  // Marks `peer` lost; `cause` says how the fabric failed it, empty when its
  // process ended. False when it was marked before (the first cause stays).
  bool mark(int peer, std::string cause) {
    if (lost(peer)) return false;
    causes_[peer] = std::move(cause);
    lost_[peer].store(true, std::memory_order_release);
    return true;
  }

  // Why a wait for `peer`, which is gone, fails.
  std::string waiting_failed(int peer, const char* what) const {
    const std::string how = lost(peer) && !causes_[peer].empty()
                                ? "peer unreachable (" + causes_[peer] + ")"
                                : std::string("peer process exited");
    return how + " while waiting for " + what;
  }

 private:
  std::atomic<bool> masking_{false};
  std::unique_ptr<std::atomic<bool>[]> lost_;
  std::vector<std::string> causes_;
};

}  // namespace epcomm::proxy
