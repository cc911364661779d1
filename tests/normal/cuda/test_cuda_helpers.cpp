// The host-side halves of the CUDA path, tested without a GPU: the pure
// helpers the kernels call (offsets, verdicts, error wording), the runtime
// switch over instantiated kernels, the host-side input checks, and the
// capacity agreement. Where the host engine has the same logic, the helpers
// are checked against the engine itself, on wire bytes it produced.
#include <doctest/doctest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/core/layout.hpp"
#include "epcomm/normal/buffer.hpp"
#include "epcomm/normal/capacity_agreement.hpp"
#include "epcomm/normal/count_matrix.hpp"
#include "epcomm/normal/cuda/checks.hpp"
#include "epcomm/normal/cuda/launch.hpp"
#include "epcomm/normal/cuda/registry.hpp"
#include "epcomm/normal/report.hpp"
#include "epcomm/normal/verdict.hpp"
#include "epcomm/shm/transport.hpp"
#include "support/workload.hpp"

using namespace epcomm;
using namespace epcomm::cuda;

namespace {

std::string cause_of(long long v) {
  char out[32];
  cause_text(out, sizeof out) << v;
  return out;
}

template <int Tag>
int fake(const dispatch_args&, stream_t) {
  return Tag;
}

std::string message(const report& r, int rank = 0, const std::string& op = "dispatch") {
  return to_error(r, rank, op).what();
}

// R notify slots laid out as wire::plan_regions lays them out, each a valid
// header for `epoch` with the given counts.
struct notify_region {
  int world;
  std::size_t slot_bytes;
  std::vector<std::byte> bytes;

  notify_region(int world, int local_experts, std::uint64_t epoch) : world(world) {
    slot_bytes = wire::align_up(
        sizeof(wire::notify_header) + sizeof(std::int32_t) * (world + local_experts), 64);
    bytes.resize(slot_bytes * world + 64);
    for (int s = 0; s < world; ++s) {
      wire::notify_header& h = header(s);
      h.magic = wire::magic;
      h.state = wire::status::ok;
      h.epoch = epoch;
      h.hidden = 128;
      h.topk = 2;
      h.num_experts = world * local_experts;
      h.token_id = 2;
    }
  }
  std::byte* base() { return bytes.data(); }
  wire::notify_header& header(int s) {
    return *reinterpret_cast<wire::notify_header*>(base() + slot_bytes * s);
  }
  std::int32_t* counts(int s) {
    return reinterpret_cast<std::int32_t*>(base() + slot_bytes * s + sizeof(wire::notify_header));
  }
  report judge(int rank, std::uint64_t epoch, int max_recv) {
    report r{};
    judge_notify(base(), slot_bytes, world, rank, epoch, max_recv, r);
    return r;
  }
};

}  // namespace

TEST_CASE("offsets from the count matrix: rows ordered by source, returns by destination") {
  for (int world : {1, 2, 3, 5}) {
    std::vector<int> m(static_cast<std::size_t>(world) * world);
    for (int i = 0; i < world * world; ++i) m[i] = static_cast<int>(test::hash(world, i) % 50);
    const auto at = [&](int s, int r) { return m[static_cast<std::size_t>(s) * world + r]; };
    // Walk the receive and return orders row by row: each (src, dst) block
    // starts where the blocks before it in that order end.
    for (int dst = 0, seen = 0; dst < world; ++dst, seen = 0)
      for (int src = 0; src < world; seen += at(src++, dst))
        CHECK(recv_offset(m.data(), world, src, dst) == seen);
    for (int src = 0, seen = 0; src < world; ++src, seen = 0)
      for (int dst = 0; dst < world; seen += at(src, dst++))
        CHECK(return_offset(m.data(), world, src, dst) == seen);
    for (int dst = 0; dst < world; ++dst) {
      long long all = 0;
      for (int src = 0; src < world; ++src) all += at(src, dst);
      CHECK(total_received(m.data(), world, dst) == all);
    }
  }
  // Counts near INT_MAX must not wrap before they meet the capacity check.
  const int big[] = {INT_MAX, 0, INT_MAX, 0};
  CHECK(total_received(big, 2, 0) == 2LL * INT_MAX);
}

