#include "traffic.hpp"

#include <algorithm>

namespace epcomm::bench {

std::vector<int> rank_pair_counts(MPI_Comm comm, std::span<const std::int64_t> topk_idx, int topk,
                                  int experts_per_rank) {
  int world = 0;
  MPI_Comm_size(comm, &world);
  std::vector<int> mine(world, 0);
  std::vector<char> seen(world);
  const std::size_t tokens = topk_idx.size() / topk;
  for (std::size_t t = 0; t < tokens; ++t) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int j = 0; j < topk; ++j) {
      const std::int64_t e = topk_idx[t * topk + j];
      if (e < 0) continue;
      const auto r = static_cast<std::size_t>(e / experts_per_rank);
      if (!seen[r]) ++mine[r];
      seen[r] = 1;
    }
  }
  std::vector<int> all(static_cast<std::size_t>(world) * world);
  MPI_Allgather(mine.data(), world, MPI_INT, all.data(), world, MPI_INT, comm);
  return all;
}

traffic plan_traffic(std::span<const int> counts, int world, int rank, std::size_t dispatch_row,
                     std::size_t combine_row) {
  const auto sent = [&](int s, int r) {
    return static_cast<std::size_t>(counts[static_cast<std::size_t>(s) * world + r]);
  };
  traffic out;
  std::size_t dispatch_from = 0, combine_from = 0;
  for (int p = 0; p < world; ++p) {
    std::size_t dispatch_at = 0, combine_at = 0;
    for (int s = 0; s < rank; ++s) dispatch_at += sent(s, p) * dispatch_row;
    for (int r = 0; r < rank; ++r) combine_at += sent(p, r) * combine_row;
    const std::size_t there = sent(rank, p) * dispatch_row, back = sent(p, rank) * combine_row;
    out.dispatch.push_back({p, dispatch_from, dispatch_at, there});
    out.combine.push_back({p, combine_from, combine_at, back});
    dispatch_from += there;
    combine_from += back;
  }
  out.dispatch_bytes = static_cast<double>(dispatch_from);
  out.combine_bytes = static_cast<double>(combine_from);
  return out;
}

}  // namespace epcomm::bench
