// The host-side halves of the low-latency CUDA path, tested without a GPU:
// the arithmetic the kernels split differently from the host engine (the fp8
// cast's amax, the combine accumulation, the slot order of chunked blocks),
// the verdicts they take from count words, the error wording, the host-side
// input checks and the runtime switch. Wherever the host engine has the same
// logic, the helpers are checked against the engine itself, on wire bytes
// and errors it produced.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/low_latency/buffer.hpp"
#include "epcomm/low_latency/cuda/arith.hpp"
#include "epcomm/low_latency/cuda/checks.hpp"
#include "epcomm/low_latency/cuda/launch.hpp"
#include "epcomm/low_latency/cuda/registry.hpp"
#include "epcomm/low_latency/report.hpp"
#include "epcomm/low_latency/verdict.hpp"
#include "epcomm/shm/transport.hpp"
#include "support/ll_reference.hpp"

using namespace epcomm;
using namespace epcomm::cuda;

namespace {

std::string message(const ll_report& r, int rank = 0) { return to_error(r, rank).what(); }

template <int Tag>
int fake(const ll_args&, stream_t) {
  return Tag;
}

// The error `call` throws, or "" when it throws none.
template <class F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const error& e) {
    return e.what();
  }
  return {};
}

// The fp8 cast of one 128-channel block as a kernel computes it: 16 threads
// of 8 channels take partial maxima, merged by an xor butterfly (lane i with
// lane i ^ m for m = 8, 4, 2, 1), then each thread quantises its channels.
void device_style_block(const bf16* in, fp8_e4m3* out, float* scale, bool pow2) {
  float lane_amax[16];
  for (int l = 0; l < 16; ++l) lane_amax[l] = fp8_partial_amax(in + 8 * l, 8);
  for (int m = 8; m >= 1; m >>= 1) {
    float next[16];
    for (int l = 0; l < 16; ++l) next[l] = fp8_amax_merge(lane_amax[l], lane_amax[l ^ m]);
    std::memcpy(lane_amax, next, sizeof next);
  }
  for (int l = 1; l < 16; ++l) REQUIRE(lane_amax[l] == lane_amax[0]);
  const float inv = fp8_block_inv_scale(lane_amax[0], pow2);
  for (int c = 0; c < fp8_block; ++c) out[c] = quantize_fp8(to_float(in[c]), inv);
  *scale = fp8_block_scale(lane_amax[0], pow2);
}

low_latency_config small_config(int world) {
  return {4 * world, 256, 4, 16, false, std::chrono::seconds(20)};
}

// Parity p's region at `offset` of the host engine's own buffer.
template <class T, class Buffer>
const T* region(Buffer& buf, int p, std::size_t offset) {
  const wire::ll::plan plan = wire::ll::plan_buffer(buf.shape());
  return reinterpret_cast<const T*>(buf.transport().local_buffer().data() +
                                    wire::ll::parity_base(plan, p) + offset);
}

// The slot of every (token, top-k slot) of one rank's routing when `blocks`
// blocks send contiguous chunks, computed the kernel's way: a block starts
// from the per-expert counts of every earlier token, and within a token,
// entries naming the same expert take consecutive slots in top-k order.
std::vector<int> chunked_slots(const std::vector<std::int64_t>& idx, int tokens, int topk,
                               int experts, int blocks) {
  std::vector<int> slot(idx.size(), -1);
  for (int b = 0; b < blocks; ++b) {
    const token_range mine = token_chunk(tokens, blocks, b);
    std::vector<int> next(experts, 0);
    for (long long i = 0; i < static_cast<long long>(mine.first) * topk; ++i)
      if (idx[i] >= 0) ++next[idx[i]];
    for (int t = mine.first; t < mine.last; ++t) {
      const std::int64_t* row = idx.data() + static_cast<std::size_t>(t) * topk;
      std::vector<int> grow(experts, 0);
      for (int j = 0; j < topk; ++j) {
        if (row[j] < 0) continue;
        int same_before = 0;
        for (int i = 0; i < j; ++i) same_before += row[i] == row[j];
        slot[static_cast<std::size_t>(t) * topk + j] = next[row[j]] + same_before;
        ++grow[row[j]];
      }
      for (int e = 0; e < experts; ++e) next[e] += grow[e];
    }
  }
  return slot;
}

}  // namespace

