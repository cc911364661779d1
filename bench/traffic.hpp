// What an op must move, whatever the implementation: each token once to each rank that owns at
// least one of its experts (dispatch), and one row back from each of those ranks (combine).
// This is the byte count every bandwidth is computed from, and the raw link's copy plan.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace epcomm::bench {

// `bytes` from offset `src_offset` of this rank's source buffer to offset `dst_offset` of
// `peer`'s buffer.
struct transfer {
  int peer;
  std::size_t src_offset;
  std::size_t dst_offset;
  std::size_t bytes;
};

struct traffic {
  std::vector<transfer> dispatch;  // this rank's rows for each rank
  std::vector<transfer> combine;   // the rows received from each rank, going back
  double dispatch_bytes = 0;       // this rank's share
  double combine_bytes = 0;
};

// counts[s * R + r]: tokens rank s sends to rank r, learned from every rank's routing.
// Collective over comm.
std::vector<int> rank_pair_counts(MPI_Comm comm, std::span<const std::int64_t> topk_idx, int topk,
                                  int experts_per_rank);

// The transfers of rank `rank`, packed at each destination by source rank (as epcomm's normal
// mode places them), for rows of dispatch_row and combine_row bytes.
traffic plan_traffic(std::span<const int> counts, int world, int rank, std::size_t dispatch_row,
                     std::size_t combine_row);

}  // namespace epcomm::bench
