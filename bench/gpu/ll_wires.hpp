// One low-latency device buffer serving the bf16 and the fp8 wire, each call
// choosing its own (DeepEP's per-call use_fp8), checked on every rank
// against a host engine serving the same two, call by call with
// ll_correctness.hpp's checks (the reference, the packed outputs and the
// wire bytes): fp8 then bf16 calls in the same regions, one of each in flight
// on the two parities, and the last rank dispatching fp8 among bf16, which
// every rank must fail with the host engine's message naming a rank of the
// other wire, the buffer serving both wires after. Then a two-wire buffer of
// a hidden with no whole 128-blocks: bf16 calls go, fp8 calls fail alike.
#pragma once

#include <chrono>
#include <string>

#include "ll_correctness.hpp"

namespace epcomm::gpu_check {

template <class Link = nvlink_ipc::transport>
int check_ll_wires_rank(local_bootstrap& boot) {
  rank_check rc(boot.rank());
  const int rank = rc.rank, world = boot.world_size(), last = world - 1;
  low_latency_config cfg{8 * world, 512, 8, 16, false, std::chrono::seconds(60)};
  cfg.scale_layout = ll_scale_layout::token_major;
  ll_engines<bf16, Link, fp8_e4m3> e(boot, cfg, rc.stream);
  using test::routing;
  auto make = [&](int tokens, int topk, routing route, std::uint64_t seed) {
    return test::make_ll_call(world, cfg.hidden, topk, cfg.num_experts,
                              ll_tokens(world, tokens, cfg.max_tokens_per_rank, seed), route, seed);
  };
  try {
    rc.note("ll fp8 on a two-wire buffer",
            run_ll_call<fp8_e4m3>(e, make(-1, 8, routing::random, 1), false));
    rc.note("ll bf16 on a two-wire buffer",
            run_ll_call<bf16>(e, make(-1, 8, routing::uneven, 2), true));
    rc.note("ll bf16 and fp8 in flight",
            run_ll_two_in_flight<bf16, fp8_e4m3>(e, make(-1, 6, routing::random, 3),
                                                 make(-1, 8, routing::uneven, 4)));
    const auto odd = make(4, 2, routing::random, 5);
    const auto& in = odd.in[rank];
    const ll_dispatch_input hin{odd.tokens[rank], odd.topk, in.x, in.topk_idx};
    const ll_device_call din(in, odd.tokens[rank], odd.topk);
    const caught h = catch_error([&] {
      if (rank == last)
        e.host.template low_latency_dispatch<fp8_e4m3>(hin);
      else
        e.host.low_latency_dispatch(hin);
    });
    const caught d = catch_error([&] {
      if (rank == last)
        e.dev.template dispatch<fp8_e4m3>(din.dispatch(), e.stream);
      else
        e.dev.dispatch(din.dispatch(), e.stream);
      e.dev.synchronize(e.stream);
    });
    const std::string expected = rank == last
                                     ? "that rank dispatched bf16 records, this rank fp8_e4m3"
                                     : "that rank dispatched fp8_e4m3 records, this rank bf16";
    std::string err = same_failure(h, d, "the last rank dispatching fp8 among bf16");
    if (err.empty() && d.what.find(expected) == std::string::npos)
      err = "unexpected message " + d.what;
    rc.note("ll wires that disagree", err);
    rc.note("ll bf16 after the disagreement",
            run_ll_call<bf16>(e, make(-1, 8, routing::random, 6), false));
    rc.note("ll fp8 after the disagreement",
            run_ll_call<fp8_e4m3>(e, make(-1, 8, routing::random, 7), true));

    // A hidden of no whole 128-blocks (gpt-oss's 2880; 200 here): bf16 calls
    // move rows, and an fp8 call fails every rank with the host engine's
    // message, before the kernels read any row.
    low_latency_config narrow_cfg = cfg;
    narrow_cfg.hidden = 200;
    ll_engines<bf16, Link, fp8_e4m3> narrow(boot, narrow_cfg, rc.stream);
    const auto narrow_call = test::make_ll_call(
        world, narrow_cfg.hidden, 8, narrow_cfg.num_experts,
        ll_tokens(world, -1, narrow_cfg.max_tokens_per_rank, 8), routing::random, 8);
    rc.note("ll bf16 with hidden 200", run_ll_call<bf16>(narrow, narrow_call, false));
    const auto& nin = narrow_call.in[rank];
    const ll_device_call ndin(nin, narrow_call.tokens[rank], narrow_call.topk);
    const caught nh = catch_error([&] {
      narrow.host.template low_latency_dispatch<fp8_e4m3>(
          {narrow_call.tokens[rank], narrow_call.topk, nin.x, nin.topk_idx});
    });
    const caught nd = catch_error([&] {
      narrow.dev.template dispatch<fp8_e4m3>(ndin.dispatch(), narrow.stream);
      narrow.dev.synchronize(narrow.stream);
    });
    err = same_failure(nh, nd, "ll fp8 with hidden 200");
    if (err.empty() && nd.what.find("hidden 200 is not a multiple of 128") == std::string::npos)
      err = "unexpected message " + nd.what;
    rc.note("ll fp8 with hidden 200", err);
  } catch (const error& ex) {
    rc.note("ll two-wire buffer", std::string("threw: ") + ex.what());
  }
  return rc.exit_code();
}

}  // namespace epcomm::gpu_check