TEST_CASE("low-latency reports read as the host engine's errors") {
  ll_report r{};
  r.code = ll_failure::deadline;
  r.op = ll_op::dispatch;
  r.peer = 2;
  r.what = ll_waited_for::dispatch_records;
  r.expected = 3;
  r.seen = 2;
  CHECK(message(r, 1) ==
        "epcomm: rank 1: low-latency dispatch (peer 2): deadline expired waiting for dispatch "
        "records: expected 3, saw 2");
  r.what = ll_waited_for::release;
  CHECK(message(r, 1).find("waiting for release of the previous dispatch region") !=
        std::string::npos);
  r.op = ll_op::combine;
  r.what = ll_waited_for::combined_rows;
  CHECK(message(r, 1).find("low-latency combine (peer 2): deadline expired waiting for combined "
                           "rows") != std::string::npos);

  r = {};
  r.code = ll_failure::record_source;
  r.peer = 1;
  r.index = 4;
  r.src_rank = 3;
  r.src_token = -1;
  r.src_slot = 9;
  CHECK(message(r) ==
        "epcomm: rank 0: low-latency dispatch (peer 1): protocol mismatch: record 4 names rank 3, "
        "token -1, top-k slot 9");
  r.code = ll_failure::count_range;
  r.seen = 17;
  r.expected = 16;
  CHECK(message(r).find("protocol mismatch: 17 records announced, at most 16 fit") !=
        std::string::npos);
  r.code = ll_failure::rows_mismatch;
  CHECK(message(r).find("protocol mismatch: 17 rows returned, 16 dispatched there") !=
        std::string::npos);
  r.code = ll_failure::reject_epoch;
  r.seen = 2;
  r.expected = 5;
  CHECK(message(r).find("protocol mismatch: reject record of epoch 2, expected 5") !=
        std::string::npos);

  // The abort relay, worded as the host transports word a peer's abort.
  r = {};
  r.code = ll_failure::peer_aborted;
  r.what = ll_waited_for::dispatch_records;
  r.src_rank = 2;
  r.peer = 2;  // rank 2 gave up on its own account
  CHECK(message(r, 0) ==
        "epcomm: rank 0: low-latency dispatch (peer 2): peer aborted while this rank waited for "
        "dispatch records");
  r.peer = 3;  // rank 2 gave up because of rank 3: the error names the root cause
  CHECK(message(r, 0) ==
        "epcomm: rank 0: low-latency dispatch (peer 3): rank 3 failed (reported by rank 2, which "
        "aborted) while this rank waited for dispatch records");
  r.peer = 0;
  CHECK(message(r, 0).find("peer aborted, blaming this rank, while") != std::string::npos);

  // Over an RMA transport: a channel call that failed.
  r = {};
  r.code = ll_failure::proxy;
  r.op = ll_op::combine;
  r.peer = no_peer;
  r.seen = static_cast<std::int64_t>(proxy::channel_status::ring_full);
  CHECK(message(r, 2) ==
        "epcomm: rank 2: low-latency combine: proxy: deadline expired with the proxy ring full");

  // The abort words follow the wire format's signals, one per rank.
  const wire::ll::shape s4{4, 8, 128, 2, 16, 2, false};
  CHECK(ll_abort_first_slot(s4) == wire::ll::signal_slots(s4));
  CHECK(ll_device_signal_slots(s4) == wire::ll::signal_slots(s4) + 4);

  for (auto f : {ll_failure::deadline, ll_failure::count_epoch, ll_failure::reject_epoch,
                 ll_failure::count_range, ll_failure::record_source, ll_failure::rows_mismatch,
                 ll_failure::peer_aborted, ll_failure::proxy})
    CHECK(ll_breaks_buffer(f));
  CHECK_FALSE(ll_breaks_buffer(ll_failure::invalid_input));
  CHECK_FALSE(ll_breaks_buffer(ll_failure::peer_rejected));
  CHECK_FALSE(ll_breaks_buffer(ll_failure::none));
}