TEST_CASE("the routing fingerprint is FNV-1a over the counts and the dispatch's number") {
  // An independent FNV-1a over the bytes, spelt out: each count's four bytes,
  // least significant first, then the origin's eight.
  const auto fnv = [](const std::vector<int>& counts, std::uint64_t origin) {
    std::vector<unsigned char> bytes;
    for (int c : counts)
      for (int b = 0; b < 4; ++b)
        bytes.push_back(static_cast<unsigned char>(static_cast<std::uint32_t>(c) >> (8 * b)));
    for (int b = 0; b < 8; ++b) bytes.push_back(static_cast<unsigned char>(origin >> (8 * b)));
    std::uint32_t h = 2166136261u;
    for (unsigned char b : bytes) h = (h ^ b) * 16777619u;
    return static_cast<int>(h);
  };
  const std::vector<int> m{3, 0, 7, 12};
  CHECK(routing_fingerprint(m.data(), 2, 5) == fnv(m, 5));
  CHECK(routing_fingerprint(m.data(), 2, 1ull << 40) == fnv(m, 1ull << 40));
  // Equal counts of two dispatches differ by their number; equal numbers by the counts.
  CHECK(routing_fingerprint(m.data(), 2, 5) != routing_fingerprint(m.data(), 2, 6));
  const std::vector<int> n{3, 0, 7, 13};
  CHECK(routing_fingerprint(m.data(), 2, 5) != routing_fingerprint(n.data(), 2, 5));
}

TEST_CASE("cause_text formats integers and truncates safely") {
  CHECK(cause_of(0) == "0");
  CHECK(cause_of(-7) == "-7");
  CHECK(cause_of(1234567890123LL) == "1234567890123");
  CHECK(cause_of(LLONG_MIN) == std::to_string(LLONG_MIN));
  CHECK(cause_of(LLONG_MAX) == std::to_string(LLONG_MAX));
  char small[6];
  cause_text(small, sizeof small) << "abc" << 12345LL;
  CHECK(std::string(small) == "abc12");
}

TEST_CASE("device-side causes read as the host engine's") {
  const std::vector<std::int64_t> idx = {0, 1, 2, -1, 5, 9, 3, -2};
  const auto host = find_invalid_expert(idx, 2, 8);
  REQUIRE(host);
  char out[wire::cause_bytes];
  describe_invalid_expert(out, sizeof out, 5, 2, 9, 8);  // the first bad entry: [2][1] = 9
  CHECK(std::string(out) == *host);
  describe_short_y(out, sizeof out, 3 * 128, 128, 5);
  CHECK(std::string(out) == "y holds 384 elements, expected N*H with N >= 5 rows of 128");
}

TEST_CASE("judge_notify accepts agreeing headers and gathers the count matrix") {
  notify_region n(3, 2, 7);
  for (int s = 0; s < 3; ++s)
    for (int r = 0; r < 3; ++r) n.counts(s)[r] = 10 * s + r;
  const report r = n.judge(1, 7, 100);
  CHECK(r.code == failure::none);
  std::vector<std::int32_t> m(9);
  gather_count_matrix(n.base(), n.slot_bytes, 3, m.data());
  for (int s = 0; s < 3; ++s)
    for (int d = 0; d < 3; ++d) CHECK(m[s * 3 + d] == 10 * s + d);
}

