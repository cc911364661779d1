// Low-latency mode with mask_lost_ranks over shared memory: after a rank's
// process exits, the survivors keep dispatching and combining without it,
// its experts' contributions skipped and counted; a peer that is only slow
// still fails at its deadline. (Without the option the same loss fails every
// survivor: ll_suite.hpp's dead-peer case.)
#include <cstdio>
#include <thread>
#include <vector>

#include "epcomm/shm/transport.hpp"
#include "support/ll_suite.hpp"

namespace {

using namespace epcomm;
using namespace epcomm::test::ll;

// `call` as the survivors see it once rank `lost` is gone: it sends nothing,
// and every (token, top-k slot) routed to one of its experts contributes
// nothing, like an unrouted slot. Returns how many such slots `rank` has.
std::uint64_t without_rank(test::ll_call& call, int lost, int local_experts, int rank) {
  call.tokens[lost] = 0;
  std::uint64_t masked = 0;
  for (std::size_t r = 0; r < call.in.size(); ++r)
    for (auto& e : call.in[r].topk_idx)
      if (e >= 0 && e / local_experts == lost) {
        e = -1;
        if (static_cast<int>(r) == rank) ++masked;
      }
  return masked;
}

low_latency_config masked_config(const ll_case& c, std::chrono::milliseconds timeout) {
  low_latency_config cfg = config_of(c);
  cfg.timeout = timeout;
  cfg.mask_lost_ranks = true;
  return cfg;
}

TEST_CASE("a lost rank is masked: survivors keep going without its experts") {
  const ll_case c{.world = 3, .hidden = 1024, .experts = 6, .max_topk = 4, .max_tokens = 16};
  constexpr int lost = 2;
  constexpr int calls_after = 4;
  const auto start = steady::now();
  const auto codes = launch_local(c.world, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    low_latency_buffer<shm::transport> buf(boot, masked_config(c, std::chrono::seconds(20)));
    if (const int code =
            checked_round_trip(buf, c, make_call(c, {-1, 4}, 2000), rank, "before the loss", 10);
        code != 0)
      return code;
    if (rank == lost) return 0;  // leaves: its process exits
    std::uint64_t masked_total = 0;
    for (int i = 0; i < calls_after; ++i) {
      const auto call = make_call(c, {-1, 4}, 2001 + i);
      auto reference = call;
      const std::uint64_t masked = without_rank(reference, lost, c.local_experts(), rank);
      const std::uint64_t before = buf.stats().masked_contributions;
      const auto res = buf.low_latency_dispatch(input_of(call, rank));
      if (auto e = test::check_ll_dispatch(reference, rank, c.world, c.max_tokens, false, res);
          !e.empty()) {
        std::fprintf(stderr, "rank %d: call %d: dispatch: %s\n", rank, i, e.c_str());
        return 20;
      }
      const auto out =
          buf.low_latency_combine(zero_copy_outputs(buf, c, call, rank, res), res.handle);
      if (auto e = test::check_ll_combine<bf16>(reference, rank, false, out); !e.empty()) {
        std::fprintf(stderr, "rank %d: call %d: combine: %s\n", rank, i, e.c_str());
        return 21;
      }
      const std::uint64_t counted = buf.stats().masked_contributions - before;
      if (counted != masked) {
        std::fprintf(stderr, "rank %d: call %d: %llu contributions masked, expected %llu\n", rank,
                     i, static_cast<unsigned long long>(counted),
                     static_cast<unsigned long long>(masked));
        return 22;
      }
      masked_total += masked;
    }
    if (buf.lost_ranks() != std::vector<int>{lost}) {
      std::fprintf(stderr, "rank %d: lost_ranks() does not name exactly rank %d\n", rank, lost);
      return 23;
    }
    // Random routing over 6 experts must have reached rank 2's: otherwise
    // nothing above was masked and the checks prove nothing.
    return masked_total > 0 ? 0 : 24;
  });
  CHECK(all_ok(codes, "mask a lost rank"));
  // The deadline is 20 s: the loss was seen as the process's exit.
  CHECK(steady::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a slow peer is not masked: its deadline still fails the call") {
  // It is alive and could still write into this rank's regions later.
  const ll_case c{.world = 2, .hidden = 1024, .experts = 4, .max_topk = 2, .max_tokens = 8};
  const auto codes = launch_local(c.world, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    low_latency_buffer<shm::transport> buf(boot, masked_config(c, std::chrono::milliseconds(300)));
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return 0;
    }
    const auto call = make_call(c, {8, 2}, 2100);
    if (const int code = expect_error(
            rank, [&] { buf.low_latency_dispatch(input_of(call, rank)); },
            "deadline expired waiting for dispatch records", 1);
        code != 0)
      return code;
    return buf.lost_ranks().empty() ? 0 : 3;
  });
  CHECK(all_ok(codes, "a slow peer under mask_lost_ranks"));
}

}  // namespace
