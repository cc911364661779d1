// The fault matrix over the shm transport (tests/support/fault_matrix.hpp):
// {exit, stall, drop} x {before_notify, mid_dispatch, mid_combine,
// low_latency}, then regrouping without the victim. The RMA transports run
// it in test_fault_matrix_libfabric.cpp and test_fault_matrix_ucx.cpp.
#include "epcomm/shm/transport.hpp"
#include "support/fault_matrix.hpp"

using namespace epcomm;

namespace {

// A 1 s deadline and a stall of 4 s that outlasts it.
const test::faults::timing shm_timing{std::chrono::milliseconds(1'000),
                                      std::chrono::milliseconds(4'000),
                                      std::chrono::milliseconds(2'500)};

}  // namespace

TEST_CASE("fault matrix over the shm transport: {exit, stall, drop} x protocol points") {
  using namespace test::faults;
  run_matrix<shm::transport>(every_action, every_point, shm_timing);
}

// Calls in rounds under a byte budget (windows of 4 rows per peer, 5 rounds
// or so a call): a fault between rounds of dispatch or combine.
TEST_CASE("fault matrix over the shm transport, calls in windows") {
  using namespace test::faults;
  run_matrix<shm::transport>(every_action, {fault::point::mid_dispatch, fault::point::mid_combine},
                             shm_timing, 4);
}

TEST_CASE("a malformed fault spec is an error, not a silently disarmed fault") {
  CHECK_THROWS_WITH_AS(fault::parse("rank=1,point=nowhere"),
                       doctest::Contains("unknown point 'nowhere'"), error);
  CHECK_THROWS_WITH_AS(fault::parse("point=mid_combine"), doctest::Contains("rank is required"),
                       error);
  CHECK_THROWS_WITH_AS(fault::parse("rank=x"), doctest::Contains("non-negative integer"), error);
  const auto p = fault::parse("rank=2,point=mid_dispatch,action=stall,stall_ms=5,hit=3");
  CHECK(p.rank == 2);
  CHECK(p.at == fault::point::mid_dispatch);
  CHECK(p.what == fault::action::stall);
  CHECK(p.stall == std::chrono::milliseconds(5));
  CHECK(p.hit == 3);
}

// One table per enum (core/enum_names.hpp) names and parses it.
static_assert(fault::action_names.parse("drop") == fault::action::drop);
static_assert(!fault::point_names.parse("nowhere").has_value());

TEST_CASE("every fault point and action reads back from its name") {
  for (auto at : test::faults::every_point)
    CHECK(fault::parse(std::string("rank=0,point=") + fault::name(at)).at == at);
  for (auto what : test::faults::every_action)
    CHECK(fault::parse(std::string("rank=0,action=") + fault::name(what)).what == what);
  CHECK(std::string(fault::name(static_cast<fault::action>(3))) == "?");
  CHECK_THROWS_WITH_AS(fault::parse("rank=0,action=explode"),
                       doctest::Contains("unknown action 'explode'"), error);
}
