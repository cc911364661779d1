// The errors both modes' device reports (normal/report.hpp,
// low_latency/report.hpp) end in, worded once: what a kernel can learn from
// the proxy, its peers' abort words and the host's exit watch
// (cuda/exit_watch.hpp), and a failure code the host does not know (a kernel
// and host built from different versions).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "epcomm/core/error.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/transport/peer_abort.hpp"

namespace epcomm::proxy {

// A kernel of `rank` saw `reporter`'s abort word naming `culprit` while it
// waited for `waited_for`.
inline error device_saw_abort(int rank, const std::string& op, int reporter, int culprit,
                              std::string_view waited_for) {
  const blame b = peer_aborted(reporter, culprit, rank, waited_for);
  return error(rank, op, b.peer, b.cause);
}

// A kernel of `rank` waited for `waited_for` from `peer`, whose process
// exited: the host transports' words for the same.
inline error device_saw_exit(int rank, const std::string& op, int peer,
                             std::string_view waited_for) {
  return error(rank, op, peer, "peer process exited while waiting for " + std::string(waited_for));
}

// The proxy serving a kernel's channel stopped with `status`.
inline error device_channel_failed(int rank, const std::string& op, std::int64_t status) {
  return error(rank, op, no_peer, channel_failure(static_cast<channel_status>(status)));
}

inline error unknown_device_failure(int rank, const std::string& op, int peer, std::int32_t code) {
  return error(rank, op, peer,
               "internal: the device reported failure code " + std::to_string(code));
}

}  // namespace epcomm::proxy
