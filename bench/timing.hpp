// Timing of collective operations: every sample starts at a barrier and is the slowest rank's
// time, because an op is done when its last rank is; a run is reported as its median and
// spread.
#pragma once

#include <mpi.h>

#include <chrono>
#include <vector>

namespace epcomm::bench {

// Microseconds from leaving a barrier to the end of f() on the slowest rank. MPI_Barrier rather
// than a bootstrap barrier: its busy-polling releases all ranks within microseconds of each
// other, where a barrier that backs off to sleeping would skew the start by up to its sleep.
template <class F>
double time_collective(MPI_Comm comm, F&& f) {
  MPI_Barrier(comm);
  const auto start = std::chrono::steady_clock::now();
  f();
  const double mine =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  double slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}

struct summary {
  double median_us = 0;
  double p10_us = 0;  // 10th and 90th percentiles: the spread
  double p90_us = 0;
  double min_us = 0;
  int samples = 0;
};

summary summarize(std::vector<double> us);

}  // namespace epcomm::bench
