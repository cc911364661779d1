// Multi-process normal-mode suite over shared memory: 1-4 ranks, random and
// adversarial routing, every token type, checked exactly (dispatch) and within
// fp32 accumulation error (combine) against an independent reference.
#include <doctest/doctest.h>

#include "support/run_case.hpp"

using namespace epcomm;
using test::routing;
using test::shape;

TEST_CASE("random routing over 1-4 ranks, every token type") {
  for (int world : {1, 2, 3, 4}) {
    for (std::uint64_t seed : {11u, 12u}) {
      const shape s{world, 96, 256, 4, 4 * world, routing::random, seed};
      CHECK(test::run_case<bf16>(s));
      CHECK(test::run_case<fp8_e4m3>(s));
      CHECK(test::run_case<float>(s));
    }
  }
}

TEST_CASE("adversarial routing") {
  for (routing r : {routing::uneven, routing::one_expert, routing::none, routing::starve_last,
                    routing::duplicate_rank}) {
    for (int world : {2, 3, 4}) {
      CAPTURE(test::name(r));
      CHECK(test::run_case<bf16>({world, 64, 128, 3, 2 * world, r, 5}));
    }
  }
  CHECK(test::run_case<fp8_e4m3>({4, 64, 256, 8, 8, routing::uneven, 6}));
}

TEST_CASE("shape extremes") {
  CHECK(test::run_case<bf16>({3, 0, 128, 2, 6, routing::random, 1}));         // no tokens
  CHECK(test::run_case<bf16>({2, 1, 128, 1, 4, routing::random, 2}));         // one token, top-1
  CHECK(test::run_case<float>({3, 37, 7168, 8, 24, routing::random, 3}));     // widest hidden
  CHECK(test::run_case<bf16>({4, 17, 4096, 8, 64, routing::uneven, 4}));      // 64 experts
  CHECK(test::run_case<fp8_e4m3>({2, 64, 7168, 8, 64, routing::random, 8}));  // DeepEP hidden, fp8
}

TEST_CASE("reference token count: 4096 tokens on 4 ranks") {
  CHECK(test::run_case<bf16>({4, 4096, 512, 8, 64, routing::random, 21}));
}

TEST_CASE("consecutive calls on one buffer leave no stale state") {
  test::case_options opt;
  opt.iterations = 12;
  CHECK(test::run_case<bf16>({3, 50, 128, 4, 12, routing::uneven, 31}, opt));
}

TEST_CASE("worst-case receive bound pads results to a routing-independent shape") {
  test::case_options opt;
  opt.worst_case_recv_tokens = 4 * 40;
  opt.iterations = 3;
  CHECK(test::run_case<bf16>({4, 40, 128, 4, 16, routing::random, 41}, opt));
}

TEST_CASE("seeded sweep over ranks, shapes and token types") {
  // Shapes drawn from the ranges users run (hidden 128-7168, top-k 1-8,
  // 4-64 experts, 0-4096 tokens), bounded so each case moves a few MiB.
  const int hiddens[] = {128, 256, 1024, 2048, 4096, 7168};
  const int tokens[] = {0, 1, 7, 100, 513, 2048, 4096};
  for (std::uint64_t i = 0; i < 24; ++i) {
    const std::uint64_t h = test::hash(0x5eed, i);
    shape s;
    s.world = 1 + static_cast<int>(h % 4);
    s.hidden = hiddens[(h >> 8) % 6];
    s.tokens = tokens[(h >> 16) % 7];
    while (static_cast<long long>(s.tokens) * s.hidden > (1 << 21)) s.tokens /= 2;
    s.experts = s.world * (1 << ((h >> 24) % 5));
    if (s.experts > 64) s.experts = 64 / s.world * s.world;
    if (s.experts < 4) s.experts = s.world * ((4 + s.world - 1) / s.world);
    s.topk = 1 + static_cast<int>((h >> 32) % std::min(8, s.experts));
    s.route = (h >> 40) % 3 == 0 ? routing::uneven : routing::random;
    s.seed = 100 + i;
    CAPTURE(test::describe(s, ""));
    switch (i % 3) {
      case 0: CHECK(test::run_case<bf16>(s)); break;
      case 1: CHECK(test::run_case<fp8_e4m3>(s)); break;
      default: CHECK(test::run_case<float>(s)); break;
    }
  }
}
