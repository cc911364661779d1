// Normal mode under a byte budget (buffer_config::max_buffer_bytes,
// normal/window.hpp) on any transport: a buffer whose budget leaves a window
// of 3 rows per peer, beside one sized for whole calls, given the same
// inputs. Every call moves in many rounds, and its results must be the
// whole engine's byte for byte (and the reference's); the shared cases
// (asynchronous calls with a rejected one among them, a cached dispatch,
// the send buffers) must pass on the windowed buffer as they do on any.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/normal/buffer.hpp"
#include "support/async_case.hpp"
#include "support/cached_dispatch_case.hpp"
#include "support/case_config.hpp"
#include "support/exit_codes.hpp"
#include "support/reference.hpp"
#include "support/run_case.hpp"

namespace epcomm::test {

template <class T>
bool same_bytes(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// The same call on both buffers: dispatch (with x from dispatch_send_buffer
// on odd ranks), then combine of the reference expert rows with weights and
// a bias (y from combine_send_buffer on odd ranks); 0 when every array of
// the windowed buffer's results equals the whole one's and the reference.
template <token_type Token, class Windowed, class Whole>
int compare_call(Windowed& win, Whole& whole, int rank, const shape& s, int bound) {
  using Out = combine_type_t<Token>;
  std::vector<rank_input<Token>> all;
  for (int r = 0; r < s.world; ++r) all.push_back(make_input<Token>(s, r));
  const auto& mine = all[rank];
  const std::string what = describe(s, token_traits<Token>::name.data());
  auto dispatch_on = [&](auto& buf) {
    dispatch_input<Token> in{s.tokens,    s.hidden,      s.topk,           mine.x,
                             mine.scales, mine.topk_idx, mine.topk_weights};
    if (rank % 2 == 1) {
      const auto at = buf.template dispatch_send_buffer<Token>(s.tokens, s.hidden);
      std::copy(mine.x.begin(), mine.x.end(), at.begin());
      in.x = at;
    }
    return buf.dispatch(in, {bound, 1});
  };
  const auto a = dispatch_on(win);
  const auto b = dispatch_on(whole);
  int most = 0;
  for (int c : a.handle.count_matrix) most = std::max(most, c);
  if (most <= 2 * win.capacity().window_rows)
    return fail_rank(rank, what + ": no pair needs three rounds; the case tests nothing");
  if (a.num_recv_tokens != b.num_recv_tokens || a.handle.count_matrix != b.handle.count_matrix ||
      a.num_recv_tokens_per_expert != b.num_recv_tokens_per_expert ||
      !same_bytes(a.recv_x, b.recv_x) || !same_bytes(a.recv_x_scales, b.recv_x_scales) ||
      !same_bytes(a.recv_topk_idx, b.recv_topk_idx) ||
      !same_bytes(a.recv_topk_weights, b.recv_topk_weights) ||
      !same_bytes(a.recv_src_idx, b.recv_src_idx))
    return fail_rank(rank, what + ": the windowed dispatch differs from the whole one");
  if (auto e = check_dispatch(s, rank, all, a); !e.empty())
    return fail_rank(rank, what + " dispatch: " + e);

  const std::vector<Out> y = expert_rows(a, s.hidden, rank);
  std::vector<Out> bias(static_cast<std::size_t>(s.tokens) * s.hidden);
  for (std::size_t i = 0; i < bias.size(); ++i)
    bias[i] = Out(static_cast<float>(static_cast<int>(i % 7) - 3) / 8.0f);
  auto combine_on = [&](auto& buf, const dispatch_handle& h) {
    std::span<const Out> rows(y.data(), static_cast<std::size_t>(h.num_recv_tokens) * s.hidden);
    if (rank % 2 == 1) {
      const auto at = buf.template combine_send_buffer<Out>(h);
      std::copy(rows.begin(), rows.end(), at.begin());
      rows = at;
    }
    const std::span<const float> w(a.recv_topk_weights.data(),
                                   static_cast<std::size_t>(h.num_recv_tokens) * s.topk);
    return buf.combine(combine_input<Out>{rows, w, bias, {}}, h);
  };
  const auto ca = combine_on(win, a.handle);
  const auto cb = combine_on(whole, b.handle);
  if (!same_bytes<Out>(ca.x, cb.x) || !same_bytes<float>(ca.topk_weights, cb.topk_weights))
    return fail_rank(rank, what + ": the windowed combine differs from the whole one");
  return 0;
}

// On every rank of a group of 3 forked ranks.
template <class Transport>
int check_byte_budget(local_bootstrap& boot) {
  using windowed_buffer = buffer<Transport, bf16, fp8_e4m3, float>;
  const int rank = boot.rank();
  const buffer_config whole_cfg = case_config(3, 256);
  windowed_buffer whole(boot, whole_cfg);
  // The budget of a window of 3 rows per peer, as the engine plans it.
  buffer_config cfg = whole_cfg;
  cfg.max_buffer_bytes =
      wire::budget_for_window(whole.capacity(), 3, !peer_mapped_transport<Transport>);
  windowed_buffer win(boot, cfg);
  if (win.capacity().window_rows != 3 ||
      win.transport().local_buffer().size() > cfg.max_buffer_bytes ||
      2 * win.transport().local_buffer().size() > whole.transport().local_buffer().size())
    return fail_rank(rank, "a budget of 3 rows per peer gave a window of " +
                               std::to_string(win.capacity().window_rows) + " rows in " +
                               std::to_string(win.transport().local_buffer().size()) +
                               " bytes (whole calls: " +
                               std::to_string(whole.transport().local_buffer().size()) + ")");
  int bad = 0;  // a failed call still takes part in the next: the ranks stay in step
  bad |= compare_call<fp8_e4m3>(win, whole, rank, {3, 40, 256, 4, 12, routing::random, 91}, 0);
  bad |= compare_call<bf16>(win, whole, rank, {3, 40, 256, 4, 12, routing::uneven, 92}, 3 * 40);
  bad |= compare_call<float>(win, whole, rank, {3, 33, 200, 3, 12, routing::one_expert, 93}, 0);
  bad |= compare_call<bf16>(win, whole, rank, {3, 40, 128, 4, 12, routing::duplicate_rank, 94}, 0);
  if (bad) return bad;
  if (int e = check_cached_dispatch(win, rank, 3)) return e;
  return check_async_calls(win, rank, 3);
}

}  // namespace epcomm::test
