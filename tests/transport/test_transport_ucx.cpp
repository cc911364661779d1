// The UCX transport under the RMA contract suite and the normal-mode
// dispatch/combine suite. CTest runs this file once per transport selection,
// by UCX_TLS: shared memory (posix,sysv,cma,self) and tcp on loopback; the
// case below tests what is particular to UCX.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "epcomm/ucx/transport.hpp"
#include "support/dispatch_combine_suite.hpp"
#include "support/rma_transport_suite.hpp"

TYPE_TO_STRING(epcomm::ucx::transport);
EPCOMM_RMA_TRANSPORT_SUITE(epcomm::ucx::transport);
EPCOMM_DISPATCH_COMBINE_SUITE(epcomm::ucx::transport);

using namespace epcomm;

TEST_CASE("a survivor with requests queued for a dead peer closes without dying") {
  // Rank 1 stops serving, rank 0 queues more signals than UCX can hand
  // over (they wait in UCX's pending queue), then rank 1 exits. UCX 1.13
  // aborts a process that destroys its worker over such requests on shared
  // memory; over tcp the endpoint's forced close cancels them.
  INFO("transport:", test::provider_environment());
  const char* tls = std::getenv("UCX_TLS");
  const bool shared_memory =
      tls != nullptr && std::string_view(tls).find("tcp") == std::string_view::npos;
  const auto codes = launch_local(2, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    const deadline dl = deadline::after(std::chrono::seconds(30));
    const std::int64_t mine = getpid();
    const auto all = boot.all_gather(std::as_bytes(std::span(&mine, 1)), dl);
    std::int64_t peer_pid = 0;
    std::memcpy(&peer_pid, all.data() + (1 - rank) * sizeof peer_pid, sizeof peer_pid);
    const int before = ucx::transport::abandoned_workers();
    {
      ucx::transport t(boot, 4096, 1, dl);
      t.barrier(dl);
      if (rank == 1) {
        boot.barrier(dl);  // not progressing UCX while rank 0 queues
        _exit(0);
      }
      for (int i = 0; i < 20'000; ++i) t.signal_add(1, 0, 1);
      boot.barrier(dl);
      while (!(::kill(static_cast<pid_t>(peer_pid), 0) != 0 && errno == ESRCH)) {
        if (dl.expired()) return test::fail_rank(rank, "the peer never exited");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      try {
        t.wait(0, 1, dl, {"ucx test", 1, "a signal from the dead peer"});
        return test::fail_rank(rank, "a wait on the dead peer succeeded");
      } catch (const error& e) {
        if (e.peer() != 1) return test::fail_rank(rank, std::string("wrong peer: ") + e.what());
      }
    }  // the destructor: UCX 1.13 aborted here
    // Left behind where they could not be closed (shared memory), not where
    // they could.
    const int abandoned = ucx::transport::abandoned_workers() - before;
    if (abandoned != (shared_memory ? 1 : 0))
      return test::fail_rank(rank, std::to_string(abandoned) + " workers left behind");
    return 0;
  });
  CHECK(test::all_ok(codes, "closing with requests for a dead peer"));
}

TEST_CASE(
    "over tcp puts and signals go as the transport's own messages, over shared memory by RMA") {
  // UCX emulates RMA over tcp with requests the target answers, and an
  // answer to a peer that has just died aborts the target (messages.hpp).
  INFO("transport:", test::provider_environment());
  const char* tls = std::getenv("UCX_TLS");
  const bool tcp = tls != nullptr && std::string_view(tls) == "tcp";
  const auto codes = launch_local(3, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    const deadline dl = deadline::after(std::chrono::seconds(30));
    ucx::transport t(boot, 4096, 1, dl);
    for (int p = 0; p < 3; ++p)
      if (p != rank && t.sends_messages_to(p) != tcp)
        return test::fail_rank(rank, "peer " + std::to_string(p) + ": the wrong data path");
    try {
      (void)t.sends_messages_to(3);
      return test::fail_rank(rank, "a peer outside the group was accepted");
    } catch (const error& e) {
      if (std::string_view(e.what()).find("outside [0, 3)") == std::string_view::npos)
        return test::fail_rank(rank, e.what());
    }
    t.barrier(dl);
    return 0;
  });
  CHECK(test::all_ok(codes, "data path per transport"));
}

TEST_CASE("a peer that exits silently fails a wait on another peer at once, naming it") {
  // Over shared memory a peer killed while writing into a survivor's
  // receive queue holds up everything behind it, another survivor's abort
  // included; here no survivor aborts at all. Rank 1 exits without a
  // goodbye while ranks 0 and 2 wait for each other: each must name rank 1
  // well before the deadline, not blame the other (over shared memory
  // nothing but its exit tells them).
  INFO("transport:", test::provider_environment());
  const auto codes = launch_local(3, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    const deadline dl = deadline::after(std::chrono::seconds(20));
    ucx::transport t(boot, 4096, 1, dl);
    t.barrier(dl);
    boot.barrier(dl);  // every rank is out of the transport's barrier
    if (rank == 1) _exit(0);
    const int other = 2 - rank;
    const auto start = steady::now();
    try {
      t.wait(0, 1, dl, {"ucx test", other, "a signal no rank sends"});
      return test::fail_rank(rank, "a wait for a signal nobody sent succeeded");
    } catch (const error& e) {
      // Seen directly, or in the other survivor's abort; over tcp maybe
      // as UCX's endpoint error first.
      if (e.peer() != 1) return test::fail_rank(rank, std::string("wrong error: ") + e.what());
    }
    if (steady::now() - start > std::chrono::seconds(5))
      return test::fail_rank(rank, "the exit was noticed only after 5 s");
    return 0;
  });
  CHECK(test::all_ok(codes, "a silent exit while waiting on another peer"));
}
