// The absent-peer checks of both modes: the last rank never calls, rank 0's
// deadline is short and every other rank's long. Rank 0 must fail at its
// deadline naming the absent rank; the others must then fail through rank 0's
// abort relay, naming the same culprit, long before their own deadlines.
// (EPCOMM_TIMEOUT_MS overrides every deadline with one value: then the others
// may time out themselves, and either error is right.)
#pragma once

#include <chrono>
#include <string>

#include "epcomm/core/deadline.hpp"

namespace epcomm::gpu_check {

struct absent_peer_plan {
  int rank;
  int absent;

  static constexpr std::chrono::milliseconds short_deadline{1500};
  static constexpr std::chrono::milliseconds long_deadline{60'000};

  std::chrono::milliseconds timeout() const { return rank == 0 ? short_deadline : long_deadline; }

  // Empty when the error this rank got (`what`, naming `peer`, after `took`)
  // is the one it must get; `deadline_text` is the mode's wait site.
  std::string verdict(const std::string& what, int peer, std::chrono::nanoseconds took,
                      const std::string& deadline_text) const {
    const bool relay_expected = rank != 0 && effective_timeout(timeout()) == timeout();
    const bool timed_out =
        what.find("deadline expired waiting for " + deadline_text) != std::string::npos;
    const bool relayed = what.find("rank " + std::to_string(absent) +
                                   " failed (reported by rank 0, which aborted) while this rank "
                                   "waited for") != std::string::npos;
    if (peer != absent || !(relay_expected ? relayed : timed_out || relayed))
      return "unexpected error: '" + what + "'";
    if (took > 4 * effective_timeout(short_deadline) + std::chrono::seconds(2))
      return "the error took " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
             " ms";
    return {};
  }
};

}  // namespace epcomm::gpu_check
