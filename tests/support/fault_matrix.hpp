// The fault matrix, for any transport, on 3 ranks: one rank (the victim)
// exits, stalls or drops its transport at a protocol point of its second
// call (tests/support/fault_cell.hpp); every survivor must get an
// epcomm::error naming the victim within the deadline plus a small slack
// (exit and drop well before the deadline: the loss is detected or the abort
// relayed, not timed out), nothing may hang or leak, and the survivors must
// then re-form a group without the victim and compute correct results. Each
// survivor's error and how long it took are reported per cell.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "support/fault_cell.hpp"

namespace epcomm::test::faults {

// One cell: runs the group with the fault armed, checks every rank's
// outcome, and reports the survivors' errors and times. `window_rows`: see
// run_rank.
template <class Transport>
void run_cell(fault::action what, fault::point at, const timing& tm, int window_rows) {
  const int world = 3;
  const std::string spec = fault_spec(what, at, tm);
  CAPTURE(spec);
  CAPTURE(window_rows);
  shared_reports reports;
  const auto begin = steady::now();
  const std::vector<int> codes = launch_local(
      world,
      [&](local_bootstrap& boot) {
        setenv("EPCOMM_FAULT", spec.c_str(), 1);
        return run_rank<Transport>(boot, what, at, tm, reports[boot.rank()], window_rows);
      },
      {std::chrono::seconds(60) + 2 * setup_timeout});
  const auto elapsed = steady::now() - begin;

  std::ostringstream summary;
  summary << reports[0].transport << " " << fault::name(what) << " @ " << fault::name(at);
  if (window_rows > 0) summary << " (windows of " << window_rows << " rows)";
  summary << ":";
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const report& rep = reports[r];
    const std::string text = rep.what;
    CAPTURE(text);
    if (r == victim) {
      if (what == fault::action::exit)
        CHECK(codes[r] == fault::exit_code);
      else if (what == fault::action::stall)
        // A straggler may still finish the call it stalled in (everything it
        // waited for had arrived) or fail on seeing its peers' abort.
        CHECK((codes[r] == ok || codes[r] == no_error));
      else
        CHECK(codes[r] == ok);
      continue;
    }
    CHECK(codes[r] == ok);
    const auto took = std::chrono::microseconds(rep.took_us);
    CHECK(rep.took_us >= 0);
    CHECK(rep.peer == victim);
    CHECK(took <= tm.deadline + tm.slack);
    // A lost or dropped victim is found, or its abort relayed, long before
    // anyone's deadline: only a stall may take that long. A drop is learnt
    // from the victim's abort, directly or relayed.
    if (what != fault::action::stall) CHECK(text.find("deadline expired") == std::string::npos);
    if (what == fault::action::drop) CHECK(text.find("aborted") != std::string::npos);
    summary << "\n  rank " << r << " (set up in " << rep.setup_us / 1000 << " ms): error after "
            << rep.took_us / 1000 << " ms, teardown " << rep.teardown_us / 1000 << " ms: " << text;
  }
  // Past set-up (which setup_timeout bounds), nothing hangs.
  std::int64_t slowest_setup_us = 0;
  for (int r = 0; r < world; ++r)
    slowest_setup_us = std::max(slowest_setup_us, reports[r].setup_us);
  CHECK(elapsed - std::chrono::microseconds(slowest_setup_us) < std::chrono::seconds(30));
  summary << "\n  cell took "
          << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() << " ms";
  MESSAGE(summary.str());
}

// Every (action, point) pair of the lists.
template <class Transport>
void run_matrix(const std::vector<fault::action>& actions, const std::vector<fault::point>& points,
                const timing& tm = {}, int window_rows = 0) {
  for (auto at : points)
    for (auto what : actions) run_cell<Transport>(what, at, tm, window_rows);
}

}  // namespace epcomm::test::faults