TEST_CASE("the device's split fp8 cast gives quantize_fp8_row's bits") {
  const int hidden = 4 * fp8_block;
  std::vector<bf16> row(hidden);
  for (int trial = 0; trial < 400; ++trial) {
    for (int c = 0; c < hidden; ++c) {
      const std::uint64_t h = test::hash(trial, c, 0x8f);
      // Magnitudes from subnormal to huge, plus the special values.
      const float mag = std::ldexp(1.0f, static_cast<int>(h % 60) - 40);
      float v = mag * test::uniform(test::hash(trial, c, 1));
      if (h % 97 == 0) v = std::numeric_limits<float>::quiet_NaN();
      if (h % 89 == 0) v = -0.0f;
      if (h % 83 == 0) v = -std::numeric_limits<float>::infinity();
      if (trial % 50 == 0) v = 0.0f;  // all-zero rows hit the amax floor
      row[c] = to_bf16(v);
    }
    for (bool pow2 : {false, true}) {
      std::vector<fp8_e4m3> want(hidden), got(hidden);
      std::vector<float> want_scales(hidden / fp8_block), got_scales(hidden / fp8_block);
      quantize_fp8_row(row.data(), hidden, want.data(), want_scales.data(), pow2);
      for (int b = 0; b < hidden / fp8_block; ++b)
        device_style_block(row.data() + b * fp8_block, got.data() + b * fp8_block, &got_scales[b],
                           pow2);
      REQUIRE(std::memcmp(got.data(), want.data(), hidden) == 0);
      REQUIRE(std::memcmp(got_scales.data(), want_scales.data(), sizeof(float) * 4) == 0);
    }
  }
}

TEST_CASE("token chunks cover every token once, in order") {
  for (int tokens : {0, 1, 7, 128, 129, 4096})
    for (int blocks : {1, 2, 3, 128, 264}) {
      int next = 0;
      for (int b = 0; b < blocks; ++b) {
        const token_range r = token_chunk(tokens, blocks, b);
        CHECK(r.first == next);
        CHECK(r.last >= r.first);
        next = r.last;
      }
      CHECK(next == tokens);
    }
}

TEST_CASE("launch geometry depends on shape and token count only, within the block budget") {
  const wire::ll::shape s{4, 64, 7168, 8, 128, 2, false};
  CHECK(ll_dispatch_send_blocks(0, 264) == 1);
  CHECK(ll_dispatch_send_blocks(128, 264) == 128);
  CHECK(ll_dispatch_send_blocks(4096, 264) == 264);
  CHECK(ll_dispatch_recv_blocks(s, 264) == 64);  // one per (local expert, source) region
  CHECK(ll_dispatch_recv_blocks(s, 5) == 5);     // a small budget: blocks take turns
  CHECK(ll_combine_send_blocks(s, 264) == 264);
  CHECK(ll_combine_send_blocks(s, 1) == 1);
  CHECK(ll_combine_send_blocks({1, 1, 128, 1, 1, 2, false}, 264) == 1);
  CHECK(ll_combine_recv_blocks(7, 264) == 7);
  CHECK(ll_combine_recv_blocks(7, 3) == 3);
  // The record body is staged whole: payload, then padding to 16 bytes.
  CHECK(ll_body_bytes(s) == 7168 * 2);
  const wire::ll::shape f{4, 64, 7168, 8, 128, 1, true};
  CHECK(ll_body_bytes(f) == 7168 + 56 * 4);
  const wire::ll::shape odd{2, 2, 100, 2, 4, 2, false};
  CHECK(ll_body_bytes(odd) == 208);  // 200 bytes of payload, padded
  CHECK(ll_send_shared_bytes(s) == 7168 * 2 + 8 * sizeof(void*) + 2 * 64 * sizeof(int));
}

