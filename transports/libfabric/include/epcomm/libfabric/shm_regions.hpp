// The files libfabric's shm provider keeps in /dev/shm, one per endpoint
// (its queues, 16 MiB), unlinked when the endpoint closes. A process that
// dies first (an exit without teardown, SIGKILL, a Spot reclaim) leaves its
// file behind, and under the provider's default name "<pid>:<n>:<m>" nothing
// says whose it was or whether its owner lives. So epcomm names each
// endpoint's file (fi_setname, before fi_enable)
//
//     epcomm-lf-<pid namespace>-<pid>.<n>
//
// and, each time a transport over the shm provider starts or closes, unlinks
// the files so named whose process has exited: a survivor clears a dead
// peer's at teardown, the next start on the host those of a job that died
// whole. Files of live processes, of other pid namespaces (whose pids mean
// nothing here) and of other software are never touched. Peers that still
// map an unlinked file keep their mapping.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace epcomm::libfabric::shm_regions {

inline constexpr std::string_view prefix = "epcomm-lf-";

// The inode number of this process's pid namespace ("4026531836"): pids
// compare only within it. "0" where /proc does not say.
inline std::string pid_namespace() {
  char link[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);
  const std::string_view s(link, n > 0 ? static_cast<std::size_t>(n) : 0);  // "pid:[4026531836]"
  const auto open = s.find('['), close = s.find(']');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return "0";
  return std::string(s.substr(open + 1, close - open - 1));
}

// The shm address (and so the file name) of this process's next endpoint.
inline std::string next_address() {
  static std::atomic<unsigned> endpoints{0};
  return "fi_shm://" + std::string(prefix) + pid_namespace() + "-" + std::to_string(::getpid()) +
         "." + std::to_string(endpoints++);
}

// Unlinks the file of this process's endpoint at `address` (next_address),
// for a transport that leaves its endpoints open at teardown: it has none to
// close, peers that map the file keep their mapping.
inline void remove_own(std::string_view address) {
  constexpr std::string_view scheme = "fi_shm://";
  if (address.starts_with(scheme)) address.remove_prefix(scheme.size());
  std::string path = "/";  // appended, not "/" + ...: GCC 12 -O3 flags a false -Wrestrict there
  path += address;
  ::shm_unlink(path.c_str());
}

// The pid that created the file `name`, when `name` is one of ours from the
// pid namespace `ns`.
inline std::optional<pid_t> owner(std::string_view name, std::string_view ns) {
  if (!name.starts_with(prefix)) return std::nullopt;
  name.remove_prefix(prefix.size());
  if (!name.starts_with(ns) || name.size() <= ns.size() || name[ns.size()] != '-')
    return std::nullopt;
  name.remove_prefix(ns.size() + 1);
  pid_t pid = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), pid);
  if (ec != std::errc{} || pid <= 0 || end == name.data() + name.size() || *end != '.')
    return std::nullopt;
  return pid;
}

// Unlinks the files of this pid namespace whose creator has exited; returns
// how many. A zombie counts as alive until its parent reaps it.
inline int remove_orphans() {
  const std::string ns = pid_namespace();
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    const auto pid = owner(name, ns);
    if (pid && ::kill(*pid, 0) != 0 && errno == ESRCH && ::shm_unlink(("/" + name).c_str()) == 0)
      ++removed;
  }
  return removed;
}

}  // namespace epcomm::libfabric::shm_regions
