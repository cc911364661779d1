// One cell of the fault matrix, for any transport, without a test framework
// (the doctest matrix, tests/support/fault_matrix.hpp, and the stress target,
// bench/fault_stress.cpp, both run it): `world` forked ranks make two call
// pairs; in the second one rank (the victim) exits, stalls or drops its
// transport at a protocol point; each rank writes what it saw into memory
// shared with the launcher; the survivors then re-form a group without the
// victim, check its results and that nothing of the launch is left in
// /dev/shm.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "epcomm/host/fault_injection.hpp"
#include "epcomm/low_latency/buffer.hpp"
#include "epcomm/normal/capacity_agreement.hpp"
#include "epcomm/normal/window.hpp"
#include "support/run_case.hpp"

namespace epcomm::test::faults {

inline constexpr int victim = 1;
inline constexpr int max_world = 8;

// The matrix's axes, whole.
inline const std::vector<fault::action> every_action{fault::action::exit, fault::action::stall,
                                                     fault::action::drop};
inline const std::vector<fault::point> every_point{
    fault::point::before_notify, fault::point::mid_dispatch, fault::point::mid_combine,
    fault::point::low_latency};

struct timing {
  std::chrono::milliseconds deadline{1'000};  // of every call's waits in the group the fault hits
  std::chrono::milliseconds stall{3'000};     // how long a stalled victim sleeps
  std::chrono::milliseconds slack{2'500};     // allowed past the deadline
};

// Setting the group up is bounded separately (setup_timeout) and generously:
// starting a fabric library and connecting takes seconds under
// ThreadSanitizer, and the fault fires only in the second call.
inline constexpr std::chrono::milliseconds setup_timeout{60'000};

// What one rank saw, written into memory it shares with the launching process.
struct report {
  std::int64_t setup_us;     // the buffer's construction
  std::int64_t took_us;      // from the start of the faulty call to its error; -1: no error
  std::int64_t teardown_us;  // from that error until the buffer was gone
  std::int32_t peer;         // the peer that error named
  char transport[64];        // the transport's own name ("libfabric/tcp;ofi_rxm")
  char what[440];            // the error's text
};

// Exit codes that tell the launching process how a rank ended.
inline constexpr int ok = 0, no_error = 10, wrong_result = 11, regroup_failed = 12, leaked = 13;

// Reports of every rank (up to max_world), in anonymous shared memory the
// forked ranks inherit.
class shared_reports {
 public:
  shared_reports() {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("shared_reports: mmap failed");
    at_ = static_cast<report*>(p);
    clear();
  }
  shared_reports(const shared_reports&) = delete;
  shared_reports& operator=(const shared_reports&) = delete;
  ~shared_reports() { munmap(at_, bytes); }
  report& operator[](int rank) { return at_[rank]; }
  void clear() {
    for (int r = 0; r < max_world; ++r) at_[r] = report{0, -1, 0, no_peer, {}, {}};
  }

 private:
  static constexpr std::size_t bytes = sizeof(report) * max_world;
  report* at_;
};

// One normal-mode call pair, checked against the reference.
template <class Buffer>
std::string normal_round(Buffer& buf, const shape& s, int rank) {
  std::vector<rank_input<bf16>> all;
  for (int r = 0; r < s.world; ++r) all.push_back(make_input<bf16>(s, r));
  const auto& mine = all[rank];
  const auto res =
      buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
  if (auto e = check_dispatch(s, rank, all, res); !e.empty()) return e;
  const auto y = expert_rows(res, s.hidden, rank);
  return check_combine(s, mine, buf.combine({y, res.recv_topk_weights, {}, {}}, res.handle));
}

// One low-latency call pair on uniform routing; combine checked for shape only
// here (the low-latency suites check its values).
template <class Buffer>
void low_latency_round(Buffer& buf, const shape& s, int rank) {
  const auto in = make_input<bf16>(s, rank);
  const auto res = buf.low_latency_dispatch({s.tokens, s.topk, in.x, in.topk_idx});
  const auto y = buf.combine_send_buffer(res.handle);
  buf.low_latency_combine({y, in.topk_idx, in.topk_weights}, res.handle);
}

// True when /dev/shm holds nothing of this launch (its regrouped groups'
// tags extend it): checked by the ranks themselves, since the launcher
// removes what is left once they have exited.
inline bool no_segments_left(const std::string& job_tag) {
  const std::string prefix = "epcomm-" + job_tag + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().starts_with(prefix)) {
      std::fprintf(stderr, "left in /dev/shm: %s\n", e.path().c_str());
      return false;
    }
  return true;
}

// Once the buffer is up: its transport's name and how long construction took.
template <class Transport>
void note_setup(report& out, Transport& t, steady::time_point began) {
  std::snprintf(out.transport, sizeof out.transport, "%s", transport_name(t).c_str());
  out.setup_us =
      std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - began).count();
}

// What every rank runs: two rounds (the fault fires in the second), then,
// on the survivors, a new group without the victim. `window_rows` > 0: the
// normal-mode buffer's byte budget leaves that many rows per peer, so its
// calls move in rounds (normal/window.hpp) and a fault mid-dispatch or
// mid-combine fires after the first of them.
template <class Transport>
int run_rank(local_bootstrap& boot, fault::action what, fault::point at, const timing& tm,
             report& out, int window_rows = 0) {
  const int rank = boot.rank();
  const int world = boot.world_size();
  shape s{world, 32, 256, 2, 2 * world, routing::random, 1};
  // A round's error is timed where it is thrown: unwinding then tears the
  // buffer down, which drains (bounded) what is still in flight.
  auto start = steady::now();
  std::optional<steady::time_point> failed_at;
  auto timed = [&](auto&& round) {
    start = steady::now();
    try {
      return round();
    } catch (const error&) {
      failed_at = steady::now();
      // A dropping victim stays alive a while, its transport aborted but not
      // yet closed: its peers must learn of the drop from the abort itself,
      // not from the process or its connections going away.
      if (rank == victim && what == fault::action::drop) std::this_thread::sleep_for(tm.deadline);
      throw;
    }
  };
  try {
    if (at == fault::point::low_latency) {
      low_latency_buffer<Transport> buf(
          boot, {s.experts, s.hidden, s.topk, s.tokens, false, tm.deadline, false, setup_timeout});
      note_setup(out, buf.transport(), start);
      for (int round = 0; round < 2; ++round) timed([&] { low_latency_round(buf, s, rank); });
    } else {
      buffer_config cfg{s.experts, s.hidden,    s.topk, s.tokens,
                        0,         tm.deadline, false,  setup_timeout};
      if (window_rows > 0)
        cfg.max_buffer_bytes = wire::budget_for_window(
            whole_capacity<bf16>(cfg, world), window_rows, !peer_mapped_transport<Transport>);
      buffer<Transport, bf16> buf(boot, cfg);
      note_setup(out, buf.transport(), start);
      if (buf.capacity().window_rows != window_rows) {
        std::fprintf(stderr, "rank %d: a window of %d rows instead of %d\n", rank,
                     buf.capacity().window_rows, window_rows);
        return wrong_result;
      }
      for (int round = 0; round < 2; ++round, ++s.seed)
        if (auto e = timed([&] { return normal_round(buf, s, rank); }); !e.empty()) {
          std::fprintf(stderr, "rank %d: wrong result before the fault: %s\n", rank, e.c_str());
          return wrong_result;
        }
    }
    return no_error;
  } catch (const error& e) {
    const auto now = steady::now();
    const auto at_error = failed_at.value_or(now);
    out.took_us = std::chrono::duration_cast<std::chrono::microseconds>(at_error - start).count();
    out.teardown_us = std::chrono::duration_cast<std::chrono::microseconds>(now - at_error).count();
    out.peer = e.peer();
    std::snprintf(out.what, sizeof out.what, "%s", e.what());
  }
  // A stalled or dropped victim sees an error too (its peers gave up on
  // it), which is expected; it takes no part in the new group.
  if (rank == victim) return ok;

  // Re-form without the victim: 2 ranks, experts redistributed over them.
  // Ranks are renumbered, so the fault (aimed at rank 1) is disarmed first.
  // Nothing fails here, so the deadline is a generous one.
  fault::disarm();
  const int lost[] = {victim};
  local_bootstrap next = boot.regroup(lost);
  {
    shape t{next.world_size(), 48, 256, 2, 2 * next.world_size(), routing::uneven, 7};
    buffer<Transport, bf16> fresh(
        next, {t.experts, t.hidden, t.topk, t.tokens, 0, std::chrono::milliseconds(30'000)});
    for (int round = 0; round < 3; ++round, ++t.seed)
      if (auto e = normal_round(fresh, t, next.rank()); !e.empty()) {
        std::fprintf(stderr, "rank %d after regroup: %s\n", rank, e.c_str());
        return regroup_failed;
      }
  }
  return no_segments_left(boot.job_tag()) ? ok : leaked;
}

// The EPCOMM_FAULT value that arms `what` at `at` on the victim's second call.
inline std::string fault_spec(fault::action what, fault::point at, const timing& tm) {
  return "rank=" + std::to_string(victim) + ",point=" + fault::name(at) +
         ",action=" + fault::name(what) + ",hit=2,stall_ms=" + std::to_string(tm.stall.count());
}

}  // namespace epcomm::test::faults
