// The contract of an RMA transport (transport/concepts.hpp), checked between real
// processes for any transport that models it: bytes land where put says,
// signals count and come after the writes they cover, completed() and flush
// report completion, bad arguments and lost peers give an epcomm::error that
// names the peer, and normal mode survives bad input and a lost peer over the
// proxy. Instantiated per transport with EPCOMM_RMA_TRANSPORT_SUITE(T).
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "epcomm/proxy/engine.hpp"
#include "support/dispatch_combine_suite.hpp"

namespace epcomm::test {

inline std::byte pattern(int src, int dst, std::size_t i) {
  return static_cast<std::byte>((src * 131 + dst * 31 + i * 7 + (i >> 8)) & 0xff);
}

// Progresses `t` until operations 1..n are complete, or gives up at dl.
template <class T>
bool complete_until(T& t, std::uint64_t n, const deadline& dl) {
  while (t.completed() < n) {
    if (dl.expired()) return false;
    t.progress();
  }
  return true;
}

}  // namespace epcomm::test

TEST_CASE_TEMPLATE_DEFINE("put, put_signal and signal_add land and count", T, rma_basic) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  // Each rank writes a block of a size of its own (0 and odd sizes included)
  // into a region of every peer and itself, some with put + signal_add, some
  // with put_signal; every rank then checks what each peer wrote.
  constexpr std::size_t region = 1 << 16;
  auto size_from = [](int src) { return std::size_t{src == 1 ? 0u : 4093u * (src + 1)}; };
  const auto codes = launch_local(3, [&](local_bootstrap& boot) {
    const int rank = boot.rank(), world = boot.world_size();
    const deadline dl = deadline::after(std::chrono::seconds(60));
    T t(boot, region * (world + 1), 2 * world, dl);
    auto buf = t.local_buffer();
    const std::size_t mine = size_from(rank);
    std::uint64_t ops = 0;
    for (int p = 0; p < world; ++p) {
      const std::size_t src = region * world;  // staging area, refilled per peer
      t.progress();
      if (!test::complete_until(t, ops, dl)) return test::fail_rank(rank, "puts never completed");
      for (std::size_t i = 0; i < mine; ++i) buf[src + i] = test::pattern(rank, p, i);
      if (p % 2 == 0) {
        t.put(p, src, region * rank, mine);
        t.signal_add(p, rank, 1);
        ops += 2;
      } else {
        t.put_signal(p, src, region * rank, mine, rank, 1);
        ops += 1;
      }
      t.signal_add(p, world + rank, 5);  // a second counter, bumped by 5
      ++ops;
    }
    for (int p = 0; p < world; ++p) {
      t.wait(p, 1, dl, {"rma test", p, "block"});
      t.wait(world + p, 5, dl, {"rma test", p, "second counter"});
      for (std::size_t i = 0; i < size_from(p); ++i)
        if (buf[region * p + i] != test::pattern(p, rank, i))
          return test::fail_rank(
              rank, "byte " + std::to_string(i) + " from " + std::to_string(p) + " is wrong");
    }
    for (int p = 0; p < world; ++p) t.flush(p);
    ops += world;
    if (!test::complete_until(t, ops, dl))
      return test::fail_rank(rank, "completed() stuck at " + std::to_string(t.completed()) +
                                       " of " + std::to_string(ops));
    t.barrier(dl);
    return 0;
  });
  CHECK(test::all_ok(codes, "rma basic"));
}

TEST_CASE_TEMPLATE_DEFINE("a signal comes after every earlier write to that peer", T, rma_release) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  // Many puts of distinct blocks, then one signal_add: the target must see all
  // of them once the count arrives, on a fabric free to reorder the writes.
  constexpr std::size_t block = 3000, blocks = 64;
  const auto codes = launch_local(2, [&](local_bootstrap& boot) {
    const int rank = boot.rank(), peer = 1 - rank;
    const deadline dl = deadline::after(std::chrono::seconds(60));
    T t(boot, 2 * block * blocks, 1, dl);
    proxy::engine<T> proxy(t);
    auto buf = t.local_buffer();
    for (int round = 1; round <= 3; ++round) {
      for (std::size_t i = 0; i < block * blocks; ++i) buf[i] = test::pattern(rank, round, i);
      for (std::size_t b = 0; b < blocks; ++b)
        proxy.push(0, proxy::op_code::put, peer, b * block, block * blocks + b * block, block, 0, 0,
                   dl);
      proxy.push(0, proxy::op_code::signal, peer, 0, 0, 0, 0, 1, dl);
      t.wait(0, round, dl, {"rma test", peer, "blocks"});
      for (std::size_t i = 0; i < block * blocks; ++i)
        if (buf[block * blocks + i] != test::pattern(peer, round, i))
          return test::fail_rank(rank, "round " + std::to_string(round) + ": byte " +
                                           std::to_string(i) + " not there when the signal was");
      proxy.quiet(0, dl);
      t.barrier(dl);  // the peer has checked before the next round overwrites
    }
    return 0;
  });
  CHECK(test::all_ok(codes, "rma release"));
}

