// normal/window.hpp: the rounds a call in windows takes, the rows each round
// moves, the window a byte budget leaves; and the configs a budget is refused
// with, on every rank. The calls themselves are in the dispatch/combine suite
// ("a byte budget of 3 rows per peer"), over every transport.
#include <doctest/doctest.h>

#include <string>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/normal/buffer.hpp"
#include "epcomm/normal/capacity_agreement.hpp"
#include "epcomm/normal/window.hpp"
#include "epcomm/shm/transport.hpp"
#include "support/exit_codes.hpp"

using namespace epcomm;

namespace {

// Counts on 2 ranks: rank 0 sends 7 and 0, rank 1 sends 2 and 5.
constexpr int counts[] = {7, 0, 2, 5};
constexpr int none[] = {0, 0, 0, 0};

// 2 ranks, 8 experts, hidden <= 256, topk <= 4, 8 tokens, bf16 rows.
constexpr wire::capacity cap{2, 8, 256, 4, 8, 16, 16, 2, 2, false, 0};

constexpr std::size_t total_with(int window_rows, bool staging) {
  wire::capacity c = cap;
  c.window_rows = window_rows;
  return wire::plan_regions(c, staging).total;
}

}  // namespace

TEST_CASE("a call takes the rounds its largest pair needs, at least one") {
  static_assert(wire::window_rounds(counts, 2, 3) == 3);  // 7 rows: 3 + 3 + 1
  static_assert(wire::window_rounds(counts, 2, 7) == 1);
  static_assert(wire::window_rounds(counts, 2, 6) == 2);
  static_assert(wire::window_rounds(none, 2, 3) == 1);  // its signals still go
  CHECK(wire::slice_of(7, 0, 3).first == 0);
  CHECK(wire::slice_of(7, 0, 3).rows == 3);
  CHECK(wire::slice_of(7, 2, 3).first == 6);
  CHECK(wire::slice_of(7, 2, 3).rows == 1);
  CHECK(wire::slice_of(2, 1, 3).rows == 0);  // a pair done before the others
  CHECK(wire::slice_of(0, 0, 3).rows == 0);
}

TEST_CASE("a budget leaves the most rows per peer that fit, or none") {
  for (bool staging : {false, true}) {
    CAPTURE(staging);
    const std::size_t whole = wire::plan_regions(cap, staging, !staging).total;
    CHECK(wire::window_for_budget(cap, 0, staging, !staging) == 0);      // no budget
    CHECK(wire::window_for_budget(cap, whole, staging, !staging) == 0);  // whole calls fit
    CHECK(wire::budget_for_window(cap, 3, staging) == total_with(3, staging));
    CHECK(wire::window_for_budget(cap, total_with(3, staging), staging, !staging) == 3);
    CHECK(wire::window_for_budget(cap, total_with(3, staging) - 1, staging, !staging) == 2);
    CHECK(wire::window_for_budget(cap, total_with(1, staging) - 1, staging, !staging) == -1);
    // A window never passes max_tokens_per_rank: no pair has more rows.
    CHECK(wire::window_for_budget(cap, whole - 1, staging, !staging) <= cap.max_tokens_per_rank);
    CHECK(total_with(3, staging) < whole);
  }
}

TEST_CASE("a budget is refused on every rank where it cannot be kept") {
  auto refused = [](buffer_config cfg, const std::string& expected) {
    return test::all_ok(
        launch_local(2,
                     [&](local_bootstrap& boot) {
                       try {
                         buffer<shm::transport, bf16> buf(boot, cfg);
                       } catch (const error& e) {
                         if (std::string(e.what()).find(expected) != std::string::npos) return 0;
                         return test::fail_rank(boot.rank(), e.what());
                       }
                       return test::fail_rank(boot.rank(), "built");
                     }),
        expected);
  };
  buffer_config cfg{8, 256, 4, 8, 0, std::chrono::milliseconds(5'000)};
  cfg.max_buffer_bytes = 1000;
  CHECK(refused(cfg,
                "invalid config: max_buffer_bytes 1000 holds no receive window: one row "
                "per peer needs "));
  // An engine that sizes for whole calls (the device buffer, the
  // hierarchical engine) refuses a budget rather than ignoring it.
  cfg.max_buffer_bytes = 1 << 20;
  CHECK(test::all_ok(launch_local(2,
                                  [&](local_bootstrap& boot) {
                                    try {
                                      agree_capacity<bf16>(boot, cfg, cfg.timeout);
                                    } catch (const error& e) {
                                      return std::string(e.what()).find(
                                                 "invalid config: max_buffer_bytes needs the "
                                                 "flat host engine") != std::string::npos
                                                 ? 0
                                                 : test::fail_rank(boot.rank(), e.what());
                                    }
                                    return test::fail_rank(boot.rank(), "agreed");
                                  }),
                     "budget on an engine without windows"));
}
