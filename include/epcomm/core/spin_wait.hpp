// Polling with a deadline. Spins first (a peer that is about to answer costs
// nothing), then yields, then sleeps in growing steps: tests run more ranks
// than cores, and a spinning rank must not starve the one it waits for.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "epcomm/core/deadline.hpp"

namespace epcomm::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Returns true once ready() holds, false when dl expires first. check() runs
// about once a millisecond while waiting and may throw (a peer known dead);
// it runs once more before the deadline is reported, so that a wait begun
// late in its call (a deadline set at the call's start) still names a peer
// known gone rather than the clock.
template <class Ready, class Check>
bool spin_wait(Ready&& ready, const deadline& dl, Check&& check) {
  constexpr int spins = 256;
  constexpr int yields = 512;
  auto sleep = std::chrono::microseconds(5);
  auto next_check = steady::now() + std::chrono::milliseconds(1);
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if (i < spins) {
      cpu_relax();
      continue;
    }
    if (i < spins + yields) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
    const auto now = steady::now();
    if (now >= next_check) {
      if (ready()) return true;
      check();
      if (now >= dl.at()) return false;
      next_check = now + std::chrono::milliseconds(1);
    }
  }
}

}  // namespace epcomm::detail
