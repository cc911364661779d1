// The multi-process normal-mode suite, once for every transport: 1-4 ranks,
// random and adversarial routing, every token type, checked exactly
// (dispatch) and within fp32 accumulation error (combine) against an
// independent reference. A test file instantiates it for its transport with
// EPCOMM_DISPATCH_COMBINE_SUITE(T); doctest then names T (TYPE_TO_STRING) in
// every test case, and each case also reports the provider the environment
// selects, so a failing assertion says which transport failed.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "support/async_case.hpp"
#include "support/budget_case.hpp"
#include "support/cached_dispatch_case.hpp"
#include "support/run_case.hpp"

namespace epcomm::test {

// FI_PROVIDER / UCX_TLS as set for this test: the provider behind the type.
inline std::string provider_environment() {
  std::string s;
  for (const char* v : {"FI_PROVIDER", "UCX_TLS"})
    if (const char* value = std::getenv(v)) s += std::string(" ") + v + "=" + value;
  return s;
}

// Runs check(buf, rank) on 3 local ranks, each over a buffer<T, Tokens...>
// of case_config(3, max_hidden); true when every rank returned 0 (a failing
// rank prints why; `what` names the case in the assertion).
template <class T, class... Tokens, class Check>
bool on_three_ranks(int max_hidden, const std::string& what, Check check) {
  const auto codes = launch_local(3, [&](local_bootstrap& boot) {
    buffer<T, Tokens...> buf(boot, case_config(3, max_hidden));
    return check(buf, boot.rank());
  });
  return all_ok(codes, what);
}

}  // namespace epcomm::test

#define EPCOMM_SUITE_CONTEXT(T) \
  INFO("transport: ", doctest::toString<T>(), epcomm::test::provider_environment())

TEST_CASE_TEMPLATE_DEFINE("random routing over 1-4 ranks, every token type", T, dc_random) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  for (int world : {1, 2, 3, 4}) {
    for (std::uint64_t seed : {11u, 12u}) {
      const test::shape s{world, 96, 256, 4, 4 * world, test::routing::random, seed};
      CHECK(test::run_case<T, bf16>(s));
      CHECK(test::run_case<T, fp8_e4m3>(s));
      CHECK(test::run_case<T, float>(s));
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("adversarial routing", T, dc_adversarial) {
  using namespace epcomm;
  using test::routing;
  EPCOMM_SUITE_CONTEXT(T);
  for (routing r : {routing::uneven, routing::one_expert, routing::none, routing::starve_last,
                    routing::duplicate_rank}) {
    for (int world : {2, 3, 4}) {
      CAPTURE(test::name(r));
      CHECK(test::run_case<T, bf16>({world, 64, 128, 3, 2 * world, r, 5}));
    }
  }
  CHECK(test::run_case<T, fp8_e4m3>({4, 64, 256, 8, 8, routing::uneven, 6}));
}

TEST_CASE_TEMPLATE_DEFINE("shape extremes", T, dc_extremes) {
  using namespace epcomm;
  using test::routing;
  EPCOMM_SUITE_CONTEXT(T);
  CHECK(test::run_case<T, bf16>({3, 0, 128, 2, 6, routing::random, 1}));      // no tokens
  CHECK(test::run_case<T, bf16>({2, 1, 128, 1, 4, routing::random, 2}));      // one token, top-1
  CHECK(test::run_case<T, float>({3, 37, 7168, 8, 24, routing::random, 3}));  // widest hidden
  CHECK(test::run_case<T, bf16>({4, 17, 4096, 8, 64, routing::uneven, 4}));   // 64 experts
  CHECK(
      test::run_case<T, fp8_e4m3>({2, 64, 7168, 8, 64, routing::random, 8}));  // DeepEP hidden, fp8
}

TEST_CASE_TEMPLATE_DEFINE("reference token count: 4096 tokens on 4 ranks", T, dc_reference) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  CHECK(test::run_case<T, bf16>({4, 4096, 512, 8, 64, test::routing::random, 21}));
}

TEST_CASE_TEMPLATE_DEFINE("consecutive calls on one buffer leave no stale state", T, dc_repeat) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  CHECK(
      test::run_case<T, bf16>({3, 50, 128, 4, 12, test::routing::uneven, 31}, {.iterations = 12}));
}

TEST_CASE_TEMPLATE_DEFINE("worst-case receive bound pads results to a routing-independent shape", T,
                          dc_bound) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  CHECK(test::run_case<T, bf16>({4, 40, 128, 4, 16, test::routing::random, 41},
                                {.iterations = 3, .worst_case_recv_tokens = 4 * 40}));
}

TEST_CASE_TEMPLATE_DEFINE("expert_alignment rounds each expert's count up to its multiple", T,
                          dc_alignment) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  for (int alignment : {3, 128})
    CHECK(test::run_case<T, bf16>({3, 50, 128, 4, 12, test::routing::uneven, 45},
                                  {.iterations = 2, .expert_alignment = alignment}));
}

