// Runs one normal-mode case on `world` forked ranks over any transport:
// every rank dispatches, checks against the reference, combines and checks
// again, `iterations` times on one buffer with a new seed each time.
#pragma once

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/normal/buffer.hpp"
#include "epcomm/shm/transport.hpp"
#include "support/exit_codes.hpp"
#include "support/reference.hpp"

namespace epcomm::test {

// Which ranks write their tokens into dispatch_send_buffer, or their expert
// outputs into combine_send_buffer: over RMA transports they are then put
// from there without being staged; over peer-mapped ones the sources read
// combine's rows there.
enum class in_place { none, all, odd_ranks };

inline bool applies(in_place mode, int rank) {
  return mode == in_place::all || (mode == in_place::odd_ranks && rank % 2 == 1);
}

struct case_options {
  int iterations = 1;
  int worst_case_recv_tokens = 0;
  int expert_alignment = 1;
  in_place dispatch_in_place = in_place::none;
  in_place combine_in_place = in_place::none;
};

// How a rank names its transport in a failure message: the transport's own
// name() ("libfabric/tcp;ofi_rxm", "ucx/tcp") where it has one.
template <class Transport>
std::string transport_name(const Transport& t) {
  if constexpr (requires { t.name(); })
    return std::string(t.name());
  else
    return "shm";
}

// One dispatch and combine of Token's rows on `buf`, a buffer that serves
// Token (alone or among others), checked against the reference: 0, or 1
// after printing what differs.
template <token_type Token, class Buffer>
int check_round(Buffer& buf, int rank, const shape& s, const case_options& opt) {
  using out_t = combine_type_t<Token>;
  std::vector<rank_input<Token>> all;
  for (int r = 0; r < s.world; ++r) all.push_back(make_input<Token>(s, r));
  const auto& mine = all[rank];
  dispatch_input<Token> in{s.tokens,    s.hidden,      s.topk,           mine.x,
                           mine.scales, mine.topk_idx, mine.topk_weights};
  if (applies(opt.dispatch_in_place, rank)) {
    const auto at = buf.template dispatch_send_buffer<Token>(s.tokens, s.hidden);
    std::copy(mine.x.begin(), mine.x.end(), at.begin());
    in.x = at;
  }
  const auto res = buf.dispatch(in, {opt.worst_case_recv_tokens, opt.expert_alignment});
  const std::string what =
      transport_name(buf.transport()) + " " + describe(s, token_traits<Token>::name.data());
  if (opt.worst_case_recv_tokens > 0 &&
      res.recv_x.size() != static_cast<std::size_t>(opt.worst_case_recv_tokens) * s.hidden) {
    std::fprintf(stderr, "rank %d [%s]: result not padded to the bound\n", rank, what.c_str());
    return 1;
  }
  if (auto e = check_dispatch(s, rank, all, res, -1, opt.expert_alignment); !e.empty()) {
    std::fprintf(stderr, "rank %d [%s] dispatch: %s\n", rank, what.c_str(), e.c_str());
    return 1;
  }
  const auto y = expert_rows(res, s.hidden, rank);
  std::span<const out_t> rows = y;
  if (applies(opt.combine_in_place, rank)) {
    const auto at = buf.template combine_send_buffer<out_t>(res.handle);
    std::copy(y.begin(), y.end(), at.begin());
    rows = at;
  }
  const auto out =
      buf.combine(combine_input<out_t>{rows, res.recv_topk_weights, {}, {}}, res.handle);
  if (auto e = check_combine(s, mine, out); !e.empty()) {
    std::fprintf(stderr, "rank %d [%s] %s\n", rank, what.c_str(), e.c_str());
    return 1;
  }
  return 0;
}

template <class Transport, token_type Token>
int run_rank(local_bootstrap& boot, shape s, const case_options& opt) {
  buffer_config cfg;
  cfg.num_experts = s.experts;
  cfg.max_hidden = s.hidden;
  cfg.max_topk = s.topk;
  cfg.max_tokens_per_rank = s.tokens;
  buffer<Transport, Token> buf(boot, cfg);
  for (int it = 0; it < opt.iterations; ++it, ++s.seed)
    if (int bad = check_round<Token>(buf, boot.rank(), s, opt)) return bad;
  return 0;
}

template <class Transport, token_type Token>
bool run_case(const shape& s, case_options opt = {}) {
  const auto codes = launch_local(
      s.world, [&](local_bootstrap& b) { return run_rank<Transport, Token>(b, s, opt); });
  return all_ok(codes, describe(s, token_traits<Token>::name.data()));
}

// The shm suite's spelling, kept for tests that only ever run over shm.
template <token_type Token>
bool run_case(const shape& s, case_options opt = {}) {
  return run_case<shm::transport, Token>(s, opt);
}

}  // namespace epcomm::test
