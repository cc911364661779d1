#include "memory_bound.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

namespace epcomm::bench {

double copy_bandwidth(MPI_Comm comm, std::size_t bytes) {
  // Written before timing, so the copies touch real pages, not the shared zero page.
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes, std::byte{0});
  std::memcpy(dst.data(), src.data(), bytes);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 5; ++i) {
    MPI_Barrier(comm);
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  double slowest = 0;
  MPI_Allreduce(&best, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return 2.0 * static_cast<double>(bytes) / slowest;
}

memory_traffic must_move(const traffic& t, int tokens, std::size_t dispatch_row,
                         std::size_t combine_row) {
  const double sent_rows = t.dispatch_bytes / static_cast<double>(dispatch_row);
  const double rows_and_tokens = sent_rows + static_cast<double>(tokens);
  return {rows_and_tokens * static_cast<double>(dispatch_row),
          rows_and_tokens * static_cast<double>(combine_row)};
}

}  // namespace epcomm::bench
