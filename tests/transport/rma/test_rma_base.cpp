// What the RMA transports share (transport/rma/base.hpp) when their provider
// is held up for good: the barrier gives up at its deadline, naming a peer
// whose process exited when one has, as the transports' own waits do.
#include "epcomm/transport/rma/base.hpp"

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;
using epcomm::deadline;
using epcomm::error;

// Rank 0 of `world`, with the barrier's hooks; none of them is reached while
// the provider lock is held.
class held_transport : public epcomm::proxy::rma_transport_base {
 public:
  explicit held_transport(int world)
      : rma_transport_base(0, world, 64, static_cast<std::size_t>(world), 1'000ms, "test/held") {
    for (auto& p : processes_) p = self_;
  }

  void barrier(deadline dl) { run_barrier(*this, dl); }
  // The provider lock, as a thread stuck inside the provider holds it.
  std::unique_lock<std::mutex> hold() { return std::unique_lock(mu_); }
  // Rank `peer` ran as process `pid` on this host.
  void ran_as(int peer, pid_t pid) { processes_[static_cast<std::size_t>(peer)].pid = pid; }

  void add_local(std::size_t, std::uint64_t) {}
  void post_barrier_arrival(int, std::size_t) {}
  void wait(std::size_t, std::uint64_t, deadline, epcomm::wait_site) {}
};

// A pid that existed and is gone: a child that exited and was reaped.
pid_t gone_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return child;
}

// What a barrier throws while another thread holds the provider lock.
std::string barrier_error(held_transport& t) {
  std::atomic<bool> held{false};
  std::atomic<bool> release{false};
  std::thread stuck([&] {
    const auto lock = t.hold();
    held = true;
    while (!release) std::this_thread::sleep_for(1ms);
  });
  while (!held) std::this_thread::yield();
  std::string what = "(returned)";
  try {
    t.barrier(deadline::after(50ms));
  } catch (const error& e) {
    what = e.what();
  }
  release = true;
  stuck.join();
  return what;
}

}  // namespace

TEST_CASE("a barrier held up by the provider names nobody while every peer lives") {
  held_transport t(3);
  const std::string what = barrier_error(t);
  CHECK(what.find("deadline expired while the fabric provider was held up") != std::string::npos);
  CHECK(what.find("peer process exited") == std::string::npos);
  CHECK(what.find("(peer") == std::string::npos);
}

TEST_CASE("a barrier held up by the provider names the lowest peer that exited") {
  held_transport t(4);
  t.ran_as(2, gone_pid());
  t.ran_as(3, gone_pid());
  CHECK(t.first_exited_peer() == 2);
  const std::string what = barrier_error(t);
  CHECK(what.find("peer process exited; deadline expired while the fabric provider was held up") !=
        std::string::npos);
  CHECK(what.find("(peer 2)") != std::string::npos);
}
