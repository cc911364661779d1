// DeepEP's async_finish on a normal-mode host engine (normal/async_calls.hpp),
// for any engine and group: the caller computes while the buffer's thread
// communicates, then collects the result. Checked: results equal the
// reference; a synchronous dispatch queued behind an asynchronous one runs
// after it; one rank's bad input fails every rank's completion, naming it,
// and the buffer goes on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epcomm/core/error.hpp"
#include "epcomm/normal/arguments.hpp"
#include "support/case_config.hpp"
#include "support/exit_codes.hpp"
#include "support/reference.hpp"

namespace epcomm::test {

// On every rank of a group of `world`, with a bf16 buffer built from
// case_config(world, 128): 0, or a failure.
template <class Buffer>
int check_async_calls(Buffer& buf, int rank, int world) {
  const int culprit = world - 1;
  const shape s{world, 40, 128, 4, 4 * world, routing::random, 81u};
  const shape t{world, 40, 128, 4, 4 * world, routing::uneven, 82u};
  std::vector<rank_input<bf16>> all, other;
  for (int r = 0; r < world; ++r) {
    all.push_back(make_input<bf16>(s, r));
    other.push_back(make_input<bf16>(t, r));
  }
  const auto& mine = all[rank];
  auto pending = buf.dispatch_async(
      {s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
  const auto res = pending.get();
  if (auto e = check_dispatch(s, rank, all, res); !e.empty())
    return fail_rank(rank, "async dispatch: " + e);
  const auto y = expert_rows(res, s.hidden, rank);
  std::vector<bf16> out_x(static_cast<std::size_t>(s.tokens) * s.hidden);
  std::vector<float> out_w(static_cast<std::size_t>(s.tokens) * s.topk);
  auto combined = buf.combine_async({y, res.recv_topk_weights, {}, {}}, res.handle, out_x, out_w);
  combined.wait();
  if (!combined.ready()) return fail_rank(rank, "a waited completion is not ready");
  combined.get();
  if (auto e = check_combine(s, mine, combine_result<bf16>{out_x, out_w}); !e.empty())
    return fail_rank(rank, "async combine: " + e);

  // Queued, not waited for: the synchronous dispatch runs second, so its
  // results are t's, and the first one's handle is s's routing.
  auto first = buf.dispatch_async(
      {s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
  const auto& o = other[rank];
  const auto second =
      buf.dispatch({t.tokens, t.hidden, t.topk, o.x, {}, o.topk_idx, o.topk_weights});
  if (!first.ready() || first.get().handle.count_matrix != res.handle.count_matrix)
    return fail_rank(rank, "the synchronous dispatch did not wait for the queued one");
  if (auto e = check_dispatch(t, rank, other, second); !e.empty())
    return fail_rank(rank, "dispatch behind an async one: " + e);

  std::vector<std::int64_t> bad(mine.topk_idx.begin(), mine.topk_idx.end());
  if (rank == culprit) bad[0] = 99;
  auto refused =
      buf.dispatch_async({s.tokens, s.hidden, s.topk, mine.x, {}, bad, mine.topk_weights});
  try {
    refused.get();
    return fail_rank(rank, "bad input accepted");
  } catch (const error& e) {
    const std::string expected = "is outside [-1, " + std::to_string(4 * world) + ")";
    if (std::string(e.what()).find(expected) == std::string::npos ||
        (rank != culprit && e.peer() != culprit))
      return fail_rank(rank, e.what());
  }
  const auto after =
      buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
  return check_dispatch(s, rank, all, after).empty()
             ? 0
             : fail_rank(rank, "dispatch after the refused async one");
}

}  // namespace epcomm::test
