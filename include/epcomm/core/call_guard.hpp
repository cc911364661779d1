// What a buffer does when a call fails mid-protocol (a transport deadline, a
// lost peer, a protocol violation): peers are left mid-call, so the buffer
// refuses every later call rather than mix epochs, and gives up on the group
// so that peers waiting for this rank fail at once instead of at their
// deadlines. Shared by the host engines (normal/buffer.hpp, hierarchical/buffer.hpp,
// low_latency/buffer.hpp).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "epcomm/core/error.hpp"

namespace epcomm {

// The record of a buffer's failure, and the one place its calls check it.
class call_guard {
 public:
  bool broken() const { return broken_.has_value(); }

  // Throws for `op` once a call has failed, or when the group was aborted
  // (`aborted`: by this rank's abort() or by a peer).
  void check(int rank, const char* op, bool aborted) const {
    if (broken_)
      throw error(rank, op, no_peer, "buffer unusable after an earlier failure: " + *broken_);
    if (aborted) throw error(rank, op, no_peer, "buffer unusable: the group was aborted");
  }

  // Runs f. An epcomm::error from it is kept, passed to give_up(culprit)
  // with the peer it blames, then rethrown.
  template <class F, class GiveUp>
  void run(F&& f, GiveUp&& give_up) {
    try {
      std::forward<F>(f)();
    } catch (const error& e) {
      mark_broken(e);
      std::forward<GiveUp>(give_up)(e.peer());
      throw;
    }
  }

  // Keeps `e` as the failure that broke the buffer, for a caller that
  // throws it itself.
  void mark_broken(const error& e) { broken_ = e.what(); }

 private:
  std::optional<std::string> broken_;
};

}  // namespace epcomm
