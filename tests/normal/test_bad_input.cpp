// Bad input must give epcomm::error on every rank before any payload moves,
// never a hang, and must leave the buffer usable for the next valid call.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <thread>

#include "support/run_case.hpp"

using namespace epcomm;
using test::routing;
using test::shape;

namespace {

using mutate = std::function<void(int rank, dispatch_input<bf16>&, dispatch_options&)>;

// Every rank must throw an error whose text contains `expect` and, on ranks
// other than `culprit`, names it as the peer; then one valid dispatch on the
// same buffer must succeed.
std::vector<int> expect_dispatch_error(const shape& s, const mutate& m, const std::string& expect,
                                       int culprit = -1, int max_tokens = 0) {
  return launch_local(s.world, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    buffer_config cfg{s.experts, 512,
                      s.topk,    max_tokens > 0 ? max_tokens : s.tokens,
                      0,         std::chrono::milliseconds(10'000)};
    buffer<shm::transport, bf16> buf(boot, cfg);
    auto mine = test::make_input<bf16>(s, rank);
    dispatch_input<bf16> in{s.tokens,    s.hidden,      s.topk,           mine.x,
                            mine.scales, mine.topk_idx, mine.topk_weights};
    dispatch_options opt;
    m(rank, in, opt);
    try {
      buf.dispatch(in, opt);
      std::fprintf(stderr, "rank %d: bad input accepted\n", rank);
      return 1;
    } catch (const error& e) {
      if (std::string(e.what()).find(expect) == std::string::npos ||
          (culprit >= 0 && rank != culprit && e.peer() != culprit)) {
        std::fprintf(stderr, "rank %d: unexpected message: %s\n", rank, e.what());
        return 2;
      }
    }
    // Nothing moved and every rank agreed: the buffer serves the next call.
    shape ok = s;
    ok.tokens = cfg.max_tokens_per_rank;
    std::vector<test::rank_input<bf16>> all;
    for (int r = 0; r < s.world; ++r) all.push_back(test::make_input<bf16>(ok, r));
    dispatch_input<bf16> good{
        ok.tokens, ok.hidden, ok.topk, all[rank].x, {}, all[rank].topk_idx, all[rank].topk_weights};
    const auto res = buf.dispatch(good);
    if (auto e = test::check_dispatch(ok, rank, all, res); !e.empty()) {
      std::fprintf(stderr, "rank %d: after the error: %s\n", rank, e.c_str());
      return 3;
    }
    return 0;
  });
}

bool all_zero(const std::vector<int>& codes) { return test::all_ok(codes, "bad-input case"); }

}  // namespace

TEST_CASE("expert id out of range on one rank fails every rank") {
  const shape s{3, 16, 128, 2, 6, routing::random, 1};
  std::vector<std::int64_t> bad;
  CHECK(all_zero(expect_dispatch_error(
      s,
      [&](int rank, dispatch_input<bf16>& in, dispatch_options&) {
        if (rank != 1) return;
        bad.assign(in.topk_idx.begin(), in.topk_idx.end());
        bad[5] = 6;  // == num_experts
        in.topk_idx = bad;
      },
      "topk_idx[2][1] = 6 is outside [-1, 6)", 1)));
  CHECK(all_zero(expect_dispatch_error(
      s,
      [&](int rank, dispatch_input<bf16>& in, dispatch_options&) {
        if (rank != 2) return;
        bad.assign(in.topk_idx.begin(), in.topk_idx.end());
        bad[0] = -2;
        in.topk_idx = bad;
      },
      "is outside [-1, 6)", 2)));
}

TEST_CASE("the error names the rank whose input was bad") {
  const shape s{4, 8, 128, 2, 8, routing::random, 2};
  CHECK(all_zero(expect_dispatch_error(
      s,
      [](int rank, dispatch_input<bf16>& in, dispatch_options&) {
        if (rank == 3) in.num_tokens = -1;
      },
      "num_tokens is negative", 3)));
}

TEST_CASE("hidden that differs across ranks") {
  const shape s{3, 8, 256, 2, 6, routing::random, 3};
  CHECK(all_zero(expect_dispatch_error(
      s,
      [](int rank, dispatch_input<bf16>& in, dispatch_options&) {
        if (rank == 2) {
          in.hidden = 128;
          in.x = in.x.first(in.x.size() / 2);
        }
      },
      "hidden 128 on that rank disagrees with 256 on rank 0", 2)));
}

TEST_CASE("more tokens than the buffer holds") {
  const shape s{2, 32, 128, 2, 4, routing::random, 4};
  CHECK(all_zero(expect_dispatch_error(
      s, [](int, dispatch_input<bf16>&, dispatch_options&) {},
      "32 tokens exceed the buffer's max_tokens_per_rank 16", -1, 16)));
}

TEST_CASE("send buffers are refused for shapes the buffer cannot hold, with no collective") {
  const auto codes = launch_local(1, [](local_bootstrap& boot) {
    buffer<shm::transport, bf16> buf(boot, {4, 128, 2, 16, 0, std::chrono::milliseconds(5'000)});
    int refused = 0;
    for (auto [tokens, hidden] :
         {std::pair{17, 128}, std::pair{16, 129}, std::pair{-1, 128}, std::pair{4, 0}}) {
      try {
        buf.dispatch_send_buffer(tokens, hidden);
      } catch (const error& e) {
        refused += std::string(e.what()).find("dispatch_send_buffer") != std::string::npos;
      }
    }
    return refused == 4 && buf.dispatch_send_buffer(16, 128).size() == 16u * 128 ? 0 : 1;
  });
  CHECK(all_zero(codes));
}

TEST_CASE("more received tokens than the worst-case bound") {
  const shape s{2, 32, 128, 2, 4, routing::one_expert, 5};  // all 64 tokens land on rank 0
  CHECK(all_zero(expect_dispatch_error(
      s, [](int, dispatch_input<bf16>&, dispatch_options& o) { o.worst_case_recv_tokens = 40; },
      "that rank would receive 64 tokens, more than its worst_case_recv_tokens 40", 0)));
}

TEST_CASE("configs that disagree fail at construction on every rank") {
  const auto codes = launch_local(3, [](local_bootstrap& boot) {
    buffer_config cfg{6, boot.rank() == 1 ? 256 : 128, 2, 8, 0, std::chrono::milliseconds(5'000)};
    try {
      buffer<shm::transport, bf16> buf(boot, cfg);
    } catch (const error& e) {
      return std::string(e.what()).find("config differs") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  CHECK(all_zero(codes));
}

TEST_CASE("bad combine input on one rank fails every rank") {
  const shape s{3, 16, 128, 2, 6, routing::random, 6};
  const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
    buffer<shm::transport, bf16> buf(boot, {6, 128, 2, 16, 0, std::chrono::milliseconds(5'000)});
    const auto mine = test::make_input<bf16>(s, boot.rank());
    const auto res =
        buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
    auto y = test::expert_rows(res, s.hidden, boot.rank());
    if (boot.rank() == 0) y.resize(y.size() + 1);
    try {
      buf.combine({y, std::nullopt, {}, {}}, res.handle);
    } catch (const error& e) {
      return std::string(e.what()).find("y holds") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  CHECK(all_zero(codes));
}

TEST_CASE("a dispatch from a cached handle: a mismatched or foreign handle, short x, every rank") {
  // Each case spoils one rank's call; every rank must throw the same verdict
  // (naming that rank) and the buffer must then serve a good cached dispatch.
  const shape kept{3, 16, 128, 2, 6, routing::random, 9};
  const shape other{3, 16, 128, 2, 6, routing::one_expert, 10};
  using spoil = std::function<void(int rank, std::span<const bf16>& x, dispatch_handle& h,
                                   const dispatch_handle& other)>;
  const std::pair<spoil, const char*> cases[] = {
      {[](int rank, auto&, dispatch_handle& h, const dispatch_handle& o) {
         if (rank == 1) h = o;
       },
       "the cached handle's routing (fingerprint of its dispatch: number and counts)"},
      {[](int rank, auto&, dispatch_handle& h, const dispatch_handle&) {
         if (rank == 2) h.rank = 0;
       },
       "handle belongs to rank 0 of a world of 3"},
      {[](int rank, std::span<const bf16>& x, dispatch_handle&, const dispatch_handle&) {
         if (rank == 0) x = x.first(x.size() - 1);
       },
       "x holds 2047 elements, expected T*H = 2048"},
  };
  const int culprit[] = {1, 2, 0};
  for (int c = 0; c < 3; ++c) {
    const auto codes = launch_local(kept.world, [&](local_bootstrap& boot) {
      const int rank = boot.rank();
      buffer<shm::transport, bf16> buf(boot, {6, 128, 2, 16, 0, std::chrono::milliseconds(5'000)});
      const auto a = test::make_input<bf16>(kept, rank);
      const auto b = test::make_input<bf16>(other, rank);
      const dispatch_handle ha =
          buf.dispatch({kept.tokens, kept.hidden, kept.topk, a.x, {}, a.topk_idx, a.topk_weights})
              .handle;
      const dispatch_handle hb =
          buf.dispatch(
                 {other.tokens, other.hidden, other.topk, b.x, {}, b.topk_idx, b.topk_weights})
              .handle;
      std::span<const bf16> x = b.x;
      dispatch_handle h = ha;
      cases[c].first(rank, x, h, hb);
      try {
        buf.dispatch(cached_dispatch_input<bf16>{x, {}}, h);
        return test::fail_rank(rank, "spoiled cached dispatch accepted");
      } catch (const error& e) {
        if (std::string(e.what()).find(cases[c].second) == std::string::npos ||
            (rank != culprit[c] && e.peer() != culprit[c]))
          return test::fail_rank(rank, e.what());
      }
      const auto res = buf.dispatch(cached_dispatch_input<bf16>{b.x, {}}, ha);
      return res.num_recv_tokens == ha.num_recv_tokens ? 0 : test::fail_rank(rank, "after");
    });
    CHECK(all_zero(codes));
  }
}

TEST_CASE("one buffer, several token types: a rank that calls with another type fails all") {
  // Rank 1 dispatches fp8 where the others dispatch bf16; later rank 2
  // combines fp32 rows where the others combine bf16. Each rank's type is in
  // its header, so every rank throws naming the odd one out, and the buffer
  // then serves calls whose types agree.
  const shape s{3, 16, 128, 2, 6, routing::random, 12};
  const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    buffer<shm::transport, bf16, fp8_e4m3, float> buf(
        boot, {6, 128, 2, 16, 0, std::chrono::milliseconds(5'000)});
    const auto b = test::make_input<bf16>(s, rank);
    const auto f = test::make_input<fp8_e4m3>(s, rank);
    const auto expect = [&](auto&& call, const char* text, int culprit) {
      try {
        call();
      } catch (const error& e) {
        return std::string(e.what()).find(text) != std::string::npos &&
               (rank == culprit || e.peer() == culprit);
      }
      return false;
    };
    const bool dispatch_refused = expect(
        [&] {
          if (rank == 1)
            buf.dispatch(dispatch_input<fp8_e4m3>{s.tokens, s.hidden, s.topk, f.x, f.scales,
                                                  f.topk_idx, f.topk_weights});
          else
            buf.dispatch(dispatch_input<bf16>{
                s.tokens, s.hidden, s.topk, b.x, {}, b.topk_idx, b.topk_weights});
        },
        "token type fp8_e4m3 on that rank disagrees with bf16 on rank 0", 1);
    const auto res =
        buf.dispatch({s.tokens, s.hidden, s.topk, b.x, {}, b.topk_idx, b.topk_weights});
    const auto y = test::expert_rows(res, s.hidden, rank);
    std::vector<float> y32(y.size());
    std::transform(y.begin(), y.end(), y32.begin(), [](bf16 v) { return to_float(v); });
    const bool combine_refused = expect(
        [&] {
          if (rank == 2)
            buf.combine(combine_input<float>{y32, std::nullopt, {}, {}}, res.handle);
          else
            buf.combine(combine_input<bf16>{y, std::nullopt, {}, {}}, res.handle);
        },
        "y's element type fp32 on that rank disagrees with bf16 on rank 0", 2);
    // Agreeing types go through after both verdicts: fp32 everywhere.
    const auto out = buf.combine(combine_input<float>{y32, std::nullopt, {}, {}}, res.handle);
    if (!dispatch_refused || !combine_refused ||
        out.x.size() != static_cast<std::size_t>(s.tokens) * s.hidden)
      return test::fail_rank(rank, "mixed token types were not refused together");
    return 0;
  });
  CHECK(all_zero(codes));
}

TEST_CASE("a peer that exits makes the survivors fail fast, not at the deadline") {
  const shape s{3, 16, 128, 2, 6, routing::random, 7};
  const auto start = steady::now();
  const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
    buffer<shm::transport, bf16> buf(boot, {6, 128, 2, 16, 0, std::chrono::milliseconds(20'000)});
    if (boot.rank() == 1) return 0;  // leaves without dispatching
    const auto mine = test::make_input<bf16>(s, boot.rank());
    try {
      buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
    } catch (const error& e) {
      return e.peer() == 1 && std::string(e.what()).find("exited") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  CHECK(all_zero(codes));
  CHECK(steady::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a stalled peer gives a deadline error naming it") {
  const shape s{2, 16, 128, 2, 4, routing::random, 8};
  const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
    buffer<shm::transport, bf16> buf(boot, {4, 128, 2, 16, 0, std::chrono::milliseconds(300)});
    if (boot.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1'500));
      return 0;
    }
    const auto mine = test::make_input<bf16>(s, 0);
    try {
      buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
    } catch (const error& e) {
      const std::string w = e.what();
      if (e.peer() == 1 &&
          w.find("deadline expired waiting for notify counts") != std::string::npos) {
        // The buffer refuses further use rather than mixing epochs.
        try {
          buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
        } catch (const error& again) {
          return std::string(again.what()).find("unusable") != std::string::npos ? 0 : 3;
        }
      }
      std::fprintf(stderr, "%s\n", w.c_str());
      return 2;
    }
    return 1;
  });
  CHECK(all_zero(codes));
}

TEST_CASE("construction is bounded by setup_timeout, the calls by timeout") {
  // Rank 1 comes late to construction, later than the call timeout.
  const auto late = std::chrono::milliseconds(800);
  const auto call_timeout = std::chrono::milliseconds(200);
  const shape s{2, 16, 128, 2, 4, routing::random, 9};
  SUBCASE("a setup_timeout that covers the late rank") {
    const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
      if (boot.rank() == 1) std::this_thread::sleep_for(late);
      buffer_config cfg{4, 128, 2, 16, 0, call_timeout};
      cfg.setup_timeout = std::chrono::milliseconds(20'000);
      buffer<shm::transport, bf16> buf(boot, cfg);
      std::vector<test::rank_input<bf16>> all;
      for (int r = 0; r < s.world; ++r) all.push_back(test::make_input<bf16>(s, r));
      const auto& mine = all[boot.rank()];
      const auto res =
          buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
      return test::check_dispatch(s, boot.rank(), all, res).empty() ? 0 : 1;
    });
    CHECK(all_zero(codes));
  }
  SUBCASE("none: construction has the call timeout") {
    const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
      if (boot.rank() == 1) std::this_thread::sleep_for(late);
      try {
        buffer<shm::transport, bf16> buf(boot, {4, 128, 2, 16, 0, call_timeout});
      } catch (const error& e) {
        // Rank 0 gave up waiting; rank 1 then finds it gone or late.
        if (boot.rank() == 1) return 0;
        const std::string w = e.what();
        return w.find("deadline") != std::string::npos
                   ? 0
                   : (std::fprintf(stderr, "%s\n", w.c_str()), 2);
      }
      return 1;
    });
    CHECK(all_zero(codes));
  }
}

TEST_CASE("fp8 hidden that is not a multiple of 128 is rejected everywhere") {
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    buffer<shm::transport, fp8_e4m3> buf(boot, {4, 256, 2, 8, 0, std::chrono::milliseconds(5'000)});
    const test::shape s{2, 8, 192, 2, 4, routing::random, 9};
    std::vector<fp8_e4m3> x(static_cast<std::size_t>(s.tokens) * s.hidden);
    std::vector<float> scales(static_cast<std::size_t>(s.tokens) * (s.hidden / 128));
    const auto idx = test::make_routing(s, boot.rank());
    const std::vector<float> w(idx.size(), 1.0f);
    try {
      buf.dispatch({s.tokens, s.hidden, s.topk, x, scales, idx, w});
    } catch (const error& e) {
      return std::string(e.what()).find("not a multiple of 128") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  CHECK(all_zero(codes));
}

TEST_CASE("NaN and Inf payloads pass through untouched") {
  const shape s{2, 16, 128, 2, 4, routing::random, 10};
  // Every rank poisons the same channels of every input, so the reference
  // (regenerated on each rank) sees the same bits.
  auto poisoned = [&](int r) {
    auto in = test::make_input<bf16>(s, r);
    for (int t = 0; t < s.tokens; ++t) {
      in.x[t * s.hidden + 0] = bf16{0x7fc1};  // a NaN with payload
      in.x[t * s.hidden + 1] = bf16{0x7f80};  // +inf
      in.x[t * s.hidden + 2] = bf16{0xff80};  // -inf
    }
    return in;
  };
  const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    buffer<shm::transport, bf16> buf(
        boot, {s.experts, s.hidden, s.topk, s.tokens, 0, std::chrono::milliseconds(5'000)});
    std::vector<test::rank_input<bf16>> all;
    for (int r = 0; r < s.world; ++r) all.push_back(poisoned(r));
    const auto& mine = all[rank];
    const auto res =
        buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
    if (auto e = test::check_dispatch(s, rank, all, res);
        !e.empty()) {  // bit-exact, NaN payload too
      std::fprintf(stderr, "rank %d: %s\n", rank, e.c_str());
      return 1;
    }
    // Rows come back unchanged: the sum over destinations keeps NaN and the infinities.
    std::vector<bf16> y(res.recv_x.begin(), res.recv_x.end());
    const auto out = buf.combine({y, std::nullopt, {}, {}}, res.handle);
    for (int t = 0; t < s.tokens; ++t) {
      bool routed = false;
      for (int k = 0; k < s.topk; ++k) routed = routed || mine.topk_idx[t * s.topk + k] >= 0;
      if (!routed) continue;
      if (!std::isnan(to_float(out.x[t * s.hidden + 0])) ||
          to_float(out.x[t * s.hidden + 1]) != INFINITY ||
          to_float(out.x[t * s.hidden + 2]) != -INFINITY) {
        std::fprintf(stderr, "rank %d: token %d lost its NaN/Inf\n", rank, t);
        return 2;
      }
    }
    return 0;
  });
  CHECK(all_zero(codes));
}
