// Normal mode under a byte budget (buffer_config::max_buffer_bytes): when the
// regions for a whole call (max_recv_tokens rows received, max_combine_rows
// returned) do not fit, a rank's buffer holds a window of `window_rows` rows
// per peer instead (wire::plan_regions), and a call moves its rows in rounds.
//
// Round i of a dispatch moves, for every (source, destination) pair, the
// pair's rows [i * W, (i + 1) * W) in receive order into the destination's
// window for that source; a counted data signal ends it, as a whole call's
// rows are ended today. The destination copies them out of its window into
// the result (host memory it owns, laid out as the unbounded regions are)
// and adds 1 to the source's window_free counter; the source fills the
// window again only once that counter says so. The last round needs no
// such signal: the next call's first round, which the destination posts
// only after copying the rows out, comes before any window is written
// again. Combine runs the same rounds
// in reverse, expert ranks filling their sources' combine windows. Every
// rank holds the count matrix after the notify round, so all agree on the
// rounds a call takes without another exchange, and the results are those
// of the unbounded engine, byte for byte.
#pragma once

#include <cstddef>

#include "epcomm/core/config.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm::wire {

// Rounds every rank runs for one call: as many as the largest pair needs,
// at least one, so that a call without rows still ends with its signals.
EPCOMM_HD constexpr int window_rounds(const int* counts, int world, int window_rows) {
  int most = 0;
  for (int i = 0; i < world * world; ++i)
    if (counts[i] > most) most = counts[i];
  return most == 0 ? 1 : (most + window_rows - 1) / window_rows;
}

// The rows of a pair's `count` that move in round `round`: [first, first + rows).
struct window_slice {
  int first;
  int rows;
};

EPCOMM_HD constexpr window_slice slice_of(int count, int round, int window_rows) {
  const int first = round * window_rows;
  const int left = count - first;
  return {first, left <= 0 ? 0 : (left < window_rows ? left : window_rows)};
}

// The bytes a buffer of capacity `c` takes with a window of `rows` rows per
// peer: the budget that buys that window (window_for_budget's inverse).
EPCOMM_HD constexpr std::size_t budget_for_window(capacity c, int rows, bool staging) {
  c.window_rows = rows;
  return plan_regions(c, staging).total;
}

// The window a buffer of capacity `c` gets within `budget` bytes, for the
// plan options the engine uses: 0 when the budget is 0 (none) or the regions
// for a whole call fit; else the most rows per peer that fit, -1 when not
// even one does. A pair never has more rows than max_tokens_per_rank (a
// source sends a token to a rank once), so a larger window buys nothing.
EPCOMM_HD constexpr int window_for_budget(capacity c, std::size_t budget, bool staging,
                                          bool in_place_combine) {
  c.window_rows = 0;
  if (budget == 0 || plan_regions(c, staging, in_place_combine).total <= budget) return 0;
  int lo = 0;  // fits (0 meaning "nothing does" until a window is found)
  int hi = c.max_tokens_per_rank > 1 ? c.max_tokens_per_rank : 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    c.window_rows = mid;
    if (plan_regions(c, staging, in_place_combine).total <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo == 0 ? -1 : lo;
}

}  // namespace epcomm::wire
