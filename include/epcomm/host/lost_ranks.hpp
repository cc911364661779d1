// Masking lost ranks (low_latency_config::mask_lost_ranks): a peer whose
// process exited is marked lost and every call goes on without it, instead
// of failing the group. Only an exited process is certain never to write
// again, so only a transport that can tell a peer's exit from its slowness
// (peer_exited) and that stores every byte itself (no proxy holding puts to
// the lost peer) can offer it; a slow peer still fails at its deadline.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm {

// Waits until this rank's counter `slot` reaches `expected`, which site.peer
// brings about. Returns false instead for a lost peer: one marked before, or
// (when `masking`) one whose wait failed because its process is gone, which
// is marked here. Any other failure throws.
template <class Transport>
bool wait_or_mark_lost(Transport& transport, bool masking, std::vector<bool>& lost,
                       std::size_t slot, std::uint64_t expected, const deadline& dl,
                       const wait_site& site) {
  const int r = site.peer;
  if (lost[r]) return false;
  try {
    transport.wait(slot, expected, dl, site);
    return true;
  } catch (const error& e) {
    if constexpr (has_peer_exit<Transport>)
      if (masking && e.peer() == r && transport.peer_exited(r)) {
        lost[r] = true;
        return false;
      }
    throw;
  }
}

// The ranks marked lost, ascending.
inline std::vector<int> lost_rank_list(const std::vector<bool>& lost) {
  std::vector<int> ranks;
  for (std::size_t r = 0; r < lost.size(); ++r)
    if (lost[r]) ranks.push_back(static_cast<int>(r));
  return ranks;
}

}  // namespace epcomm
