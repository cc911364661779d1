// What a buffer does when a call fails mid-protocol (a transport deadline, a
// lost peer, a protocol violation): peers are left mid-call, so the buffer
// refuses every later call rather than mix epochs, and gives up on the group
// so that peers waiting for this rank fail at once instead of at their
// deadlines. A call every rank agreed to reject (bad input anywhere) is no
// failure: it ends in step on every rank and leaves the buffer usable. Shared
// by the host engines (normal/buffer.hpp, hierarchical/buffer.hpp,
// low_latency/buffer.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"

namespace epcomm {

// What a call runs under: its epoch (the count of its kind's calls, this one
// included), which every signal of the call reaches, and its deadline.
struct call_start {
  std::uint64_t epoch;
  deadline dl;
};

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

  // A call of kind `op` begins: check(), then the next of `epochs` and a
  // deadline `timeout` from now.
  call_start start(int rank, const char* op, bool aborted, std::uint64_t& epochs,
                   std::chrono::milliseconds timeout) const {
    check(rank, op, aborted);
    return {++epochs, deadline::after(timeout)};
  }

  // Runs check(), the verdict that every rank reaches alike. When it rejects
  // the call (throws epcomm::error), the rank still runs final_round(), the
  // call's last counted round with no payload, as run() runs a call, then
  // rethrows the verdict: a rank that raced into its next call would
  // otherwise overwrite slots that slower peers have not read yet.
  template <class Check, class FinalRound, class GiveUp>
  void settle(Check&& check, FinalRound&& final_round, GiveUp&& give_up) {
    try {
      std::forward<Check>(check)();
    } catch (const error&) {
      run(std::forward<FinalRound>(final_round), std::forward<GiveUp>(give_up));
      throw;
    }
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