TEST_CASE("judge_notify rejects like the host engine, in its order") {
  SUBCASE("a header from another call") {
    notify_region n(3, 2, 7);
    n.header(2).epoch = 6;
    n.header(1).state = wire::status::invalid_input;  // slot 1 comes first
    std::strcpy(n.header(1).cause, "bad");
    CHECK(message(n.judge(0, 7, 100)) ==
          "epcomm: rank 0: dispatch (peer 1): invalid input on that rank: bad");
    n.header(1).state = wire::status::ok;
    const report r = n.judge(0, 7, 100);
    CHECK(r.code == failure::notify_mismatch);
    CHECK(message(r) ==
          "epcomm: rank 0: dispatch (peer 2): protocol mismatch: notify epoch 6, "
          "expected 7");
    n.header(2).epoch = 7;
    n.header(2).magic = 0;
    CHECK(n.judge(0, 7, 100).code == failure::notify_mismatch);
  }
  SUBCASE("this rank's own input is attributed to no peer") {
    notify_region n(2, 1, 1);
    n.header(1).state = wire::status::invalid_input;
    std::strcpy(n.header(1).cause, "hidden 0 is outside [1, 128]");
    CHECK(message(n.judge(1, 1, 10), 1) ==
          "epcomm: rank 1: dispatch: invalid input: hidden 0 is outside [1, 128]");
    CHECK(n.judge(1, 1, 10).peer == no_peer);
  }
  SUBCASE("shapes that disagree with rank 0") {
    notify_region n(3, 1, 1);
    n.header(2).topk = 4;
    n.header(1).hidden = 256;
    CHECK(
        message(n.judge(0, 1, 10)) ==
        "epcomm: rank 0: dispatch (peer 1): hidden 256 on that rank disagrees with 128 on rank 0");
    n.header(1).hidden = 128;
    CHECK(message(n.judge(0, 1, 10)) ==
          "epcomm: rank 0: dispatch (peer 2): topk 4 on that rank disagrees with 2 on rank 0");
    n.header(2).topk = 2;
    n.header(1).token_id = token_traits<fp8_e4m3>::id;
    CHECK(message(n.judge(0, 1, 10)) ==
          "epcomm: rank 0: dispatch (peer 1): token type fp8_e4m3 on that rank disagrees with "
          "bf16 on rank 0");
    n.header(1).token_id = token_traits<bf16>::id;
    // A cached dispatch among ordinary ones is named as such, before its topk
    // (0) is compared; two cached dispatches compare their routing.
    n.header(2).routing = 77;
    n.header(2).topk = 0;
    CHECK(message(n.judge(0, 1, 10)) ==
          "epcomm: rank 0: dispatch (peer 2): a dispatch from a cached handle on that rank "
          "disagrees with a dispatch with top-k routing on rank 0");
    for (int r = 0; r < 3; ++r) {
      n.header(r).routing = 77;
      n.header(r).topk = 0;
    }
    CHECK(n.judge(0, 1, 10).code == failure::none);
    n.header(1).routing = 78;
    CHECK(message(n.judge(0, 1, 10)) ==
          "epcomm: rank 0: dispatch (peer 1): the cached handle's routing (fingerprint of its "
          "dispatch: number and counts) 78 on that rank disagrees with 77 on rank 0");
  }
  SUBCASE("more rows than a receiver holds, or than its bound") {
    notify_region n(2, 1, 1);
    n.counts(0)[1] = 6;
    n.counts(1)[1] = 5;
    CHECK(message(n.judge(0, 1, 10)) ==
          "epcomm: rank 0: dispatch (peer 1): that rank would receive 11 tokens, more than its "
          "buffer holds (max_recv_tokens 10)");
    n.counts(1)[1] = 4;
    CHECK(n.judge(0, 1, 10).code == failure::none);
    n.header(1).recv_bound = 9;
    CHECK(message(n.judge(0, 1, 10)) ==
          "epcomm: rank 0: dispatch (peer 1): that rank would receive 10 tokens, more than its "
          "worst_case_recv_tokens 9");
  }
}

TEST_CASE("judge_combine rejects like the host engine") {
  const int world = 3;
  const std::size_t slot = wire::align_up(sizeof(wire::combine_header), 64);
  std::vector<std::byte> bytes(slot * world);
  auto at = [&](int s) { return reinterpret_cast<wire::combine_header*>(bytes.data() + slot * s); };
  for (int s = 0; s < world; ++s) *at(s) = {4, wire::status::ok, 1, 0, 0, 77, {}};
  // The error rank `rank` throws, or "" when the round passes.
  const auto verdict = [&](int rank) {
    report r{};
    judge_combine(bytes.data(), slot, world, rank, 4, r);
    return r.code == failure::none ? std::string() : message(r, rank, "combine");
  };
  CHECK(verdict(0).empty());
  at(2)->with_weights = 0;
  CHECK(verdict(0) ==
        "epcomm: rank 0: combine (peer 2): topk_weights given on some "
        "ranks only (every rank passes them or none)");
  // Handles of two dispatches: named before the weights that also differ.
  at(2)->routing = 78;
  CHECK(verdict(1) ==
        "epcomm: rank 1: combine (peer 2): the handle's routing (fingerprint of its dispatch: "
        "number and counts) 78 on "
        "that rank disagrees with 77 on rank 0");
  at(2)->routing = 77;
  at(2)->with_weights = 1;
  at(1)->out_id = token_traits<float>::id;  // a buffer serving several types: y in fp32 there
  at(0)->out_id = token_traits<bf16>::id;
  at(2)->out_id = token_traits<bf16>::id;
  CHECK(verdict(2) ==
        "epcomm: rank 2: combine (peer 1): y's element type fp32 on that rank disagrees with bf16 "
        "on rank 0");
  at(1)->out_id = token_traits<bf16>::id;
  CHECK(verdict(1).empty());
  at(1)->epoch = 3;
  CHECK(verdict(0) ==
        "epcomm: rank 0: combine (peer 1): protocol mismatch: combine epoch 3, expected 4");
}