TEST_CASE("host checks of device calls word errors as the host engine does") {
  const wire::ll::shape s{2, 8, 256, 4, 16, 2, false};
  CHECK(check_ll_dispatch(s, {16, 4, true, true}).empty());
  CHECK(check_ll_dispatch(s, {0, 1, false, false}).empty());  // no tokens, no pointers needed
  CHECK(check_ll_dispatch(s, {-1, 4, true, true}) == "num_tokens is negative");
  CHECK(check_ll_dispatch(s, {17, 4, true, true}) == "17 tokens exceed max_tokens_per_rank 16");
  CHECK(check_ll_dispatch(s, {8, 5, true, true}) == "topk 5 is outside [1, 4]");
  CHECK(check_ll_dispatch(s, {8, 0, true, true}) == "topk 0 is outside [1, 4]");
  CHECK(check_ll_dispatch(s, {8, 4, false, true}) == "x is null with 8 tokens");
  CHECK(check_ll_dispatch(s, {8, 4, true, false}) == "topk_idx is null with 8 tokens");
  // A two-wire buffer of hidden 200: the device buffer checks each call's own
  // shape, so bf16 goes and fp8 (no whole 128-blocks to scale) does not.
  const wire::ll::shape both{2, 8, 200, 4, 16, 2, true};
  CHECK(check_ll_dispatch(wire::ll::call_shape<bf16>(both), {8, 4, true, true}).empty());
  CHECK(check_ll_dispatch(wire::ll::call_shape<fp8_e4m3>(both), {8, 4, true, true}) ==
        "hidden 200 is not a multiple of 128 (fp8 scales)");

  const ll_combine_request ok{0, 3, 3, true, 8, 4, 8, 4, true, true, true};
  CHECK(check_ll_combine(ok).empty());
  auto c = ok;
  c.handle_dispatch = 2;
  CHECK(check_ll_combine(c) ==
        "handle is stale: it names dispatch 2 of parity 0, whose outputs a later dispatch "
        "replaced");
  c = ok, c.dispatch_accepted = false;
  CHECK(check_ll_combine(c).find("handle is stale") == 0);
  c = ok, c.handle_topk = 2;
  CHECK(check_ll_combine(c) == "handle says T=8, K=2 but its dispatch had T=8, K=4");
  c = ok, c.has_y = false;
  CHECK(check_ll_combine(c) == "y is null");
  c = ok, c.has_topk_weights = false;
  CHECK(check_ll_combine(c) == "topk_weights is null with T*K = 32 values");
  c = ok, c.handle_tokens = c.dispatch_tokens = 0, c.has_topk_idx = c.has_topk_weights = false;
  CHECK(check_ll_combine(c).empty());
}

// The rejections the host can judge, worded on the host side of the device
// path, read exactly as the host engine's errors on every rank.
TEST_CASE("host-judged rejections give the host engine's errors on every rank") {
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    const int rank = boot.rank();
    const auto cfg = small_config(2);
    low_latency_buffer<shm::transport, bf16> buf(boot, cfg);
    const wire::ll::shape& s = buf.shape();
    const auto call =
        test::make_ll_call(2, cfg.hidden, 2, cfg.num_experts, {16, 16}, test::routing::random, 5);
    std::vector<bf16> x17(17 * cfg.hidden);
    std::vector<std::int64_t> idx17(17 * 2, 0);
    const auto& in = call.in[rank];
    struct attempt {
      ll_dispatch_input input;
      ll_dispatch_request request;
    };
    const attempt bad[] = {{{17, 2, x17, idx17}, {17, 2, true, true}},
                           {{-1, 2, {}, {}}, {-1, 2, true, true}},
                           {{16, 5, in.x, in.topk_idx}, {16, 5, true, true}}};
    for (const attempt& b : bad) {
      // Rank 1 is the culprit; rank 0 calls with good input.
      const ll_dispatch_input mine =
          rank == 1 ? b.input : ll_dispatch_input{16, 2, in.x, in.topk_idx};
      const std::string engine = error_of([&] { buf.low_latency_dispatch(mine); });
      ll_report r{};
      r.op = ll_op::dispatch;
      r.code = rank == 1 ? ll_failure::invalid_input : ll_failure::peer_rejected;
      r.peer = rank == 1 ? no_peer : 1;
      copy_cause(r.cause, check_ll_dispatch(s, b.request).c_str());
      if (engine != message(r, rank)) {
        std::fprintf(stderr, "rank %d: engine '%s', device path '%s'\n", rank, engine.c_str(),
                     message(r, rank).c_str());
        return 1;
      }
    }
    // A stale handle: the host engine's text from the device path's check.
    const ll_dispatch_input good{16, 2, in.x, in.topk_idx};
    const auto first = buf.low_latency_dispatch(good);
    buf.low_latency_dispatch(good);
    buf.low_latency_dispatch(good);  // parity of `first` again
    const std::string engine = error_of([&] {
      buf.low_latency_combine({buf.combine_send_buffer(first.handle), in.topk_idx, in.topk_weights},
                              first.handle);
    });
    const std::string cause =
        check_ll_combine({first.handle.parity, first.handle.epoch, first.handle.epoch + 1, true, 16,
                          2, 16, 2, true, true, true});
    if (engine !=
        "epcomm: rank " + std::to_string(rank) + ": low-latency combine: invalid input: " + cause) {
      std::fprintf(stderr, "rank %d: engine '%s', device path cause '%s'\n", rank, engine.c_str(),
                   cause.c_str());
      return 2;
    }
    return 0;
  });
  for (int c : codes) CHECK(c == 0);
}