TEST_CASE_TEMPLATE_DEFINE("bad arguments give an error naming the operation", T, rma_bad_args) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  const auto codes = launch_local(2, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    const deadline dl = deadline::after(std::chrono::seconds(30));
    auto expect = [&](auto&& call, const std::string& text) {
      T t(boot, 4096, 2, dl);
      try {
        call(t);
      } catch (const error& e) {
        if (std::string(e.what()).find(text) != std::string::npos) return true;
        std::fprintf(stderr, "rank %d: unexpected: %s\n", rank, e.what());
        return false;
      }
      std::fprintf(stderr, "rank %d: accepted, expected '%s'\n", rank, text.c_str());
      return false;
    };
    const bool ok =
        expect([](T& t) { t.put(1, 0, 4000, 200); }, "overrun the 4096-byte buffer") &&
        expect([](T& t) { t.put_signal(2, 0, 0, 8, 0, 1); }, "peer 2 is outside [0, 2)") &&
        expect([](T& t) { t.signal_add(1, 2, 1); }, "signal slot 2 is outside [0, 2)") &&
        expect(
            [&](T& t) {
              // No peer named: the other rank closes its transport meanwhile,
              // which a wait on it would report instead of the deadline.
              t.wait(0, 1, deadline::after(std::chrono::milliseconds(200)),
                     {"rma test", no_peer, "nothing"});
            },
            "deadline expired waiting for nothing");
    return ok ? 0 : 1;
  });
  CHECK(test::all_ok(codes, "rma bad arguments"));
}

TEST_CASE_TEMPLATE_DEFINE("a lost peer fails the survivors fast, naming it", T, rma_lost_peer) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  const auto start = steady::now();
  const auto codes = launch_local(3, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    const deadline dl = deadline::after(std::chrono::seconds(20));
    T t(boot, 1 << 16, 3, dl);
    if (rank == 1) return 0;  // leaves without a word
    try {
      proxy::engine<T> proxy(t);
      proxy.push(0, proxy::op_code::put_signal, 1, 0, 0, 4096, rank, 1, dl);
      t.wait(1, 1, dl, {"rma test", 1, "a signal from the lost peer"});
    } catch (const error& e) {
      if (e.peer() == 1) return 0;
      std::fprintf(stderr, "rank %d: error blames peer %d: %s\n", rank, e.peer(), e.what());
      return 2;
    }
    return test::fail_rank(rank, "no error although peer 1 is gone");
  });
  CHECK(test::all_ok(codes, "rma lost peer"));
  CHECK(steady::now() - start < std::chrono::seconds(10));
}

TEST_CASE_TEMPLATE_DEFINE("bad input over the proxy fails every rank, then the buffer serves", T,
                          rma_bad_input) {
  using namespace epcomm;
  using test::routing;
  EPCOMM_SUITE_CONTEXT(T);
  const test::shape s{3, 16, 128, 2, 6, routing::random, 1};
  const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    buffer<T, bf16> buf(boot, {6, 128, 2, 16, 0, std::chrono::milliseconds(20'000)});
    std::vector<test::rank_input<bf16>> all;
    for (int r = 0; r < s.world; ++r) all.push_back(test::make_input<bf16>(s, r));
    auto idx = all[rank].topk_idx;
    if (rank == 1) idx[5] = 6;  // == num_experts
    try {
      buf.dispatch({s.tokens, s.hidden, s.topk, all[rank].x, {}, idx, all[rank].topk_weights});
      return test::fail_rank(rank, "bad input accepted");
    } catch (const error& e) {
      if (std::string(e.what()).find("is outside [-1, 6)") == std::string::npos ||
          (rank != 1 && e.peer() != 1))
        return test::fail_rank(rank, std::string("unexpected: ") + e.what());
    }
    const auto res = buf.dispatch(
        {s.tokens, s.hidden, s.topk, all[rank].x, {}, all[rank].topk_idx, all[rank].topk_weights});
    if (auto e = test::check_dispatch(s, rank, all, res); !e.empty())
      return test::fail_rank(rank, "after the error: " + e);
    return 0;
  });
  CHECK(test::all_ok(codes, "bad input over the proxy"));
}

TEST_CASE_TEMPLATE_DEFINE("a peer that leaves mid-protocol fails dispatch fast, naming it", T,
                          rma_lost_in_dispatch) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  const test::shape s{3, 16, 128, 2, 6, test::routing::random, 7};
  const auto start = steady::now();
  const auto codes = launch_local(s.world, [&](local_bootstrap& boot) {
    buffer<T, bf16> buf(boot, {6, 128, 2, 16, 0, std::chrono::milliseconds(20'000)});
    if (boot.rank() == 1) return 0;  // leaves without dispatching
    const auto mine = test::make_input<bf16>(s, boot.rank());
    try {
      buf.dispatch({s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
    } catch (const error& e) {
      if (e.peer() == 1) return 0;
      return test::fail_rank(boot.rank(), std::string("error blames another peer: ") + e.what());
    }
    return test::fail_rank(boot.rank(), "dispatch succeeded without peer 1");
  });
  CHECK(test::all_ok(codes, "lost peer in dispatch"));
  CHECK(steady::now() - start < std::chrono::seconds(10));
}

#define EPCOMM_RMA_TRANSPORT_SUITE(T)          \
  TEST_CASE_TEMPLATE_INVOKE(rma_basic, T);     \
  TEST_CASE_TEMPLATE_INVOKE(rma_release, T);   \
  TEST_CASE_TEMPLATE_INVOKE(rma_bad_args, T);  \
  TEST_CASE_TEMPLATE_INVOKE(rma_lost_peer, T); \
  TEST_CASE_TEMPLATE_INVOKE(rma_bad_input, T); \
  TEST_CASE_TEMPLATE_INVOKE(rma_lost_in_dispatch, T)
