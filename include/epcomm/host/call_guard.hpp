// What a buffer does when a call fails mid-protocol (a transport deadline, a
// lost peer, a protocol violation): peers are left mid-call, so the buffer
// refuses every later call rather than mix epochs, and gives up on the group
// so that peers waiting for this rank fail at once instead of at their
// deadlines. Shared by the host engines (normal/buffer.hpp, hierarchical/buffer.hpp,
// low_latency/buffer.hpp); `broken` is the buffer's record of the failure.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "epcomm/core/error.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm {

// Runs f. An epcomm::error from it is kept in `broken` and passed to
// give_up(culprit) with the peer it blames, then rethrown.
template <class F, class GiveUp>
void guard_call(std::optional<std::string>& broken, F&& f, GiveUp&& give_up) {
  try {
    std::forward<F>(f)();
  } catch (const error& e) {
    broken = e.what();
    give_up(e.peer());
    throw;
  }
}

// Throws for op `op` once a call has failed.
inline void check_not_broken(int rank, const char* op, const std::optional<std::string>& broken) {
  if (broken)
    throw error(rank, op, no_peer, "buffer unusable after an earlier failure: " + *broken);
}

// Gives up on the group through the transport's abort(), blaming `culprit`;
// a transport without abort() leaves its peers to their deadlines.
template <class Transport>
void try_abort(Transport& transport, int culprit = no_peer) {
  if constexpr (has_abort<Transport>) transport.abort(culprit);
}

}  // namespace epcomm