// The strongest check available without a GPU: the verdict functions and the
// slot order the kernels use, applied to the wire bytes the host engine
// itself wrote, give the engine's own results and errors.
TEST_CASE("verdicts and slot order on the host engine's wire bytes match the engine") {
  const int world = 3;
  const auto codes = launch_local(world, [](local_bootstrap& boot) {
    const int rank = boot.rank();
    const auto cfg = small_config(world);
    low_latency_buffer<shm::transport, fp8_e4m3> buf(boot, cfg);
    const wire::ll::shape& s = buf.shape();
    const wire::ll::plan plan = wire::ll::plan_buffer(s);
    const int el = s.local_experts();
    const auto sync = [&] { boot.barrier(deadline::after(std::chrono::seconds(20))); };
    const auto call = test::make_ll_call(world, cfg.hidden, 4, cfg.num_experts, {16, 11, 0},
                                         test::routing::uneven, 9, true);
    const auto& in = call.in[rank];

    // Accepted dispatch: no failure, and the packing the words imply.
    const auto res = buf.low_latency_dispatch({call.tokens[rank], 4, in.x, in.topk_idx});
    const int p = res.handle.parity;
    const auto* words = region<wire::ll::count_word>(buf, p, plan.dispatch_counts);
    const auto* rejects = region<wire::ll::reject_record>(buf, p, plan.rejects);
    ll_report r{};
    constexpr std::uint8_t wire_id = token_traits<fp8_e4m3>::id;
    dispatch_verdict(
        scan_dispatch_words(words, el, world, res.handle.epoch, s.max_tokens_per_rank, wire_id),
        words, rejects, el, world, rank, res.handle.epoch, s.max_tokens_per_rank, wire_id, true, r);
    if (r.code != ll_failure::none) return 1;
    for (int le = 0; le < el; ++le) {
      int begin = 0;
      for (int src = 0; src < world; ++src) {
        const auto& range = res.recv_range[static_cast<std::size_t>(le) * world + src];
        const int n = words[le * world + src].count;
        if (range.begin != begin || range.count != n) return 2;
        begin += n;
      }
      if (res.recv_count[le] != begin) return 3;
    }
    // Every record sits in the slot the kernel's chunked order gives it, for
    // any number of sending blocks.
    const auto* records = region<std::byte>(buf, p, plan.dispatch_recv);
    for (int src = 0; src < world; ++src) {
      for (int blocks : {1, 2, 5}) {
        const auto slots =
            chunked_slots(call.in[src].topk_idx, call.tokens[src], 4, s.num_experts, blocks);
        for (int t = 0; t < call.tokens[src]; ++t)
          for (int j = 0; j < 4; ++j) {
            const std::int64_t e = call.in[src].topk_idx[static_cast<std::size_t>(t) * 4 + j];
            if (e < 0 || e / el != rank) continue;
            wire::ll::record_header h;
            std::memcpy(
                &h,
                records + wire::ll::record_offset(s, plan, static_cast<int>(e % el), src,
                                                  slots[static_cast<std::size_t>(t) * 4 + j]),
                sizeof h);
            if (h.src.rank != src || h.src.token != t || h.src.topk_slot != j) return 4;
          }
      }
    }
    sync();

    // Accepted combine: no failure, and the reduction redone from the wire
    // bytes with the kernels' accumulation gives the engine's output.
    auto y = buf.combine_send_buffer(res.handle);
    test::ll_expert_rows(res, rank, el, s.hidden, s.rows_per_expert(), y);
    const auto out = buf.low_latency_combine({y, in.topk_idx, in.topk_weights}, res.handle);
    const auto* cwords = region<wire::ll::count_word>(buf, p, plan.combine_counts);
    const auto* sent = region<std::int64_t>(buf, p, plan.sent_topk_idx);
    std::vector<int> expected(world);
    rows_per_expert_rank(sent, call.tokens[rank], 4, s.max_topk, el, world, expected.data());
    r = {};
    combine_verdict(scan_combine_words(cwords, world, 1, true, expected.data()), cwords, rejects,
                    world, rank, 1, true, expected.data(), r);
    if (r.code != ll_failure::none) return 5;
    const auto* returned = region<bf16>(buf, p, plan.combine_recv);
    const auto* weights = region<float>(buf, p, plan.combine_weights);
    for (int t = 0; t < call.tokens[rank]; ++t)
      for (int c = 0; c < s.hidden; ++c) {
        float acc = 0.0f;
        for (int j = 0; j < 4; ++j) {
          const std::size_t slot = wire::ll::combine_row(s, t, j);
          if (sent[slot] >= 0)
            acc = weighted_add(acc, weights[slot], to_float(returned[slot * s.hidden + c]));
        }
        if (to_bf16(acc) != out[static_cast<std::size_t>(t) * s.hidden + c]) return 6;
      }
    sync();

    // Rejected dispatch (rank 2's expert id out of range): the verdict on the
    // words and reject records is the engine's error, word for word.
    auto bad = call.in[rank].topk_idx;
    std::vector<bf16> x = in.x;
    if (rank == 2) bad = {0, 1, 2, 99}, x.assign(s.hidden, bf16{});
    const int tokens = rank == 2 ? 1 : call.tokens[rank];
    const std::string engine = error_of([&] { buf.low_latency_dispatch({tokens, 4, x, bad}); });
    const int q = 1 - p;  // the next parity
    const auto* qwords = region<wire::ll::count_word>(buf, q, plan.dispatch_counts);
    const auto* qrejects = region<wire::ll::reject_record>(buf, q, plan.rejects);
    r = {};
    dispatch_verdict(scan_dispatch_words(qwords, el, world, 1, s.max_tokens_per_rank, wire_id),
                     qwords, qrejects, el, world, rank, 1, s.max_tokens_per_rank, wire_id,
                     rank != 2, r);
    if (engine.empty() || message(r, rank) != engine) {
      std::fprintf(stderr, "rank %d: engine '%s', verdict '%s'\n", rank, engine.c_str(),
                   message(r, rank).c_str());
      return 7;
    }
    sync();

    // Rejected combine (rank 0's topk_idx differs from what it dispatched).
    const auto again = buf.low_latency_dispatch({call.tokens[rank], 4, in.x, in.topk_idx});
    auto changed = in.topk_idx;
    if (rank == 0) changed[1] = changed[1] == 0 ? 1 : 0;
    const std::string cengine = error_of([&] {
      buf.low_latency_combine({buf.combine_send_buffer(again.handle), changed, in.topk_weights},
                              again.handle);
    });
    const int a = again.handle.parity;
    if (a != p) return 9;
    const auto* awords = region<wire::ll::count_word>(buf, a, plan.combine_counts);
    const auto* arejects = region<wire::ll::reject_record>(buf, a, plan.rejects);
    const std::uint64_t combine_epoch = 2;  // the parity's second combine
    r = {};
    combine_verdict(scan_combine_words(awords, world, combine_epoch, rank != 0, expected.data()),
                    awords, arejects, world, rank, combine_epoch, rank != 0, expected.data(), r);
    if (cengine.empty() || message(r, rank) != cengine ||
        cengine.find(rank == 0 ? "invalid input: topk_idx[0][1] differs from the dispatched id"
                               : "(peer 0): that rank rejected the call") == std::string::npos) {
      std::fprintf(stderr, "rank %d: engine '%s', verdict '%s'\n", rank, cengine.c_str(),
                   message(r, rank).c_str());
      return 8;
    }
    return 0;
  });
  for (int c : codes) CHECK(c == 0);
}

