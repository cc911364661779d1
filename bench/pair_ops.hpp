// The three ops every case times (dispatch, combine, dispatch+combine), built once from what the
// case's routing makes each op move: the bytes it sends (the most any rank sends), the bytes it
// must move through memory, and the raw link's copy of the same transfers.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "bench_case.hpp"
#include "inputs.hpp"
#include "memory_bound.hpp"
#include "traffic.hpp"

namespace epcomm::bench {

// One op's two library contenders: epcomm's call and the baseline's.
struct contenders {
  std::function<void()> epcomm;
  std::function<void()> baseline;
};

// What this rank's routing makes the ops move. Collective over comm (the case's ranks).
class op_plan {
 public:
  op_plan() = default;
  op_plan(MPI_Comm comm, std::span<const std::int64_t> topk_idx, const workload& w, int rank,
          std::size_t dispatch_row, std::size_t combine_row)
      : comm_(comm) {
    int world = 0;
    MPI_Comm_size(comm, &world);
    traffic_ = plan_traffic(rank_pair_counts(comm, topk_idx, w.topk, w.experts / world), world,
                            rank, dispatch_row, combine_row);
    moved_ = must_move(traffic_, w.tokens, dispatch_row, combine_row);
  }

  // The ops, their raw-link copies over `link`; `link` and this plan must outlive them.
  // Collective.
  template <class Link>
  std::vector<timed_op> ops(Link& link, contenders dispatch, contenders combine,
                            contenders pair) const {
    return {
        {"dispatch", std::move(dispatch.epcomm), std::move(dispatch.baseline),
         [&link, this] { link.copy(traffic_.dispatch); }, most(traffic_.dispatch_bytes),
         most(moved_.dispatch)},
        {"combine", std::move(combine.epcomm), std::move(combine.baseline),
         [&link, this] { link.copy(traffic_.combine); }, most(traffic_.combine_bytes),
         most(moved_.combine)},
        {"dispatch+combine", std::move(pair.epcomm), std::move(pair.baseline),
         [&link, this] {
           link.copy(traffic_.dispatch);
           link.copy(traffic_.combine);
         },
         most(traffic_.dispatch_bytes + traffic_.combine_bytes),
         most(moved_.dispatch + moved_.combine)},
    };
  }

 private:
  // The busiest rank's value: the op is as slow as its slowest rank.
  double most(double mine) const {
    double all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_MAX, comm_);
    return all;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  traffic traffic_;
  memory_traffic moved_;
};

}  // namespace epcomm::bench