TEST_CASE("a deadline report reads as the host transports' wait error and breaks the buffer") {
  report r{};
  r.code = failure::deadline;
  r.peer = 3;
  r.what = waited_for::token_rows;
  r.expected = 5;
  r.seen = 4;
  const error e = to_error(r, 1, "dispatch");
  CHECK(std::string(e.what()) ==
        "epcomm: rank 1: dispatch (peer 3): deadline expired waiting for token rows: expected 5, "
        "saw 4");
  CHECK(e.peer() == 3);
  CHECK(breaks_buffer(r));
  r.code = failure::over_bound;
  CHECK_FALSE(breaks_buffer(r));
  for (auto w :
       {waited_for::notify_counts, waited_for::agreement_to_reject, waited_for::combine_readiness,
        waited_for::combined_rows, waited_for::barrier_arrival})
    CHECK(std::string(waited_for_text(w)) != "?");
}

TEST_CASE("a relayed abort reads as the host transports' and breaks the buffer") {
  report r{};
  r.code = failure::peer_aborted;
  r.what = waited_for::notify_counts;
  r.reporter = 0;
  r.peer = 3;  // rank 0 gave up because of rank 3
  const error e = to_error(r, 1, "dispatch");
  CHECK(std::string(e.what()) ==
        "epcomm: rank 1: dispatch (peer 3): rank 3 failed (reported by rank 0, which aborted) "
        "while this rank waited for notify counts");
  CHECK(e.peer() == 3);
  CHECK(breaks_buffer(r));
  r.peer = 0;  // on its own account
  CHECK(std::string(to_error(r, 1, "combine").what()) ==
        "epcomm: rank 1: combine (peer 0): peer aborted while this rank waited for notify counts");
  // The abort words follow the wire format's signal slots, one per rank.
  peer_table peers{};
  peers.rank = 1;
  peers.world_size = 4;
  const abort_link link = normal_abort_link(peers, normal_route{});
  CHECK(link.first == wire::signal_slots(4));
  CHECK(link.rank == 1);
  CHECK(link.world == 4);
  CHECK(link.via_proxy == 0);
  CHECK(with_abort_words(wire::signal_slots(4), 4) == wire::signal_slots(4) + 4);
  // Over an RMA transport the same words, reached through the abort channel.
  normal_route route{};
  route.via_proxy = 1;
  route.abort.timeout_ns = 7;
  const abort_link relayed = normal_abort_link(peers, route);
  CHECK(relayed.first == wire::signal_slots(4));
  CHECK(relayed.via_proxy == 1);
  CHECK(relayed.relay.timeout_ns == 7);

  // A channel call that failed breaks the buffer, worded as the proxy's status.
  report p{};
  p.code = failure::proxy;
  p.peer = no_peer;
  p.seen = static_cast<std::int64_t>(proxy::channel_status::proxy_failed);
  CHECK(breaks_buffer(p));
  CHECK(std::string(to_error(p, 0, "dispatch").what()) ==
        "epcomm: rank 0: dispatch: proxy: the proxy stopped on an error");
}