TEST_CASE("count words from another call or out of range are protocol violations") {
  const int world = 2, el = 2;
  constexpr std::uint8_t bf16_id = token_traits<bf16>::id, fp8_id = token_traits<fp8_e4m3>::id;
  wire::ll::count_word words[el * world] = {};
  for (auto& w : words) w = {5, 3, wire::ll::state::ok, bf16_id};
  wire::ll::reject_record rejects[2 * world] = {};
  // Rank 0's verdict on the words and rejects as they stand, awaiting epoch 5
  // of a bf16 dispatch with room for 8 records per source.
  auto verdict = [&] {
    ll_report r{};
    dispatch_verdict(scan_dispatch_words(words, el, world, 5, 8, bf16_id), words, rejects, el,
                     world, 0, 5, 8, bf16_id, true, r);
    return r;
  };
  CHECK(verdict().code == ll_failure::none);
  // A source that dispatched fp8 records fails the call without breaking the
  // buffer: its records are not read.
  words[1 * world + 1].wire = fp8_id;  // le 1, src 1
  CHECK(message(verdict()) ==
        "epcomm: rank 0: low-latency dispatch (peer 1): that rank dispatched fp8_e4m3 records, "
        "this rank bf16");
  CHECK_FALSE(ll_breaks_buffer(verdict().code));
  words[1 * world + 1].wire = bf16_id;
  CHECK(verdict().code == ll_failure::none);
  // The host engine reads source-major: source 0's words come first, whatever
  // their local expert.
  words[1 * world + 0].count = 9;  // le 1, src 0
  words[0 * world + 1].epoch = 4;  // le 0, src 1
  CHECK(message(verdict()) ==
        "epcomm: rank 0: low-latency dispatch (peer 0): protocol mismatch: 9 records announced, at "
        "most 8 fit");
  words[1 * world + 0].count = 3;
  CHECK(message(verdict()) ==
        "epcomm: rank 0: low-latency dispatch (peer 1): protocol mismatch: count word of epoch 4, "
        "expected 5");
  // A reject record from another call is a violation too, attributed to its sender.
  // (A rejecting rank's words say nothing of its wire: rejection comes first.)
  words[0 * world + 1] = {5, 0, wire::ll::state::rejected, fp8_id};
  words[1 * world + 1] = {5, 0, wire::ll::state::rejected, fp8_id};
  rejects[1] = {4, "stale"};
  CHECK(message(verdict()) ==
        "epcomm: rank 0: low-latency dispatch (peer 1): protocol mismatch: reject record of epoch "
        "4, expected 5");
  rejects[1].epoch = 5;
  CHECK(message(verdict()) ==
        "epcomm: rank 0: low-latency dispatch (peer 1): that rank rejected the call: stale");

  wire::ll::count_word cw[world] = {{2, 4, wire::ll::state::ok, bf16_id},
                                    {2, 1, wire::ll::state::ok, bf16_id}};
  const int expected[world] = {4, 2};
  ll_report r{};
  combine_verdict(scan_combine_words(cw, world, 2, true, expected), cw, rejects, world, 0, 2, true,
                  expected, r);
  CHECK(message(r) ==
        "epcomm: rank 0: low-latency combine (peer 1): protocol mismatch: 1 rows returned, 2 "
        "dispatched there");
  // A rank whose own combine was rejected does not count rows.
  CHECK(scan_combine_words(cw, world, 2, false, expected).first_violation == -1);
}

