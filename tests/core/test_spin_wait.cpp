// The polling loop every wait runs: ready() ends it, the deadline ends it,
// and check() (a peer known gone) has the last word before the deadline
// does, also for a wait that starts with its call's deadline nearly spent.
#include <doctest/doctest.h>

#include <chrono>
#include <stdexcept>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/spin_wait.hpp"

using namespace epcomm;
using namespace std::chrono_literals;

TEST_CASE("spin_wait returns once ready, and at the deadline when nothing happens") {
  int polls = 0;
  CHECK(detail::spin_wait([&] { return ++polls == 3; }, deadline::after(10s), [] {}));
  CHECK(polls == 3);

  int checks = 0;
  const auto start = steady::now();
  CHECK_FALSE(detail::spin_wait([] { return false; }, deadline::after(20ms), [&] { ++checks; }));
  CHECK(steady::now() - start >= 20ms);
  CHECK(checks > 0);
}

TEST_CASE("spin_wait lets check() speak before it reports a deadline that has passed") {
  int checks = 0;
  auto gone = [&] {
    ++checks;
    throw std::runtime_error("peer gone");
  };
  CHECK_THROWS_WITH(detail::spin_wait([] { return false; }, deadline::after(0ms), gone),
                    "peer gone");
  CHECK(checks == 1);
}
