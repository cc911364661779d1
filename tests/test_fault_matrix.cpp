// The fault matrix: one rank exits, stalls or drops its transport at each
// protocol point; every survivor must get an epcomm::error naming it within
// the deadline plus a small slack, nothing may hang or leak, and the
// survivors must then re-form a group without it and compute correct results.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "epcomm/fault_injection.hpp"
#include "epcomm/low_latency.hpp"
#include "support/run_case.hpp"

using namespace epcomm;
using test::routing;
using test::shape;

namespace {

constexpr int world = 3;
constexpr int victim = 1;
constexpr auto timeout = std::chrono::milliseconds(1'000);
constexpr auto slack = std::chrono::milliseconds(2'500);

// Exit codes that tell the parent what each rank saw.
constexpr int ok = 0, no_error = 10, wrong_error = 11, too_slow = 12, regroup_failed = 13;

// One normal-mode call pair, checked against the reference.
template <class Buffer>
std::string normal_round(Buffer& buf, const shape& s, int rank) {
  std::vector<test::rank_input<bf16>> all;
  for (int r = 0; r < s.world; ++r) all.push_back(test::make_input<bf16>(s, r));
  const auto& mine = all[rank];
  const auto res = buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
  if (auto e = test::check_dispatch(s, rank, all, res); !e.empty()) return e;
  const auto y = test::expert_rows(res, s.hidden, rank);
  return test::check_combine(s, mine, buf.combine({y, res.recv_topk_weights, {}, {}}, res.handle));
}

// One low-latency call pair on uniform routing; combine checked for shape only
// here (tests/test_low_latency.cpp checks its values).
template <class Buffer>
void low_latency_round(Buffer& buf, const shape& s, int rank) {
  const auto in = test::make_input<bf16>(s, rank);
  const auto res = buf.low_latency_dispatch({s.tokens, s.topk, in.x, in.topk_idx});
  const auto y = buf.combine_send_buffer(res.handle);
  buf.low_latency_combine({y, in.topk_idx, in.topk_weights}, res.handle);
}

// What a survivor runs: two rounds (the fault fires in the second), then a
// new group without the victim. The victim runs it too, quietly.
int survivor(local_bootstrap& boot, fault::point at, bool quiet = false) {
  const int rank = boot.rank();
  shape s{world, 32, 256, 2, 2 * world, routing::random, 1};
  steady::time_point start{};
  try {
    if (at == fault::point::low_latency) {
      low_latency_buffer<shm::transport> buf(boot, {s.experts, s.hidden, s.topk, s.tokens, false, timeout});
      for (int round = 0; round < 2; ++round) {
        start = steady::now();
        low_latency_round(buf, s, rank);
      }
    } else {
      buffer<shm::transport, bf16> buf(boot, {s.experts, s.hidden, s.topk, s.tokens, 0, timeout});
      for (int round = 0; round < 2; ++round, ++s.seed) {
        start = steady::now();
        if (auto e = normal_round(buf, s, rank); !e.empty()) {
          std::fprintf(stderr, "rank %d: wrong result before the fault: %s\n", rank, e.c_str());
          return wrong_error;
        }
      }
    }
    return no_error;
  } catch (const error& e) {
    const auto took = steady::now() - start;
    if (quiet) throw;
    if (e.peer() != victim) {
      std::fprintf(stderr, "rank %d: error does not name rank %d: %s\n", rank, victim, e.what());
      return wrong_error;
    }
    if (took > timeout + slack) {
      std::fprintf(stderr, "rank %d: error after %lld ms\n", rank,
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
      return too_slow;
    }
  }
  // Re-form without the victim: 2 ranks, experts redistributed over them.
  // Ranks are renumbered, so the fault (aimed at rank 1) is disarmed first.
  fault::disarm();
  const int lost[] = {victim};
  local_bootstrap next = boot.regroup(lost);
  shape t{next.world_size(), 48, 256, 2, 2 * next.world_size(), routing::uneven, 7};
  buffer<shm::transport, bf16> fresh(next, {t.experts, t.hidden, t.topk, t.tokens, 0, timeout});
  for (int round = 0; round < 3; ++round, ++t.seed)
    if (auto e = normal_round(fresh, t, next.rank()); !e.empty()) {
      std::fprintf(stderr, "rank %d after regroup: %s\n", rank, e.c_str());
      return regroup_failed;
    }
  return ok;
}

// The victim runs the same calls; for stall and drop it survives the fault
// and sees an error afterwards (its peers gave up on it), which is expected.
int victim_rank(local_bootstrap& boot, fault::point at) {
  try {
    return survivor(boot, at, true) == no_error ? no_error : ok;
  } catch (const error&) {
    return ok;
  }
}

bool no_segments_left() {
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().starts_with("epcomm-")) return false;
  return true;
}

void run_fault(fault::action what, const char* action_name, fault::point at) {
  const std::string spec = std::string("rank=") + std::to_string(victim) + ",point=" + fault::name(at) +
                           ",action=" + action_name + ",hit=2,stall_ms=4000";
  CAPTURE(spec);
  const auto begin = steady::now();
  const auto codes = launch_local(
      world,
      [&](local_bootstrap& boot) {
        setenv("EPCOMM_FAULT", spec.c_str(), 1);
        return boot.rank() == victim ? victim_rank(boot, at) : survivor(boot, at);
      },
      {std::chrono::seconds(60)});
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    if (r == victim && what == fault::action::exit)
      CHECK(codes[r] == fault::exit_code);
    else if (r == victim && what == fault::action::stall)
      // A straggler may still finish the call it stalled in (everything it
      // waited for had arrived) or fail on seeing its peers' abort.
      CHECK((codes[r] == ok || codes[r] == no_error));
    else
      CHECK(codes[r] == ok);
  }
  CHECK(steady::now() - begin < std::chrono::seconds(30));
  CHECK(no_segments_left());
}

}  // namespace

TEST_CASE("fault matrix over the shm transport: {exit, stall, drop} x protocol points") {
  for (auto at : {fault::point::before_notify, fault::point::mid_dispatch, fault::point::mid_combine,
                  fault::point::low_latency}) {
    run_fault(fault::action::exit, "exit", at);
    run_fault(fault::action::stall, "stall", at);
    run_fault(fault::action::drop, "drop", at);
  }
}

TEST_CASE("a malformed fault spec is an error, not a silently disarmed fault") {
  CHECK_THROWS_WITH_AS(fault::parse("rank=1,point=nowhere"), doctest::Contains("unknown point 'nowhere'"), error);
  CHECK_THROWS_WITH_AS(fault::parse("point=mid_combine"), doctest::Contains("rank is required"), error);
  CHECK_THROWS_WITH_AS(fault::parse("rank=x"), doctest::Contains("non-negative integer"), error);
  const auto p = fault::parse("rank=2,point=mid_dispatch,action=stall,stall_ms=5,hit=3");
  CHECK(p.rank == 2);
  CHECK(p.at == fault::point::mid_dispatch);
  CHECK(p.what == fault::action::stall);
  CHECK(p.stall == std::chrono::milliseconds(5));
  CHECK(p.hit == 3);
}