// The device buffer agrees on its config with the host engine's record and
// words: the same mistakes fail the same way on every rank.
TEST_CASE("the config agreement rejects what the host engine rejects, in its words") {
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    const int rank = boot.rank();
    const auto timeout = std::chrono::seconds(20);
    std::vector<low_latency_config> bad(4, small_config(2));
    bad[0].num_experts = 7;                           // not a multiple of the world
    bad[1].max_topk = rank == 1 ? 3 : 4;              // differs between ranks
    bad[2].round_scale = true;                        // bf16 wire
    bad[3].max_tokens_per_rank = rank == 0 ? 0 : 16;  // invalid on one rank
    for (const low_latency_config& cfg : bad) {
      const std::string engine =
          error_of([&] { low_latency_buffer<shm::transport, bf16> buf(boot, cfg); });
      const std::string device = error_of([&] { agree_ll_shape<bf16>(boot, cfg, timeout); });
      if (engine.empty() || device != engine) {
        std::fprintf(stderr, "rank %d: engine '%s', device path '%s'\n", rank, engine.c_str(),
                     device.c_str());
        return 1;
      }
    }
    // A reason only this rank's device knows fails every rank together.
    const std::string local = error_of([&] {
      agree_ll_shape<fp8_e4m3>(boot, small_config(2), timeout, rank == 1 ? "too little" : "");
    });
    const std::string want = rank == 1 ? "invalid config: too little" : "peer rejected its config";
    if (local.find(want) == std::string::npos) return 2;
    const wire::ll::shape s = agree_ll_shape<fp8_e4m3>(boot, small_config(2), timeout);
    low_latency_buffer<shm::transport, fp8_e4m3> buf(boot, small_config(2));
    const wire::ll::shape& h = buf.shape();
    const bool same = s.world_size == h.world_size && s.num_experts == h.num_experts &&
                      s.hidden == h.hidden && s.max_topk == h.max_topk &&
                      s.max_tokens_per_rank == h.max_tokens_per_rank &&
                      s.wire_bytes == h.wire_bytes && s.has_scales == h.has_scales;
    return same ? 0 : 3;
  });
  for (int c : codes) CHECK(c == 0);
}