// The strongest check available without a GPU: the verdict functions the
// kernels run, applied to notify slots the host engine itself wrote, give the
// engine's own answer.
TEST_CASE("judge_notify on the host engine's wire bytes reaches the engine's verdict") {
  const int world = 3;
  const auto codes = launch_local(world, [](local_bootstrap& boot) {
    const int rank = boot.rank();
    buffer_config cfg{6, 128, 2, 16, 0, std::chrono::seconds(20)};
    buffer<shm::transport, bf16> buf(boot, cfg);
    const wire::region_plan plan = wire::plan_regions(buf.capacity());
    const std::byte* region = buf.transport().local_buffer().data() + plan.notify;
    const test::shape s{world, 16, 128, 2, 6, test::routing::random, 3};
    auto in = test::make_input<bf16>(s, rank);

    // Accepted call: same verdict, same count matrix as the handle.
    const auto res =
        buf.dispatch({s.tokens, s.hidden, s.topk, in.x, {}, in.topk_idx, in.topk_weights});
    report r{};
    judge_notify(region, plan.notify_slot_bytes, world, rank, 1, buf.capacity().max_recv_tokens, r);
    std::vector<std::int32_t> m(world * world);
    gather_count_matrix(region, plan.notify_slot_bytes, world, m.data());
    // Peers overwrite these slots in their next call: read before anyone goes on.
    boot.barrier(deadline::after(std::chrono::seconds(20)));
    if (r.code != failure::none) {
      std::fprintf(stderr, "rank %d: accepted call judged: %s\n", rank,
                   to_error(r, rank, "dispatch").what());
      return 1;
    }
    if (m !=
        std::vector<std::int32_t>(res.handle.count_matrix.begin(), res.handle.count_matrix.end())) {
      std::fprintf(stderr, "rank %d: count matrix differs from the handle's\n", rank);
      return 1;
    }

    // Rejected call: the same epcomm::error, word for word.
    if (rank == 2) in.topk_idx[3] = 6;
    std::string engine;
    try {
      buf.dispatch({s.tokens, s.hidden, s.topk, in.x, {}, in.topk_idx, in.topk_weights});
    } catch (const error& e) {
      engine = e.what();
    }
    report bad{};
    judge_notify(region, plan.notify_slot_bytes, world, rank, 2, buf.capacity().max_recv_tokens,
                 bad);
    const std::string device = to_error(bad, rank, "dispatch").what();
    if (engine.empty() || device != engine) {
      std::fprintf(stderr, "rank %d: engine '%s', device verdict '%s'\n", rank, engine.c_str(),
                   device.c_str());
      return 2;
    }
    return 0;
  });
  for (int c : codes) CHECK(c == 0);
}

TEST_CASE("the runtime switch picks the most specialised fitting instantiation") {
  // Launchers are only compared by identity here; they are never called.
  const dispatch_launcher fakes[] = {&fake<0>, &fake<1>, &fake<2>, &fake<3>, &fake<4>,
                                     &fake<5>, &fake<6>, &fake<7>, &fake<8>, &fake<9>};
  const auto d = [&](int tag) { return fakes[tag]; };
  const std::vector<normal_kernels> entries = {{{2, 0, 0}, d(1), nullptr},
                                               {{2, 4, 0}, d(2), nullptr},
                                               {{2, 0, 7168}, d(3), nullptr},
                                               {{2, 4, 7168}, d(4), nullptr},
                                               {{3, 0, 0}, d(5), nullptr}};
  const auto pick = [&](int id, int ranks, int hidden, bool aligned) {
    const normal_kernels* k = select_kernels(entries, id, ranks, hidden, aligned);
    return k ? k->dispatch : nullptr;
  };
  CHECK((pick(2, 4, 7168, true) == d(4)));
  CHECK((pick(2, 4, 4096, true) == d(2)));
  CHECK((pick(2, 8, 7168, true) == d(3)));
  CHECK((pick(2, 8, 4096, true) == d(1)));
  CHECK((pick(2, 4, 7168, false) == d(2)));  // hidden-specialised needs 16-byte rows
  CHECK((pick(2, 8, 7168, false) == d(1)));
  CHECK((pick(3, 4, 7168, true) == d(5)));
  CHECK((pick(1, 4, 7168, true) == nullptr));

  kernel_registry reg;
  reg.add(entries[1]);
  reg.add({{2, 4, 0}, d(9), nullptr});  // the same key again: the first stays
  normal_kernels out{};
  REQUIRE(reg.find(2, 4, 128, true, out));
  CHECK((out.dispatch == d(2)));
  CHECK_FALSE(reg.find(2, 2, 128, true, out));
  CHECK(reg.describe(2) == "(ranks 4, hidden any)");
  CHECK(reg.describe(1) == "none");
}

