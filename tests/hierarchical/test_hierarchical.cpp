// Hierarchical normal mode (epcomm/hierarchical/buffer.hpp) on one host: ranks form
// virtual nodes (local_launch_options::ranks_per_node), shm serves each node,
// and the inter-node transport is the one under test: shm (no network),
// libfabric over tcp;ofi_rxm, UCX over tcp, both on loopback. The file builds
// one executable per inter transport (EPCOMM_TEST_LIBFABRIC, EPCOMM_TEST_UCX,
// else shm), so that no run loads a fabric library it does not test (UCX's
// memory hooks break ThreadSanitizer's thread exit in a libfabric run).
//
// Every call is checked against the flat buffer's reference (exact dispatch,
// fp32-accumulated combine) and every byte each transport moved is compared
// with the count the routing implies: a token crosses the fabric exactly
// once per other node it reaches, its partial sum once back.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "epcomm/hierarchical/buffer.hpp"
#include "support/async_case.hpp"
#include "support/cached_dispatch_case.hpp"
#include "support/run_case.hpp"
#if defined(EPCOMM_TEST_LIBFABRIC)
#include "epcomm/libfabric/transport.hpp"
#elif defined(EPCOMM_TEST_UCX)
#include "epcomm/ucx/transport.hpp"
#endif

using namespace epcomm;
using test::routing;
using test::shape;

namespace {

template <class Inter, class... Tokens>
using hier = hierarchical_buffer<shm::transport, Inter, Tokens...>;

// The traffic the routing implies for one rank, computed from every rank's
// regenerated routing with plain loops (nothing shared with the library).
struct expected_traffic {
  std::vector<std::uint64_t> inter_payload, inter_control, inter_transfers;  // [N]
  std::vector<std::uint64_t> intra_payload, intra_control;                   // [L]
};

struct grouping {
  int world, per_node;
  int nodes() const { return world / per_node; }
  int node(int r) const { return r / per_node; }
  int local(int r) const { return r % per_node; }
};

template <class Token>
class routing_facts {
 public:
  routing_facts(const shape& s, const grouping& g, const std::vector<test::rank_input<Token>>& all)
      : s_(s), g_(g), all_(all) {}

  bool reaches_rank(int src, int t, int d) const {
    const int per_rank = s_.experts / s_.world;
    for (int j = 0; j < s_.topk; ++j) {
      const auto e = all_[src].topk_idx[static_cast<std::size_t>(t) * s_.topk + j];
      if (e >= 0 && e / per_rank == d) return true;
    }
    return false;
  }
  bool reaches_node(int src, int t, int m) const {
    for (int i = 0; i < g_.per_node; ++i)
      if (reaches_rank(src, t, m * g_.per_node + i)) return true;
    return false;
  }
  std::uint64_t tokens_to_node(int src, int m) const {
    std::uint64_t n = 0;
    for (int t = 0; t < s_.tokens; ++t) n += reaches_node(src, t, m);
    return n;
  }
  std::uint64_t tokens_to_rank(int src, int d) const {
    std::uint64_t n = 0;
    for (int t = 0; t < s_.tokens; ++t) n += reaches_rank(src, t, d);
    return n;
  }
  // Tokens x other destination ranks: what a flat engine would send across nodes.
  std::uint64_t flat_remote_rows(int src) const {
    std::uint64_t n = 0;
    for (int d = 0; d < s_.world; ++d)
      if (g_.node(d) != g_.node(src)) n += tokens_to_rank(src, d);
    return n;
  }

  std::uint64_t token_row_bytes() const {
    const std::uint64_t h = s_.hidden, k = s_.topk;
    return h * sizeof(Token) + (token_traits<Token>::has_scales ? h / 128 * 4 : 0) + k * 8 + k * 4 +
           4;
  }