TEST_CASE_TEMPLATE_DEFINE("a handle stays valid across later dispatches, combined in any order", T,
                          dc_live_handles) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  // Megatron keeps a layer's handle from forward to backward while other
  // layers dispatch: three dispatches of different sizes and routings, then
  // their combines in reverse order, each from its own handle.
  CHECK(test::on_three_ranks<T, bf16>(128, "handles across dispatches", [](auto& buf, int rank) {
    struct layer {
      test::shape s;
      std::vector<test::rank_input<bf16>> all;
      std::vector<combine_type_t<bf16>> y;  // copied: the views die at the next dispatch
      std::vector<float> weights;
      dispatch_handle handle;
    };
    std::vector<layer> layers;
    const test::routing routes[] = {test::routing::uneven, test::routing::random,
                                    test::routing::one_expert};
    for (int l = 0; l < 3; ++l) {
      layer L{{3, 40 - 13 * l, 128, 4, 12, routes[l], 61u + l}, {}, {}, {}, {}};
      for (int r = 0; r < 3; ++r) L.all.push_back(test::make_input<bf16>(L.s, r));
      const auto& mine = L.all[rank];
      const auto res = buf.dispatch({L.s.tokens, L.s.hidden, L.s.topk, mine.x, mine.scales,
                                     mine.topk_idx, mine.topk_weights});
      if (auto e = test::check_dispatch(L.s, rank, L.all, res); !e.empty()) {
        std::fprintf(stderr, "rank %d dispatch %d: %s\n", rank, l, e.c_str());
        return 1;
      }
      L.y = test::expert_rows(res, L.s.hidden, rank);
      L.weights.assign(res.recv_topk_weights.begin(), res.recv_topk_weights.end());
      L.handle = res.handle;
      layers.push_back(std::move(L));
    }
    for (int l = 2; l >= 0; --l) {
      const layer& L = layers[l];
      const auto out = buf.combine({L.y, L.weights, {}, {}}, L.handle);
      if (auto e = test::check_combine(L.s, L.all[rank], out); !e.empty()) {
        std::fprintf(stderr, "rank %d combine %d: %s\n", rank, l, e.c_str());
        return 1;
      }
    }
    return 0;
  }));
}

TEST_CASE_TEMPLATE_DEFINE("a dispatch from a cached handle, after another routing's dispatch", T,
                          dc_cached_dispatch) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  CHECK(test::on_three_ranks<T, fp8_e4m3>(256, "cached dispatch", [](auto& buf, int rank) {
    return test::check_cached_dispatch(buf, rank, 3);
  }));
}

TEST_CASE_TEMPLATE_DEFINE("one buffer serves bf16, fp8 and fp32 calls in any order", T,
                          dc_token_types) {
  using namespace epcomm;
  using test::routing;
  EPCOMM_SUITE_CONTEXT(T);
  // DeepEP's Buffer takes each call's dtype from its tensors: one layer
  // dispatches bf16, the next fp8, a backward pass sends fp32 rows along an
  // fp8 dispatch's routing. One set of regions (sized for fp32 rows and fp8
  // scales) carries all of them; odd ranks write into the send buffers,
  // whose views each call takes in its own type.
  const auto every_type = [](auto& buf, int rank) {
    test::case_options opt;
    opt.dispatch_in_place = test::in_place::odd_ranks;
    opt.combine_in_place = test::in_place::odd_ranks;
    int bad = 0;  // a failed round still takes part in the next: the ranks stay in step
    for (std::uint64_t round = 0; round < 2; ++round) {
      bad |= test::check_round<fp8_e4m3>(buf, rank,
                                         {3, 40, 256, 4, 12, routing::random, 71 + round}, opt);
      bad |= test::check_round<float>(buf, rank, {3, 33, 200, 3, 12, routing::uneven, 73 + round},
                                      opt);
      bad |= test::check_round<bf16>(buf, rank,
                                     {3, 40, 256, 4, 12, routing::duplicate_rank, 75 + round}, opt);
    }
    if (bad) return bad;
    const test::shape kept{3, 37, 256, 4, 12, routing::random, 77u};
    const auto a = test::make_input<fp8_e4m3>(kept, rank);
    const dispatch_handle h =
        buf.dispatch(dispatch_input<fp8_e4m3>{kept.tokens, kept.hidden, kept.topk, a.x, a.scales,
                                              a.topk_idx, a.topk_weights})
            .handle;
    std::vector<test::rank_input<float>> all;
    for (int r = 0; r < 3; ++r) all.push_back(test::make_input<float>(kept, r));
    const auto res = buf.dispatch(cached_dispatch_input<float>{all[rank].x, {}}, h);
    const std::size_t hidden = kept.hidden;
    for (int s = 0; s < 3; ++s)
      for (int i = 0; i < h.sent(s, rank); ++i) {
        const std::size_t row = h.recv_offset(s, rank) + i, t = res.recv_src_idx[row];
        if (!std::equal(&all[s].x[t * hidden], &all[s].x[(t + 1) * hidden],
                        &res.recv_x[row * hidden]))
          return test::fail_rank(rank, "fp32 row " + std::to_string(row) +
                                           " along an fp8 handle is not token " +
                                           std::to_string(t) + " of rank " + std::to_string(s));
      }
    return 0;
  };
  CHECK(test::on_three_ranks<T, bf16, fp8_e4m3, float>(256, "one buffer, every token type",
                                                       every_type));
}

