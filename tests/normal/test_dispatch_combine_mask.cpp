// Normal mode with mask_lost_ranks over shared memory: a rank's process exits
// before its notify, after it (its rows never sent) or in combine (its
// expert outputs never returned), on 3 and 4 ranks and for every token type,
// and the survivors' calls go on without it,
// every result checked against the reference with that rank's experts
// removed, its contributions counted. A slow rank is not masked. (Without the
// option the same exits fail every survivor: the fault matrix.) Under a byte
// budget of 3 rows per peer every call moves in several rounds, and a rank
// lost in dispatch or combine exits after the first of them.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/host/fault_injection.hpp"
#include "epcomm/normal/buffer.hpp"
#include "epcomm/normal/capacity_agreement.hpp"
#include "epcomm/normal/window.hpp"
#include "epcomm/shm/transport.hpp"
#include "support/exit_codes.hpp"
#include "support/reference.hpp"
#include "support/run_case.hpp"

namespace {

using namespace epcomm;
using namespace epcomm::test;

constexpr int lost = 1;
constexpr int calls = 4;
constexpr int faulty_call = 1;  // the fault fires in the second call (hit=2)

shape mask_shape(int world, std::uint64_t seed) {
  return {.world = world,
          .tokens = 24,
          .hidden = 256,
          .topk = 2,
          .experts = 2 * world,
          .route = routing::random,
          .seed = seed};
}

buffer_config masked_config(const shape& s, std::chrono::milliseconds timeout) {
  buffer_config cfg;
  cfg.num_experts = s.experts;
  cfg.max_hidden = s.hidden;
  cfg.max_topk = s.topk;
  cfg.max_tokens_per_rank = s.tokens;
  cfg.timeout = timeout;
  cfg.mask_lost_ranks = true;
  return cfg;
}

constexpr int window_rows = 3;

// masked_config's buffer for Token held to a window of window_rows rows per
// peer (the test checks the window it got).
template <token_type Token>
buffer_config windowed_config(const shape& s, std::chrono::milliseconds timeout) {
  buffer_config cfg = masked_config(s, timeout);
  cfg.max_buffer_bytes =
      wire::budget_for_window(whole_capacity<Token>(cfg, s.world), window_rows, false);
  return cfg;
}

// The inputs as survivors see them once rank `gone` is lost: it sends
// nothing, and every id of one of its experts reads -1. Returns how many
// (token, expert rank) rows of `rank` that removes: what combine masks.
template <token_type Token>
std::uint64_t without_rank(std::vector<rank_input<Token>>& all, const shape& s, int gone,
                           int rank) {
  const int per_rank = s.experts / s.world;
  std::ranges::fill(all[gone].topk_idx, -1);
  std::uint64_t masked = 0;
  for (std::size_t r = 0; r < all.size(); ++r)
    for (int t = 0; t < s.tokens; ++t) {
      bool hit = false;
      for (int j = 0; j < s.topk; ++j) {
        auto& e = all[r].topk_idx[static_cast<std::size_t>(t) * s.topk + j];
        if (e >= 0 && e / per_rank == gone) {
          e = -1;
          hit = true;
        }
      }
      if (hit && static_cast<int>(r) == rank) ++masked;
    }
  return masked;
}

// What the survivors' results of call `call` must be when rank `lost` exits
// at `at` of call `faulty_call`.
struct expectation {
  bool dispatch_masked;  // rank `lost` is not a member: it sent nothing
  bool rows_padded;      // it was a member but its rows never came
  bool combine_masked;   // its expert outputs are missing
};

expectation expect(fault::point at, int call) {
  if (call < faulty_call) return {false, false, false};
  if (call > faulty_call) return {true, false, true};
  switch (at) {
    case fault::point::before_notify:
      return {true, false, true};
    case fault::point::mid_dispatch:
      return {false, true, true};
    default:
      return {false, false, true};
  }
}

enum class budget { none, window };

template <token_type Token>
int run_rank(local_bootstrap& boot, fault::point at, in_place mode, budget b) {
  using out_t = combine_type_t<Token>;
  const int rank = boot.rank();
  const shape first = mask_shape(boot.world_size(), 4000);
  const auto timeout = std::chrono::seconds(20);
  buffer<shm::transport, Token> buf(boot, b == budget::window
                                              ? windowed_config<Token>(first, timeout)
                                              : masked_config(first, timeout));
  if (b == budget::window && buf.capacity().window_rows != window_rows)
    return fail_rank(rank, "the budget left a window of " +
                               std::to_string(buf.capacity().window_rows) + " rows, not " +
                               std::to_string(window_rows));
  std::uint64_t masked_total = 0;
  for (int call = 0; call < calls; ++call) {
    const shape s = mask_shape(first.world, first.seed + call);
    std::vector<rank_input<Token>> all;
    for (int r = 0; r < s.world; ++r) all.push_back(make_input<Token>(s, r));
    const auto& mine = all[rank];
    const expectation ex = expect(at, call);
    auto dispatch_ref = all;
    auto combine_ref = all;
    if (ex.dispatch_masked) without_rank(dispatch_ref, s, lost, rank);
    const std::uint64_t masked = ex.combine_masked ? without_rank(combine_ref, s, lost, rank) : 0;
    const std::uint64_t before = buf.stats().masked_contributions;

    const auto res = buf.dispatch(
        {s.tokens, s.hidden, s.topk, mine.x, mine.scales, mine.topk_idx, mine.topk_weights});
    const std::string what =
        "call " + std::to_string(call) + " " + describe(s, token_traits<Token>::name.data());
    if (auto e = check_dispatch(s, rank, dispatch_ref, res, ex.rows_padded ? lost : -1); !e.empty())
      return fail_rank(rank, what + " dispatch: " + e);
    // In windows, the lost rank's exit must fall between rounds.
    if (b == budget::window && call <= faulty_call &&
        std::ranges::max(res.handle.count_matrix) <= 2 * window_rows)
      return fail_rank(rank, what + ": no pair needs three rounds; the case tests nothing");
    const auto y = expert_rows(res, s.hidden, rank);
    std::span<const out_t> rows = y;
    if (applies(mode, rank)) {
      const auto there = buf.combine_send_buffer(res.handle);
      std::ranges::copy(y, there.begin());
      rows = there;
    }
    const auto out = buf.combine({rows, res.recv_topk_weights, {}, {}}, res.handle);
    if (auto e = check_combine(s, combine_ref[rank], out); !e.empty())
      return fail_rank(rank, what + " combine: " + e);
    const std::uint64_t counted = buf.stats().masked_contributions - before;
    if (counted != masked)
      return fail_rank(rank, what + ": " + std::to_string(counted) + " contributions masked, " +
                                 std::to_string(masked) + " expected");
    masked_total += masked;
  }
  // Bad input after the loss is still refused on every survivor, and the
  // buffer serves the next call (the rejection's round skips the lost rank).
  const shape s = mask_shape(first.world, first.seed + calls);
  auto in = make_input<Token>(s, rank);
  if (rank == 0) in.topk_idx[1] = s.experts;
  try {
    buf.dispatch({s.tokens, s.hidden, s.topk, in.x, in.scales, in.topk_idx, in.topk_weights});
    return fail_rank(rank, "a dispatch with an expert id out of range went through");
  } catch (const error& e) {
    if (std::string(e.what()).find("invalid input") == std::string::npos)
      return fail_rank(rank, std::string("unexpected error: ") + e.what());
  }
  if (rank == 0) in.topk_idx[1] = 0;
  std::vector<rank_input<Token>> all;
  for (int r = 0; r < s.world; ++r) all.push_back(make_input<Token>(s, r));
  all[0].topk_idx[1] = 0;
  without_rank(all, s, lost, rank);
  const auto res =
      buf.dispatch({s.tokens, s.hidden, s.topk, in.x, in.scales, in.topk_idx, in.topk_weights});
  if (auto e = check_dispatch(s, rank, all, res); !e.empty())
    return fail_rank(rank, "dispatch after a rejected one: " + e);
  if (buf.lost_ranks() != std::vector<int>{lost})
    return fail_rank(rank, "lost_ranks() does not name exactly rank 1");
  // Random routing reaches rank 1's experts: otherwise nothing above was
  // masked and the checks prove nothing.
  return masked_total > 0 ? 0 : fail_rank(rank, "nothing was masked");
}

template <token_type Token = bf16>
void run_cell(fault::point at, in_place mode, int world = 3, budget b = budget::none) {
  const std::string spec = "rank=" + std::to_string(lost) + ",point=" + fault::name(at) +
                           ",action=exit,hit=" + std::to_string(faulty_call + 1);
  CAPTURE(spec);
  CAPTURE(static_cast<int>(mode));
  CAPTURE(world);
  CAPTURE(token_traits<Token>::name);
  CAPTURE(static_cast<int>(b));
  const auto start = steady::now();
  const auto codes = launch_local(world, [&](local_bootstrap& boot) {
    setenv("EPCOMM_FAULT", spec.c_str(), 1);
    return run_rank<Token>(boot, at, mode, b);
  });
  CHECK(codes[lost] == fault::exit_code);
  for (int r = 0; r < world; ++r)
    if (r != lost) CHECK_MESSAGE(codes[r] == 0, "survivor ", r, " exit code ", codes[r]);
  // Every wait's deadline is 20 s: the loss was seen as the process's exit.
  CHECK(steady::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a rank lost before its notify is left out of the call") {
  run_cell(fault::point::before_notify, in_place::none);
  run_cell(fault::point::before_notify, in_place::all);
}

TEST_CASE("a rank lost after its notify: its rows become padding") {
  run_cell(fault::point::mid_dispatch, in_place::none);
  run_cell(fault::point::mid_dispatch, in_place::all);
}

TEST_CASE("a rank lost in combine: its expert outputs are masked") {
  run_cell(fault::point::mid_combine, in_place::none);
  run_cell(fault::point::mid_combine, in_place::odd_ranks);
}

TEST_CASE("four ranks, fp8 and fp32 tokens") {
  run_cell<fp8_e4m3>(fault::point::mid_dispatch, in_place::odd_ranks, 4);
  run_cell<fp8_e4m3>(fault::point::mid_combine, in_place::all, 4);
  run_cell<float>(fault::point::before_notify, in_place::none, 4);
}

TEST_CASE("under a byte budget, a rank lost between rounds is masked as in a whole call") {
  run_cell(fault::point::before_notify, in_place::none, 3, budget::window);
  run_cell(fault::point::mid_dispatch, in_place::none, 3, budget::window);
  run_cell(fault::point::mid_combine, in_place::odd_ranks, 3, budget::window);
  run_cell<fp8_e4m3>(fault::point::mid_dispatch, in_place::all, 4, budget::window);
  run_cell<float>(fault::point::mid_combine, in_place::none, 4, budget::window);
}

TEST_CASE("a slow rank is not masked: its deadline still fails the call") {
  // It is alive and could still write into this rank's buffer later.
  const shape two = mask_shape(2, 4100);
  const auto codes = launch_local(2, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    buffer<shm::transport, bf16> buf(boot, masked_config(two, std::chrono::milliseconds(300)));
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return 0;
    }
    const auto in = make_input<bf16>(two, rank);
    try {
      buf.dispatch(
          {two.tokens, two.hidden, two.topk, in.x, in.scales, in.topk_idx, in.topk_weights});
    } catch (const error& e) {
      const std::string text = e.what();
      if (e.peer() != 1 || text.find("deadline expired") == std::string::npos)
        return fail_rank(rank, "unexpected error: " + text);
      return buf.lost_ranks().empty() ? 0 : fail_rank(rank, "a slow rank was marked lost");
    }
    return fail_rank(rank, "dispatch did not fail");
  });
  CHECK(all_ok(codes, "a slow rank under mask_lost_ranks"));
}

}  // namespace