TEST_CASE("the low-latency runtime switch picks the exact hidden size when aligned") {
  const std::vector<ll_kernel_pair> entries = {
      {{2, 0}, &fake<1>, &fake<1>}, {{2, 7168}, &fake<2>, &fake<2>}, {{3, 0}, &fake<3>, &fake<3>}};
  const auto pick = [&](int id, int hidden, bool aligned) {
    const ll_kernel_pair* k = select_ll_kernels(entries, id, hidden, aligned);
    return k ? k->send : nullptr;
  };
  CHECK((pick(2, 7168, true) == &fake<2>));
  CHECK((pick(2, 7168, false) == &fake<1>));  // specialised kernels need 16-byte vectors
  CHECK((pick(2, 4096, true) == &fake<1>));
  CHECK((pick(3, 7168, true) == &fake<3>));
  CHECK((pick(1, 128, true) == nullptr));

  ll_kernel_registry reg;
  reg.add(entries[1]);
  reg.add({{2, 7168}, &fake<9>, &fake<9>});  // the same key again: the first stays
  ll_kernel_pair out{};
  REQUIRE(reg.find(2, 7168, true, out));
  CHECK((out.send == &fake<2>));
  CHECK_FALSE(reg.find(2, 4096, true, out));
  CHECK(reg.describe(2) == "hidden 7168");
  CHECK(reg.describe(3) == "none");
}

TEST_CASE("low-latency launch arguments fit a kernel parameter block") {
  CHECK(sizeof(ll_args) <= 4096);
  CHECK(sizeof(ll_report) % 8 == 0);  // the pinned stats follow it
}