TEST_CASE_TEMPLATE_DEFINE("asynchronous calls: results, order behind a synchronous call, errors", T,
                          dc_async) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  const auto calls = [](auto& buf, int rank) { return test::check_async_calls(buf, rank, 3); };
  CHECK(test::on_three_ranks<T, bf16>(128, "asynchronous calls", calls));
}

TEST_CASE_TEMPLATE_DEFINE(
    "tokens from dispatch_send_buffer, expert rows from combine_send_buffer, some ranks or all", T,
    dc_in_place) {
  using namespace epcomm;
  using test::in_place;
  EPCOMM_SUITE_CONTEXT(T);
  test::case_options opt;
  opt.iterations = 6;  // back to back: rows of one call are overwritten by the next
  for (in_place mode : {in_place::all, in_place::odd_ranks}) {
    opt.dispatch_in_place = mode;
    opt.combine_in_place = mode;
    CHECK(test::run_case<T, bf16>({3, 50, 256, 4, 12, test::routing::uneven, 51}, opt));
    CHECK(test::run_case<T, fp8_e4m3>({4, 40, 256, 4, 16, test::routing::random, 52}, opt));
    CHECK(test::run_case<T, float>({2, 33, 200, 3, 8, test::routing::random, 53}, opt));
  }
}

TEST_CASE_TEMPLATE_DEFINE("a byte budget of 3 rows per peer: calls in rounds give the same bytes",
                          T, dc_budget) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  const auto codes =
      launch_local(3, [](local_bootstrap& boot) { return test::check_byte_budget<T>(boot); });
  CHECK(test::all_ok(codes, "byte budget"));
}

TEST_CASE_TEMPLATE_DEFINE("mask_lost_ranks: built over shm, refused on every rank elsewhere", T,
                          dc_mask_option) {
  using namespace epcomm;
  EPCOMM_SUITE_CONTEXT(T);
  // Over an RMA transport a proxy may hold puts to a lost peer and a peer's
  // exit is not always visible: asking for masking fails construction on
  // every rank rather than being ignored.
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    buffer_config cfg;
    cfg.num_experts = 4;
    cfg.max_hidden = 128;
    cfg.max_topk = 2;
    cfg.max_tokens_per_rank = 8;
    cfg.mask_lost_ranks = true;
    try {
      buffer<T, bf16> buf(boot, cfg);
      return peer_mapped_transport<T> ? 0 : test::fail_rank(boot.rank(), "masking accepted");
    } catch (const error& e) {
      const bool refused =
          std::string(e.what()).find("invalid config: mask_lost_ranks needs") != std::string::npos;
      return refused && !peer_mapped_transport<T> ? 0 : test::fail_rank(boot.rank(), e.what());
    }
  });
  CHECK(test::all_ok(codes, "mask_lost_ranks option"));
}

#define EPCOMM_DISPATCH_COMBINE_SUITE(T)            \
  TEST_CASE_TEMPLATE_INVOKE(dc_random, T);          \
  TEST_CASE_TEMPLATE_INVOKE(dc_adversarial, T);     \
  TEST_CASE_TEMPLATE_INVOKE(dc_extremes, T);        \
  TEST_CASE_TEMPLATE_INVOKE(dc_reference, T);       \
  TEST_CASE_TEMPLATE_INVOKE(dc_repeat, T);          \
  TEST_CASE_TEMPLATE_INVOKE(dc_bound, T);           \
  TEST_CASE_TEMPLATE_INVOKE(dc_alignment, T);       \
  TEST_CASE_TEMPLATE_INVOKE(dc_live_handles, T);    \
  TEST_CASE_TEMPLATE_INVOKE(dc_cached_dispatch, T); \
  TEST_CASE_TEMPLATE_INVOKE(dc_token_types, T);     \
  TEST_CASE_TEMPLATE_INVOKE(dc_async, T);           \
  TEST_CASE_TEMPLATE_INVOKE(dc_in_place, T);        \
  TEST_CASE_TEMPLATE_INVOKE(dc_budget, T);          \
  TEST_CASE_TEMPLATE_INVOKE(dc_mask_option, T)
