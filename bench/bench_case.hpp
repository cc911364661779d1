// What the driver needs from one (transport, mode, dtype, workload) combination: a check that
// epcomm and the baseline agree, and the ops to time, each as three interchangeable contenders.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace epcomm::bench {

struct timed_op {
  std::string name;  // "dispatch", "combine" or "dispatch+combine"
  std::function<void()> epcomm;
  std::function<void()> baseline;
  std::function<void()> peer_copy;  // the op's bytes over the raw link (peer_copy.hpp)
  double bytes = 0;                 // what the op sends: the most any rank sends
  double must_move = 0;             // bytes through memory, the busiest rank's (memory_bound.hpp)
  // Runs before each timed epcomm call, untimed, when an op needs state that the previous call
  // used up (a low-latency combine answers exactly one dispatch).
  std::function<void()> epcomm_setup = {};
};

class bench_case {
 public:
  virtual ~bench_case() = default;
  // Runs epcomm and the baseline once and compares their results on this rank: empty when they
  // are equal (and right), else what differs. Not collective beyond the ops themselves.
  virtual std::string verify() = 0;
  // Collective; called on every rank once every rank has verified.
  virtual std::vector<timed_op> ops() = 0;
};

}  // namespace epcomm::bench