  expected_traffic dispatch(int me) const {
    const int n = g_.nodes(), l = g_.local(me);
    const std::uint64_t record = sizeof(wire::notify_header) + 4 * (s_.world + n + s_.experts);
    const std::uint64_t arrays = token_traits<Token>::has_scales ? 5 : 4;
    expected_traffic e{zeros(n), zeros(n), zeros(n), zeros(g_.per_node), zeros(g_.per_node)};
    for (int m = 0; m < n; ++m) {
      if (m == g_.node(me)) continue;
      const std::uint64_t rows = tokens_to_node(me, m);
      e.inter_payload[m] = rows * token_row_bytes();
      e.inter_control[m] = record;
      e.inter_transfers[m] = 1 + (rows > 0 ? arrays : 0);
    }
    for (int i = 0; i < g_.per_node; ++i) {
      if (i == l) continue;
      const int d = g_.node(me) * g_.per_node + i;
      for (int m = 0; m < n; ++m) e.intra_payload[i] += tokens_to_rank(m * g_.per_node + l, d);
      e.intra_payload[i] *= token_row_bytes();
      e.intra_control[i] = n * record;
    }
    return e;
  }

  expected_traffic combine(int me) const {
    using out = combine_type_t<Token>;
    const int n = g_.nodes(), l = g_.local(me);
    const std::uint64_t h = s_.hidden, k = s_.topk;
    const std::uint64_t words = (g_.per_node + 63) / 64;
    const std::uint64_t status = (sizeof(wire::combine_header) + 63) / 64 * 64;
    expected_traffic e{zeros(n), zeros(n), zeros(n), zeros(g_.per_node), zeros(g_.per_node)};
    for (int m = 0; m < n; ++m) {
      if (m == g_.node(me)) continue;
      // As forwarder: one fp32 sum (channels and weights) per token of that
      // node's rail rank that reached this node.
      const std::uint64_t sums = tokens_to_node(m * g_.per_node + l, g_.node(me));
      e.inter_payload[m] = sums * (h + k) * 4;
      e.inter_control[m] = status + 8 * (1 + words * tokens_to_node(me, m));
      e.inter_transfers[m] = 1 + (sums > 0 ? 2 : 0);
    }
    for (int i = 0; i < g_.per_node; ++i) {
      if (i == l) continue;
      const int d = g_.node(me) * g_.per_node + i;
      for (int m = 0; m < n; ++m) e.intra_payload[i] += tokens_to_rank(m * g_.per_node + l, d);
      e.intra_payload[i] *= h * sizeof(out) + k * 4;
      e.intra_control[i] = n * sizeof(wire::combine_header);
    }
    return e;
  }

