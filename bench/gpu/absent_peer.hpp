// The absent-peer checks of both modes. The last rank is absent in one of two
// ways:
//   silent  it never calls; rank 0's deadline is short and every other
//           rank's long. Rank 0 must fail at its deadline naming the absent
//           rank; the others must then fail through rank 0's abort relay,
//           naming the same culprit, long before their own deadlines.
//           (EPCOMM_TIMEOUT_MS overrides every deadline with one value: then
//           the others may time out themselves, and either error is right.)
//   exited  its process exits once every rank has its buffer; every deadline
//           is long. Each other rank must fail as soon as its exit watch
//           sees the exit (cuda/exit_watch.hpp), naming it: "peer process
//           exited", or the relay of a rank that saw it first.
#pragma once

#include <chrono>
#include <string>

#include "epcomm/core/deadline.hpp"

namespace epcomm::gpu_check {

enum class absence { silent, exited };

struct absent_peer_plan {
  int rank;
  int absent;
  absence how = absence::silent;

  static constexpr std::chrono::milliseconds short_deadline{1500};
  static constexpr std::chrono::milliseconds long_deadline{60'000};

  std::chrono::milliseconds timeout() const {
    return how == absence::silent && rank == 0 ? short_deadline : long_deadline;
  }

  // Empty when the error this rank got (`what`, naming `peer`, after `took`)
  // is the one it must get; `wait_text` is the mode's wait site.
  std::string verdict(const std::string& what, int peer, std::chrono::nanoseconds took,
                      const std::string& wait_text) const {
    const bool relayed =
        what.find(" failed (reported by rank ") != std::string::npos &&
        what.find("rank " + std::to_string(absent) + " failed") != std::string::npos;
    bool expected = false;
    if (how == absence::exited) {
      expected = relayed || what.find("peer process exited while waiting for " + wait_text) !=
                                std::string::npos;
    } else {
      const bool relay_expected = rank != 0 && effective_timeout(timeout()) == timeout();
      const bool timed_out =
          what.find("deadline expired waiting for " + wait_text) != std::string::npos;
      const bool relayed_by_0 =
          relayed && what.find("(reported by rank 0, which aborted) while this rank waited for") !=
                         std::string::npos;
      expected = relay_expected ? relayed_by_0 : timed_out || relayed_by_0;
    }
    if (peer != absent || !expected) return "unexpected error: '" + what + "'";
    if (took > 4 * effective_timeout(short_deadline) + std::chrono::seconds(2))
      return "the error took " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
             " ms";
    return {};
  }
};

}  // namespace epcomm::gpu_check