TEST_CASE("host-side checks of device calls word errors as the host engine does") {
  const wire::capacity cap{2, 8, 256, 4, 8, 16, 16, 1, 2, true, 0};
  // An fp8 call on a buffer whose widest type has scales.
  const auto check = [&](dispatch_shape s) { return check_dispatch_shape(cap, true, s); };
  const dispatch_shape ok{8, 256, 4, true, true, true, true};
  CHECK(check(ok).empty());
  auto s = ok;
  s.num_tokens = 9;
  CHECK(check(s) == "9 tokens exceed the buffer's max_tokens_per_rank 8");
  s = ok, s.num_tokens = -1;
  CHECK(check(s) == "num_tokens is negative");
  s = ok, s.hidden = 300;
  CHECK(check(s) == "hidden 300 is outside [1, 256]");
  s = ok, s.hidden = 100;
  CHECK(check(s) == "hidden 100 is not a multiple of 128 (fp8 scales)");
  s = ok, s.topk = 5;
  CHECK(check(s) == "topk 5 is outside [1, 4]");
  // The options' checks are the host engine's own function.
  CHECK(check_dispatch_options({17, 1}, cap.max_recv_tokens) ==
        "worst_case_recv_tokens 17 is outside [0, max_recv_tokens 16]");
  CHECK(check_dispatch_options({0, 0}, cap.max_recv_tokens) == "expert_alignment 0 is not >= 1");
  s = ok, s.has_scales = false;
  CHECK(check(s) == "x_scales is null for fp8 tokens");
  s = ok, s.has_topk_idx = false;
  CHECK(check(s) == "topk_idx is null with 8 tokens");
  s = ok, s.num_tokens = 0, s.has_x = false, s.has_topk_idx = false, s.has_topk_weights = false;
  CHECK(check(s).empty());  // no tokens, no pointers needed
  // A bf16 call on the same buffer (one serving several types): its hidden
  // need not hold whole scale blocks, and scales are a mistake.
  s = ok, s.hidden = 100, s.has_scales = false;
  CHECK(check_dispatch_shape(cap, false, s).empty());
  s.has_scales = true;
  CHECK(check_dispatch_shape(cap, false, s) == "x_scales given for a token type without scales");

  const combine_shape c{1, 2, 4, 256, 4, 10, true, true, true, true};
  CHECK(check_combine_shape(1, 2, c).empty());
  CHECK(check_combine_shape(0, 2, c) == "handle belongs to rank 1 of a world of 2");
  auto c2 = c;
  c2.has_out_weights = false;
  CHECK(check_combine_shape(1, 2, c2) == "topk_weights given but the output weights are null");
  c2 = c, c2.y_rows = -1;
  CHECK(check_combine_shape(1, 2, c2) == "y_rows is negative");

  // A cached dispatch: the handle's shape is the call's, and must be one a
  // dispatch of this buffer could have returned.
  const auto cached = [&](cached_dispatch_shape in) {
    return check_cached_dispatch_shape(cap, true, 1, 2, in);
  };
  const cached_dispatch_shape d{1, 2, 8, 256, 4, true, true};
  CHECK(cached(d).empty());
  auto d2 = d;
  d2.handle_rank = 0;
  CHECK(cached(d2) == "handle belongs to rank 0 of a world of 2");
  for (auto spoil : {+[](cached_dispatch_shape& x) { x.num_tokens = 9; },
                     +[](cached_dispatch_shape& x) { x.hidden = 384; },
                     +[](cached_dispatch_shape& x) { x.topk = 0; }}) {
    d2 = d;
    spoil(d2);
    CHECK(cached(d2) == "handle is malformed (not one this buffer's dispatch returned)");
  }
  d2 = d, d2.has_x = false;
  CHECK(cached(d2) == "x is null with 8 tokens");
  d2 = d, d2.has_scales = false;
  CHECK(cached(d2) == "x_scales is null for fp8 tokens");
  // fp8 rows along the handle of a bf16 dispatch whose hidden has no whole
  // scale blocks; bf16 rows along it are fine.
  d2 = d, d2.hidden = 100;
  CHECK(cached(d2) == "hidden 100 is not a multiple of 128 (fp8 scales)");
  d2.has_scales = false;
  CHECK(check_cached_dispatch_shape(cap, false, 1, 2, d2).empty());
}

TEST_CASE("agree_capacity yields the host engine's capacity and rejects mismatches") {
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    buffer_config cfg{4, 256, 2, 32, 0, std::chrono::seconds(20)};
    const wire::capacity mine = agree_capacity<fp8_e4m3>(boot, cfg, cfg.timeout);
    buffer<shm::transport, fp8_e4m3> buf(boot, cfg);
    if (!(mine == buf.capacity())) return 1;
    cfg.max_topk = boot.rank() == 1 ? 3 : 2;
    try {
      agree_capacity<fp8_e4m3>(boot, cfg, cfg.timeout);
      return 2;
    } catch (const error& e) {
      if (e.peer() != 1 - boot.rank()) return 3;
    }
    return 0;
  });
  for (int c : codes) CHECK(c == 0);
}

TEST_CASE("launch arguments fit a kernel parameter block") {
  CHECK(sizeof(dispatch_args) <= 4096);
  CHECK(sizeof(combine_args) <= 4096);
  CHECK(peer_table::max_ranks >= 72);  // an NVL72 domain
}
