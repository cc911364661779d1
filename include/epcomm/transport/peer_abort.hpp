// How a rank that gives up on its group tells its peers, and what they report
// then. An abort carries the rank whose failure caused it, so that every
// waiter names the root cause rather than the messenger. Every transport
// (shm, libfabric, UCX) and the kernels' abort relay (cuda/device_sync.cuh)
// write the same word and word the same error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "epcomm/core/config.hpp"
#include "epcomm/core/error.hpp"

namespace epcomm {

// A rank's abort word, as its peers read it: 0 while the rank goes on;
// left_cleanly_word once it closed after its work (a UCX goodbye, which is
// not an abort); encode_abort(c) once it gave up blaming rank c, or no rank
// (no_peer). Written once per rank, so a plain store or an add onto 0 both
// deliver it.
inline constexpr std::uint64_t left_cleanly_word = 1;

EPCOMM_HD constexpr std::uint64_t encode_abort(int culprit) {
  return culprit >= 0 ? 3 + static_cast<std::uint64_t>(culprit) : 2;
}
EPCOMM_HD constexpr bool is_abort(std::uint64_t word) { return word >= 2; }
// The rank an abort word blames: no_peer for none, or for a word naming a rank
// outside [0, world).
EPCOMM_HD constexpr int decode_abort(std::uint64_t word, int world) {
  return word >= 3 && word - 3 < static_cast<std::uint64_t>(world) ? static_cast<int>(word - 3)
                                                                   : no_peer;
}

}  // namespace epcomm

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