 private:
  static std::vector<std::uint64_t> zeros(int n) { return std::vector<std::uint64_t>(n, 0); }
  shape s_;
  grouping g_;
  const std::vector<test::rank_input<Token>>& all_;
};

std::vector<std::uint64_t> minus(const std::vector<std::uint64_t>& a,
                                 const std::vector<std::uint64_t>& b) {
  std::vector<std::uint64_t> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

std::string show(const std::vector<std::uint64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s + "]";
}

// Compares what a call moved (after - before) with the expectation; returns
// a description of the first difference.
std::string check_traffic(const hierarchical_traffic& before, const hierarchical_traffic& after,
                          const expected_traffic& e) {
  const struct {
    const char* what;
    std::vector<std::uint64_t> got, want;
  } rows[] = {
      {"inter payload bytes by node", minus(after.inter.payload_bytes, before.inter.payload_bytes),
       e.inter_payload},
      {"inter control bytes by node", minus(after.inter.control_bytes, before.inter.control_bytes),
       e.inter_control},
      {"intra payload bytes by local rank",
       minus(after.intra.payload_bytes, before.intra.payload_bytes), e.intra_payload},
      {"intra control bytes by local rank",
       minus(after.intra.control_bytes, before.intra.control_bytes), e.intra_control},
  };
  for (const auto& r : rows)
    if (r.got != r.want)
      return std::string(r.what) + ": moved " + show(r.got) + ", routing implies " + show(r.want);
  const auto transfers = minus(after.inter.transfers, before.inter.transfers);
  if (transfers != e.inter_transfers)
    return "inter transfers by node: " + show(transfers) + ", expected " + show(e.inter_transfers);
  return {};
}

// Token's calls on one rank: a dispatch/combine pair per routing in
// `routes`, one after the other on `buf`, with a new seed each (every second
// dispatch with a worst-case bound, so its results are padded); each call is
// checked against the reference and against the traffic the routing implies.
template <class Token, class Buffer>
int run_calls(Buffer& buf, int rank, shape s, const grouping& g,
              const std::vector<routing>& routes) {
  for (std::size_t call = 0; call < routes.size(); ++call) {
    s.route = routes[call];
    ++s.seed;
    const int bound = call % 2 == 1 ? s.world * s.tokens : 0;
    const int alignment = call % 3 == 2 ? 16 : 1;  // expert_alignment
    const std::string what = test::transport_name(buf.inter_transport()) + " inter, " +
                             std::to_string(g.nodes()) + " nodes of " + std::to_string(g.per_node) +
                             ", " + test::describe(s, token_traits<Token>::name.data());
    auto fail = [&](const char* phase, const std::string& e) {
      std::fprintf(stderr, "rank %d [%s] %s: %s\n", rank, what.c_str(), phase, e.c_str());
      return 1;
    };
    std::vector<test::rank_input<Token>> all;
    for (int r = 0; r < s.world; ++r) all.push_back(test::make_input<Token>(s, r));
    const routing_facts<Token> facts(s, g, all);
    const auto& mine = all[rank];

    const auto t0 = buf.traffic();
    const auto res =
        buf.dispatch(dispatch_input<Token>{s.tokens, s.hidden, s.topk, mine.x, mine.scales,
                                           mine.topk_idx, mine.topk_weights},
                     {bound, alignment});
    const auto t1 = buf.traffic();
    if (auto e = test::check_dispatch(s, rank, all, res, -1, alignment); !e.empty())
      return fail("dispatch", e);
    if (bound > 0 && (res.recv_x.size() != static_cast<std::size_t>(bound) * s.hidden ||
                      res.recv_src_idx.size() != static_cast<std::size_t>(bound) ||
                      (res.num_recv_tokens < bound && res.recv_src_idx[bound - 1] != -1)))
      return fail("dispatch", "result not padded to the worst-case bound");
    if (auto e = check_traffic(t0, t1, facts.dispatch(rank)); !e.empty())
      return fail("dispatch traffic", e);
    // Once per node, never once per rank: with several ranks of a node
    // reached, the flat path would have moved strictly more.
    std::uint64_t moved = 0;
    for (auto b : minus(t1.inter.payload_bytes, t0.inter.payload_bytes)) moved += b;
    if (moved > facts.flat_remote_rows(rank) * facts.token_row_bytes())
      return fail("dispatch traffic", "more fabric bytes than the flat path would move");

    const auto y = test::expert_rows(res, s.hidden, rank);
    const auto out = buf.combine(
        combine_input<combine_type_t<Token>>{y, res.recv_topk_weights, {}, {}}, res.handle);
    const auto t2 = buf.traffic();
    if (auto e = test::check_combine(s, mine, out); !e.empty()) return fail("combine", e);
    if (auto e = check_traffic(t1, t2, facts.combine(rank)); !e.empty())
      return fail("combine traffic", e);
  }
  return 0;
}

// One rank: one buffer serving every type of Tokens, each type's calls in
// turn (run_calls), from the same seed.
template <class Inter, class... Tokens>
int run_rank(local_bootstrap& boot, const shape& s, int per_node,
             const std::vector<routing>& routes) {
  const int rank = boot.rank();
  const grouping g{s.world, per_node};
  buffer_config cfg;
  cfg.num_experts = s.experts;
  cfg.max_hidden = s.hidden;
  cfg.max_topk = s.topk;
  cfg.max_tokens_per_rank = s.tokens;
  hierarchical_buffer<shm::transport, Inter, Tokens...> buf(boot, cfg);
  if (buf.num_nodes() != g.nodes() || buf.ranks_per_node() != per_node) {
    std::fprintf(stderr, "rank %d: buffer sees %d nodes of %d\n", rank, buf.num_nodes(),
                 buf.ranks_per_node());
    return 1;
  }
  int rc = 0;  // every type's calls run, so that the ranks stay in step
  ((rc |= run_calls<Tokens>(buf, rank, s, g, routes)), ...);
  return rc;
}

// Runs f(boot) on `world` local ranks grouped into nodes of `per_node`;
// returns their exit codes.
template <class F>
std::vector<int> launch_nodes(int world, int per_node, F&& f) {
  local_launch_options opt;
  opt.ranks_per_node = per_node;
  return launch_local(world, std::forward<F>(f), opt);
}

template <class Inter, class... Tokens>
bool run_grouped(const shape& s, int per_node, const std::vector<routing>& routes) {
  const auto codes = launch_nodes(s.world, per_node, [&](local_bootstrap& boot) {
    return run_rank<Inter, Tokens...>(boot, s, per_node, routes);
  });
  return test::all_ok(codes, std::to_string(s.world / per_node) + " nodes of " +
                                 std::to_string(per_node) + ": " +
                                 test::describe(s, "each listed token type, one buffer") + ", " +
                                 std::to_string(routes.size()) + " routings from the seed up");
}

// Invalid input on one rank stops every rank before any payload moves (no
// payload byte on either transport), names the culprit, and leaves the buffer
// usable; then a bad combine does the same, and a combine of y in another
// type on one rank (the buffer serves bf16 and fp32).
template <class Inter>
bool bad_input_stops_everyone() {
  const shape s{4, 24, 256, 4, 16, routing::random, 3};
  constexpr int culprit = 3;
  const auto codes = launch_nodes(s.world, 2, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    auto fail = [&](const std::string& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.c_str());
      return 1;
    };
    hier<Inter, bf16, float> buf(
        boot, {s.experts, s.hidden, s.topk, s.tokens, 0, std::chrono::milliseconds(20'000)});
    std::vector<test::rank_input<bf16>> all;
    for (int r = 0; r < s.world; ++r) all.push_back(test::make_input<bf16>(s, r));
    auto idx = all[rank].topk_idx;
    if (rank == culprit) idx[5] = s.experts;
    try {
      buf.dispatch({s.tokens, s.hidden, s.topk, all[rank].x, {}, idx, all[rank].topk_weights});
      return fail("bad expert id accepted");
    } catch (const error& e) {
      const std::string text = e.what();
      if (text.find("topk_idx[1][1] = 16 is outside [-1, 16)") == std::string::npos ||
          (rank != culprit && e.peer() != culprit))
        return fail("unexpected error: " + text);
    }
    const auto after = buf.traffic();
    for (const auto* v : {&after.inter.payload_bytes, &after.intra.payload_bytes})
      for (auto b : *v)
        if (b != 0) return fail("payload moved before the call was rejected");

    const auto& mine = all[rank];
    const auto res =
        buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
    if (auto e = test::check_dispatch(s, rank, all, res); !e.empty())
      return fail("after the rejected call: " + e);
    const auto y = test::expert_rows(res, s.hidden, rank);
    std::vector<bf16> short_y(y.begin(), y.end());
    if (rank == 0) short_y.resize(short_y.size() + s.hidden / 2);  // not whole rows
    try {
      buf.combine({short_y, res.recv_topk_weights, {}, {}}, res.handle);
      return fail("a y of partial rows was accepted");
    } catch (const error& e) {
      if (std::string(e.what()).find("y holds") == std::string::npos ||
          (rank != 0 && e.peer() != 0))
        return fail(std::string("unexpected combine error: ") + e.what());
    }
    try {
      if (rank == 1) {
        std::vector<float> y32(y.size());
        std::transform(y.begin(), y.end(), y32.begin(), [](bf16 v) { return to_float(v); });
        buf.combine(combine_input<float>{y32, res.recv_topk_weights, {}, {}}, res.handle);
      } else {
        buf.combine({y, res.recv_topk_weights, {}, {}}, res.handle);
      }
      return fail("y of two element types was accepted");
    } catch (const error& e) {
      if (std::string(e.what()).find(
              "y's element type fp32 on that rank disagrees with bf16 on rank 0") ==
              std::string::npos ||
          (rank != 1 && e.peer() != 1))
        return fail(std::string("unexpected combine error: ") + e.what());
    }
    const auto out = buf.combine({y, res.recv_topk_weights, {}, {}}, res.handle);
    if (auto e = test::check_combine(s, mine, out); !e.empty())
      return fail("combine after the rejected one: " + e);
    return 0;
  });
  return test::all_ok(codes, "bad input over 2 nodes of 2");
}

// Masking a lost rank is the flat engine's over shm only: asking the
// hierarchical buffer for it fails construction on every rank rather than
// being ignored.
template <class Inter>
bool masking_is_refused() {
  const auto codes = launch_nodes(4, 2, [](local_bootstrap& boot) {
    buffer_config cfg{8, 128, 2, 8, 0, std::chrono::milliseconds(20'000)};
    cfg.mask_lost_ranks = true;
    try {
      hier<Inter, bf16> buf(boot, cfg);
      return test::fail_rank(boot.rank(), "mask_lost_ranks was accepted");
    } catch (const error& e) {
      return std::string(e.what()).find("invalid config: mask_lost_ranks needs") !=
                     std::string::npos
                 ? 0
                 : test::fail_rank(boot.rank(), e.what());
    }
  });
  return test::all_ok(codes, "mask_lost_ranks over 2 nodes of 2");
}

// A rank that vanishes mid-dispatch makes every survivor fail with an
// epcomm::error well before the deadline. Survivors that notice the loss
// themselves name the victim; the others may learn it from a peer that gave
// up first, and name that peer (a transport's abort names a culprit only
// within its group). At least one survivor must name the victim. A first,
// complete call brings the ranks into step, so that the clock measures the
// failure, not bring-up.
template <class Inter>
bool lost_rank_fails_survivors_fast() {
  const shape s{4, 16, 128, 2, 8, routing::random, 9};
  constexpr int victim = 1;
  constexpr auto timeout = std::chrono::milliseconds(60'000);
  constexpr auto fast = std::chrono::milliseconds(20'000);
  // Exit codes of survivors: failed fast naming the victim, or naming a peer.
  constexpr int named_victim = 0, named_peer = 3;
  setenv("EPCOMM_FAULT", "rank=1,point=mid_dispatch,action=exit,hit=2", 1);
  const auto codes = launch_nodes(s.world, 2, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    hier<Inter, bf16> buf(boot, {s.experts, s.hidden, s.topk, s.tokens, 0, timeout});
    const auto in = test::make_input<bf16>(s, rank);
    const dispatch_input<bf16> call{s.tokens, s.hidden,    s.topk,         in.x,
                                    {},       in.topk_idx, in.topk_weights};
    const auto first = buf.dispatch(call);
    const auto y = test::expert_rows(first, s.hidden, rank);
    buf.combine({y, first.recv_topk_weights, {}, {}}, first.handle);
    const auto start = steady::now();
    try {
      buf.dispatch(call);
    } catch (const error& e) {
      const auto took =
          std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - start);
      if (took > fast || e.peer() == no_peer || e.peer() == rank) {
        std::fprintf(stderr, "rank %d: error after %lld ms: %s\n", rank,
                     static_cast<long long>(took.count()), e.what());
        return 2;
      }
      return e.peer() == victim ? named_victim : named_peer;
    }
    std::fprintf(stderr, "rank %d: dispatch survived a lost rank\n", rank);
    return 1;
  });
  unsetenv("EPCOMM_FAULT");
  bool ok = codes[victim] == fault::exit_code;
  bool someone_named_it = false;
  for (int r = 0; r < s.world; ++r) {
    if (r == victim) continue;
    ok = ok && (codes[r] == named_victim || codes[r] == named_peer);
    someone_named_it = someone_named_it || codes[r] == named_victim;
  }
  if (!ok || !someone_named_it) test::all_ok(codes, "lost rank over 2 nodes of 2");
  return ok && someone_named_it;
}

// A dispatch from a cached handle over `nodes` nodes of 2 (check_cached_dispatch),
// and what it moves across nodes: the same rows as the dispatch that made the
// handle (a token once per other node it reaches), each without its top-k
// ids and weights but with the mask of the node's ranks it reaches. Then one
// rank's handle of another routing fails the call on every rank.
template <class Inter>
bool cached_dispatch_across_nodes(int nodes) {
  constexpr int per_node = 2;
  const int world = nodes * per_node;
  const auto codes = launch_nodes(world, per_node, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    hier<Inter, fp8_e4m3> buf(boot, test::case_config(world, 256));
    struct traffic_probe {
      hier<Inter, fp8_e4m3>& buf;
      std::vector<hierarchical_traffic> seen;
      void before_first() { seen.push_back(buf.traffic()); }
      void after_first() { seen.push_back(buf.traffic()); }
      void before_cached() { seen.push_back(buf.traffic()); }
      void after_cached() { seen.push_back(buf.traffic()); }
    } probe{buf, {}};
    if (int rc = test::check_cached_dispatch(buf, rank, world, probe)) return rc;
    const auto first = minus(probe.seen[1].inter.payload_bytes, probe.seen[0].inter.payload_bytes);
    const auto cached = minus(probe.seen[3].inter.payload_bytes, probe.seen[2].inter.payload_bytes);
    // fp8 rows of hidden 256 with 2 scales and a source index; top-4 ids
    // and weights in the dispatch, one mask word in the cached one.
    const std::uint64_t with_topk = 256 + 2 * 4 + 4 * (8 + 4) + 4, with_mask = 256 + 2 * 4 + 8 + 4;
    for (int m = 0; m < nodes; ++m)
      if (first[m] % with_topk != 0 || cached[m] != first[m] / with_topk * with_mask)
        return test::fail_rank(rank, "cached dispatch moved " + std::to_string(cached[m]) +
                                         " bytes to node " + std::to_string(m) +
                                         ", its handle's dispatch " + std::to_string(first[m]));
    // The last rank passes another dispatch's handle: every rank fails
    // naming it before any payload moves, and the buffer goes on.
    const test::shape s{world, 30, 256, 4, 4 * world, routing::random, 21u};
    const test::shape t{world, 30, 256, 4, 4 * world, routing::uneven, 22u};
    const auto a = test::make_input<fp8_e4m3>(s, rank);
    const auto b = test::make_input<fp8_e4m3>(t, rank);
    const dispatch_handle ha =
        buf.dispatch(dispatch_input<fp8_e4m3>{s.tokens, s.hidden, s.topk, a.x, a.scales, a.topk_idx,
                                              a.topk_weights})
            .handle;
    const dispatch_handle hb =
        buf.dispatch(dispatch_input<fp8_e4m3>{t.tokens, t.hidden, t.topk, b.x, b.scales, b.topk_idx,
                                              b.topk_weights})
            .handle;
    const int culprit = world - 1;
    const auto before = buf.traffic();
    try {
      buf.dispatch(cached_dispatch_input<fp8_e4m3>{a.x, a.scales}, rank == culprit ? hb : ha);
      return test::fail_rank(rank, "a cached dispatch along two routings was accepted");
    } catch (const error& e) {
      if (std::string(e.what()).find("the cached handle's routing") == std::string::npos ||
          (rank != culprit && e.peer() != culprit))
        return test::fail_rank(rank, e.what());
    }
    const auto after = buf.traffic();
    if (after.inter.payload_bytes != before.inter.payload_bytes ||
        after.intra.payload_bytes != before.intra.payload_bytes)
      return test::fail_rank(rank, "payload moved before the cached dispatch was rejected");
    const auto res = buf.dispatch(cached_dispatch_input<fp8_e4m3>{a.x, a.scales}, ha);
    return res.num_recv_tokens == ha.num_recv_tokens
               ? 0
               : test::fail_rank(rank, "the cached dispatch after the rejected one");
  });
  return test::all_ok(codes, "cached dispatch over " + std::to_string(nodes) + " nodes of 2");
}

}  // namespace

// The cases every inter transport runs, named after it (`prefix`).
#define EPCOMM_HIERARCHICAL_SUITE(Inter, prefix)                                                  \
  TEST_CASE(prefix " 4 ranks as 2 nodes of 2, random routing, every token type on one buffer") {  \
    CHECK(run_grouped<Inter, bf16, fp8_e4m3, float>({4, 48, 256, 4, 16, routing::random, 1}, 2,   \
                                                    {routing::random, routing::random}));         \
  }                                                                                               \
  TEST_CASE(prefix " 6 ranks as 3 nodes of 2, random and adversarial routing") {                  \
    CHECK(run_grouped<Inter, bf16>(                                                               \
        {6, 40, 128, 4, 12, routing::random, 7}, 2,                                               \
        {routing::random, routing::uneven, routing::one_expert, routing::none,                    \
         routing::starve_last, routing::duplicate_rank, routing::random}));                       \
    CHECK(run_grouped<Inter, fp8_e4m3, float>({6, 32, 256, 6, 24, routing::random, 8}, 2,         \
                                              {routing::random}));                                \
  }                                                                                               \
  TEST_CASE(prefix " degenerate groupings: one node of 4, 3 nodes of 1") {                        \
    CHECK(                                                                                        \
        run_grouped<Inter, bf16>({4, 30, 128, 3, 8, routing::random, 11}, 4, {routing::random})); \
    CHECK(                                                                                        \
        run_grouped<Inter, bf16>({3, 30, 128, 3, 6, routing::uneven, 12}, 1, {routing::uneven})); \
  }                                                                                               \
  TEST_CASE(prefix " bad input stops every rank before payload moves") {                          \
    CHECK(bad_input_stops_everyone<Inter>());                                                     \
  }                                                                                               \
  TEST_CASE(prefix " a lost rank fails every survivor fast") {                                    \
    CHECK(lost_rank_fails_survivors_fast<Inter>());                                               \
  }                                                                                               \
  TEST_CASE(prefix " asynchronous calls over 2 nodes of 2") {                                     \
    const auto codes = launch_nodes(4, 2, [](local_bootstrap& boot) {                             \
      hier<Inter, bf16> buf(boot, test::case_config(4, 128));                                     \
      return test::check_async_calls(buf, boot.rank(), 4);                                        \
    });                                                                                           \
    CHECK(test::all_ok(codes, "asynchronous calls over 2 nodes of 2"));                           \
  }                                                                                               \
  TEST_CASE(prefix " a dispatch from a cached handle over 2 and 3 nodes of 2") {                  \
    CHECK(cached_dispatch_across_nodes<Inter>(2));                                                \
    CHECK(cached_dispatch_across_nodes<Inter>(3));                                                \
  }                                                                                               \
  TEST_CASE(prefix " mask_lost_ranks is refused on every rank") {                                 \
    CHECK(masking_is_refused<Inter>());                                                           \
  }

#if defined(EPCOMM_TEST_LIBFABRIC)
EPCOMM_HIERARCHICAL_SUITE(libfabric::transport, "libfabric inter:")
#elif defined(EPCOMM_TEST_UCX)
EPCOMM_HIERARCHICAL_SUITE(ucx::transport, "ucx inter:")
#else
EPCOMM_HIERARCHICAL_SUITE(shm::transport, "shm inter:")
#endif
