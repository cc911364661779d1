// The call bookkeeping both low-latency engines keep (the host engine,
// low_latency/buffer.hpp, and the device one, cuda/device_buffer.hpp): calls
// alternate between two parities; on each, a send phase numbers a call and
// leaves it pending, and its receive hook ends it. A parity takes no new call
// while one is pending, a combine answers its parity's last dispatch once,
// and a receive hook runs once. Each refusal is worded here.
#pragma once

#include <cstdint>
#include <string>

#include "epcomm/core/error.hpp"

namespace epcomm {

inline constexpr const char* ll_dispatch_op = "low-latency dispatch";
inline constexpr const char* ll_combine_op = "low-latency combine";

struct ll_parity_calls {
  std::uint64_t dispatches = 0;   // dispatches issued on this parity
  std::uint64_t combines = 0;     // combines issued on this parity
  std::uint64_t combined = 0;     // the dispatch number the last combine answered
  bool dispatch_pending = false;  // sent, receive phase not yet run
  bool combine_pending = false;
  bool dispatch_accepted = false;  // this rank's own input was accepted
  int num_tokens = 0;              // of the last dispatch; 0 when rejected
  int topk = 0;

  // Numbers a dispatch on parity `p`.
  std::uint64_t open_dispatch(int rank, int p) {
    check_idle(rank, ll_dispatch_op, p, " (at most two calls in flight)");
    return ++dispatches;
  }

  // The dispatch's send phase has gone out: its receive phase is due. A
  // rejected call moves nothing and keeps no sizes.
  void dispatch_sent(bool accepted, int tokens, int k) {
    dispatch_pending = true;
    dispatch_accepted = accepted;
    num_tokens = accepted ? tokens : 0;
    topk = accepted ? k : 0;
  }

  // Numbers a combine of parity `p`'s last dispatch.
  std::uint64_t open_combine(int rank, int p) {
    check_idle(rank, ll_combine_op, p, "");
    if (dispatches <= combined)
      throw error(rank, ll_combine_op, no_peer,
                  "no dispatch received on parity " + std::to_string(p) +
                      " since its last combine (one combine per dispatch)");
    // Even a rejected combine uses this parity's combine region, so the
    // dispatch cannot be combined again either way.
    combined = dispatches;
    return ++combines;
  }

  // Throws unless dispatch (combine) `number` is the one awaiting its
  // receive phase: each hook runs once.
  void expect_dispatch_pending(int rank, std::uint64_t number) const {
    if (!dispatch_pending || dispatches != number)
      throw error(rank, ll_dispatch_op, no_peer, "this dispatch's receive hook already ran");
  }
  void expect_combine_pending(int rank, std::uint64_t number) const {
    if (!combine_pending || combines != number)
      throw error(rank, ll_combine_op, no_peer, "this combine's receive hook already ran");
  }

 private:
  // A parity takes a new call only once the receive phases of its previous
  // calls ran.
  void check_idle(int rank, const char* op, int p, const char* note) const {
    if (dispatch_pending || combine_pending)
      throw error(rank, op, no_peer,
                  "parity " + std::to_string(p) + " still has a " +
                      (dispatch_pending ? "dispatch" : "combine") +
                      " whose receive phase has not run" + note);
  }
};

}  // namespace epcomm
