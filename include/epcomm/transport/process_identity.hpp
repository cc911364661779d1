// Which process a rank is, in a form peers can check: a network transport
// cannot tell a peer that is slow from one that is gone, but a peer on the
// same kernel and in the same pid namespace can be asked with kill(pid, 0),
// so that survivors fail at once instead of at their deadline.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

namespace epcomm::proxy {

struct process_identity {
  char host[96];  // kernel boot id and pid namespace; equal means pids compare
  std::int64_t pid;
};

inline process_identity this_process() {
  process_identity id{};
  std::string host;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> host;
  char ns[64] = {};
  if (readlink("/proc/self/ns/pid", ns, sizeof ns - 1) > 0) host += std::string("/") + ns;
  std::strncpy(id.host, host.c_str(), sizeof id.host - 1);
  id.pid = getpid();
  return id;
}

// True when `a` and `b` run on one kernel in one pid namespace.
inline bool same_host(const process_identity& a, const process_identity& b) {
  return a.host[0] != '\0' && std::strncmp(a.host, b.host, sizeof a.host) == 0;
}

// True when `peer` is known to have exited: it ran beside this process and
// its pid no longer exists. False when unknown (another host) or alive.
inline bool exited(const process_identity& peer, const process_identity& self) {
  return same_host(peer, self) && kill(static_cast<pid_t>(peer.pid), 0) != 0 && errno == ESRCH;
}

}  // namespace epcomm::proxy
