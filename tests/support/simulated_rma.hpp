// Every rank's symmetric buffer and signal counters in one process, and a
// channel through which rank `self` pushes as a kernel does over an RMA
// transport, each descriptor applied at once, as the proxy and the fabric
// would deliver it: put copies from self's buffer into the peer's,
// put_signal copies then adds to the peer's counter, signal adds. The host
// tests of the kernels' push loops (cuda/*_route.hpp) replay them against it
// and compare every rank's bytes with buffers built from the wire layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "epcomm/proxy/channel.hpp"

namespace epcomm::test {

struct simulated_rma {
  using bytes = std::vector<std::byte>;

  int self;
  std::vector<bytes> buf;
  std::vector<std::vector<std::uint64_t>> counters;
  int pushes = 0;
  int fail_at = 0;  // the push (1-based) that reports fail_with instead
  proxy::channel_status fail_with = proxy::channel_status::ring_full;
  // Called at every signal, once its put (if any) landed and before the add:
  // returns what is wrong at that moment, or nothing.
  std::function<std::string(int peer, std::size_t slot, std::uint64_t add)> on_signal;
  std::vector<std::string> errors;

  simulated_rma(int world, int rank, std::size_t buffer_bytes, std::size_t slots)
      : self(rank),
        buf(static_cast<std::size_t>(world), bytes(buffer_bytes)),
        counters(static_cast<std::size_t>(world), std::vector<std::uint64_t>(slots)) {}
  // on_signal may hold a pointer to the model that owns it.
  simulated_rma(const simulated_rma&) = delete;
  simulated_rma& operator=(const simulated_rma&) = delete;

  struct channel {
    simulated_rma* m;
    proxy::channel_status put(int peer, std::uint64_t local, std::uint64_t remote,
                              std::uint64_t n) const {
      return m->apply(peer, local, remote, n, nullptr, 0);
    }
    proxy::channel_status put_signal(int peer, std::uint64_t local, std::uint64_t remote,
                                     std::uint64_t n, std::uint64_t slot, std::uint64_t add) const {
      return m->apply(peer, local, remote, n, &slot, add);
    }
    proxy::channel_status signal(int peer, std::uint64_t slot, std::uint64_t add) const {
      return m->apply(peer, 0, 0, 0, &slot, add);
    }
  };
  channel ch() { return {this}; }

 private:
  proxy::channel_status apply(int peer, std::size_t local, std::size_t remote, std::size_t n,
                              const std::uint64_t* slot, std::uint64_t add) {
    if (++pushes == fail_at) return fail_with;
    const std::size_t total = buf[0].size();
    if (peer < 0 || peer >= static_cast<int>(buf.size()) || local + n > total ||
        remote + n > total || (slot != nullptr && *slot >= counters[0].size())) {
      errors.push_back("descriptor out of range");
      return proxy::channel_status::ok;
    }
    std::memcpy(buf[peer].data() + remote, buf[self].data() + local, n);
    if (slot != nullptr) {
      if (on_signal)
        if (std::string e = on_signal(peer, *slot, add); !e.empty()) errors.push_back(e);
      counters[peer][*slot] += add;
    }
    return proxy::channel_status::ok;
  }
};

}  // namespace epcomm::test
