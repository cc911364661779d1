// What a rank reports when a peer aborted the group while it waited. An
// abort carries the rank whose failure caused it, so that every waiter names
// the root cause rather than the messenger; the RMA transports word it as the
// shm transport does.
#pragma once

#include <string>
#include <string_view>

#include "epcomm/core/error.hpp"

namespace epcomm::proxy {

struct blame {
  int peer;  // the rank the error names
  std::string cause;
};

// Peer `reporter` aborted because of `culprit` (no_peer: its own decision)
// while rank `self` waited for `what`.
inline blame peer_aborted(int reporter, int culprit, int self, std::string_view what) {
  const bool relayed = culprit >= 0 && culprit != reporter && culprit != self;
  std::string cause = relayed ? "rank " + std::to_string(culprit) + " failed (reported by rank " +
                                    std::to_string(reporter) + ", which aborted)"
                              : std::string("peer aborted");
  if (culprit == self) cause += ", blaming this rank,";
  return {relayed ? culprit : reporter, cause + " while this rank waited for " + std::string(what)};
}

}  // namespace epcomm::proxy
