// The physical bound's byte count (bench/memory_bound.hpp): what a rank must read and write,
// from the transfers the bench plans, against counts worked out by hand.
#include <doctest/doctest.h>

#include <vector>

#include "memory_bound.hpp"
#include "traffic.hpp"

using namespace epcomm::bench;

TEST_CASE("dispatch reads each token once and writes it once per destination rank; combine the "
          "reverse") {
  // Rank 0 sends 3 rows to itself and 5 to rank 1, rank 1 sends 2 to rank 0 and 4 to itself;
  // rows of 10 bytes out, 6 back. Rank 0 has 7 tokens (one reaches both ranks, one neither).
  const std::vector<int> counts = {3, 5, 2, 4};
  const traffic t = plan_traffic(counts, 2, 0, 10, 6);
  CHECK(t.dispatch_bytes == 80);  // (3 + 5) rows of 10
  CHECK(t.combine_bytes == 30);   // the 3 + 2 rows rank 0 received, going back
  const memory_traffic m = must_move(t, 7, 10, 6);
  CHECK(m.dispatch == 7 * 10 + 80);
  // The 3 + 5 rows that come back to rank 0 read once, its 7 tokens written once: not the rows
  // it received (those are rank 1's to read).
  CHECK(m.combine == (3 + 5) * 6 + 7 * 6);

  const memory_traffic other = must_move(plan_traffic(counts, 2, 1, 10, 6), 7, 10, 6);
  CHECK(other.dispatch == 7 * 10 + (2 + 4) * 10);
  CHECK(other.combine == (2 + 4) * 6 + 7 * 6);
}
