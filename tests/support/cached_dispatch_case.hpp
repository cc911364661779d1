// DeepEP's dispatch(handle=) on a normal-mode host engine, for any engine and
// group: a backward pass sends new rows (fp8, with scales) along the routing
// kept from an earlier dispatch, with another dispatch in between. Each row
// must land where the handle's routing put its token, a combine of the handle
// must sum them back, and the same call queued (dispatch_async) must give the
// same rows. A combine in which the last rank passes its handle of another
// dispatch must fail on every rank, naming it, before any row moves (the
// combine header's routing), and leave the buffer serving: the dispatch in
// between (other counts), and a twin of the first (the same routing, so the
// same count matrix: only the dispatch's number tells them apart).
#pragma once

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "epcomm/core/error.hpp"
#include "epcomm/normal/arguments.hpp"
#include "support/case_config.hpp"
#include "support/exit_codes.hpp"
#include "support/reference.hpp"

namespace epcomm::test {

// What check_cached_dispatch calls around the dispatch that makes the handle
// and around the cached dispatch, to measure them (e.g. their traffic).
struct no_probe {
  void before_first() {}
  void after_first() {}
  void before_cached() {}
  void after_cached() {}
};

// On every rank of a group of `world`, with a buffer serving fp8 built from
// case_config(world, 256): 0, or a failure.
template <class Buffer, class Probe = no_probe>
int check_cached_dispatch(Buffer& buf, int rank, int world, Probe&& probe = {}) {
  const int experts = 4 * world;
  const shape kept{world, 37, 256, 4, experts, routing::random, 5u};
  const shape between{world, 40, 256, 4, experts, routing::uneven, 6u};
  const shape fresh{world, 37, 256, 4, experts, routing::random, 7u};  // its x only
  const auto a = make_input<fp8_e4m3>(kept, rank);
  probe.before_first();
  const auto first = buf.dispatch(dispatch_input<fp8_e4m3>{kept.tokens, kept.hidden, kept.topk, a.x,
                                                           a.scales, a.topk_idx, a.topk_weights});
  probe.after_first();
  const dispatch_handle h = first.handle;
  const std::vector<std::int32_t> src(first.recv_src_idx.begin(), first.recv_src_idx.end());
  const auto b = make_input<fp8_e4m3>(between, rank);
  const dispatch_handle other =
      buf.dispatch(dispatch_input<fp8_e4m3>{between.tokens, between.hidden, between.topk, b.x,
                                            b.scales, b.topk_idx, b.topk_weights})
          .handle;
  const dispatch_handle twin =
      buf.dispatch(dispatch_input<fp8_e4m3>{kept.tokens, kept.hidden, kept.topk, a.x, a.scales,
                                            a.topk_idx, a.topk_weights})
          .handle;
  if (twin.count_matrix != h.count_matrix)
    return fail_rank(rank, "the same routing gave another count matrix");

  std::vector<rank_input<fp8_e4m3>> all;
  for (int r = 0; r < world; ++r) all.push_back(make_input<fp8_e4m3>(fresh, r));
  const std::size_t hidden = kept.hidden, nscales = hidden / fp8_block;
  auto check_rows = [&](const dispatch_result<fp8_e4m3>& res, const std::string& what) {
    if (res.num_recv_tokens != h.num_recv_tokens || !res.recv_topk_idx.empty() ||
        !res.num_recv_tokens_per_expert.empty() ||
        !std::equal(src.begin(), src.end(), res.recv_src_idx.begin(), res.recv_src_idx.end()))
      return fail_rank(rank, what + ": counts, source indices or extras differ");
    for (int s = 0; s < world; ++s) {
      for (int i = 0; i < h.sent(s, rank); ++i) {
        const std::size_t row = h.recv_offset(s, rank) + i, t = src[row];
        if (std::memcmp(&res.recv_x[row * hidden], &all[s].x[t * hidden], hidden) != 0 ||
            std::memcmp(&res.recv_x_scales[row * nscales], &all[s].scales[t * nscales],
                        nscales * sizeof(float)) != 0)
          return fail_rank(rank, what + ": row " + std::to_string(row) + " is not token " +
                                     std::to_string(t) + " of rank " + std::to_string(s));
      }
    }
    return 0;
  };
  const cached_dispatch_input<fp8_e4m3> rows{all[rank].x, all[rank].scales};
  probe.before_cached();
  const auto res = buf.dispatch(rows, h);
  probe.after_cached();
  if (int rc = check_rows(res, "cached dispatch")) return rc;

  for (const dispatch_handle* wrong : {&other, &twin}) {
    if (world == 1) break;
    const int culprit = world - 1;
    const dispatch_handle& along = rank == culprit ? *wrong : h;
    const std::vector<bf16> rows_back(static_cast<std::size_t>(along.num_recv_tokens) * hidden);
    try {
      buf.combine(combine_input<bf16>{rows_back, std::nullopt, {}, {}}, along);
      return fail_rank(rank, "a combine along handles of two dispatches was accepted");
    } catch (const error& e) {
      if (std::string(e.what()).find(
              "the handle's routing (fingerprint of its dispatch: number and counts)") ==
              std::string::npos ||
          (rank != culprit && e.peer() != culprit))
        return fail_rank(rank, e.what());
    }
  }

  // Each received row returned as is: a token comes back once per rank it reached.
  std::vector<bf16> y(static_cast<std::size_t>(res.num_recv_tokens) * hidden);
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = from_float<bf16>(to_float(res.recv_x[i]) * res.recv_x_scales[i / fp8_block]);
  const auto out = buf.combine(combine_input<bf16>{y, std::nullopt, {}, {}}, h);
  for (int t = 0; t < kept.tokens; ++t) {
    int reached = 0;
    for (int r = 0; r < world; ++r) reached += h.send_pos[t * world + r] >= 0 ? 1 : 0;
    for (std::size_t c = 0; c < hidden; ++c) {
      const float want = reached * to_float(all[rank].x[t * hidden + c]) *
                         all[rank].scales[t * nscales + c / fp8_block];
      if (std::fabs(to_float(out.x[t * hidden + c]) - want) > 0.02f * std::fabs(want) + 1e-3f)
        return fail_rank(rank, "combine after a cached dispatch");
    }
  }
  return check_rows(buf.dispatch_async(rows, h).get(), "queued cached dispatch");
}

}  // namespace epcomm::test
