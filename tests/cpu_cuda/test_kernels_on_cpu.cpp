// The kernels of include/epcomm run on the CPU (tests/support/cpu_cuda), end
// to end through cuda::device_buffer and cuda::low_latency_device_buffer over
// the nvlink_ipc transport, on forked ranks: bench/gpu's correctness and
// failure checks, each compared byte for byte with the host engine run on the
// same inputs and with the test suite's reference. One test case per mode,
// token type and rank count, so that CTest can spread them.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <vector>

#include "correctness.hpp"
#include "epcomm/bootstrap/local.hpp"
#include "ll_correctness.hpp"
#include "ll_wires.hpp"
#include "mixed_types.hpp"

namespace {

using namespace epcomm;
using namespace epcomm::gpu_check;

void on_ranks(int world, const std::function<int(local_bootstrap&)>& rank_check) {
  local_launch_options lo;
  lo.timeout = std::chrono::minutes(3);
  const std::vector<int> codes = launch_local(world, rank_check, lo);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << " of " << world << " (its failures are on stderr)");
    CHECK(codes[r] == 0);
  }
}

}  // namespace

#define EPCOMM_NORMAL_CASE(TOKEN, WORLD)                                             \
  TEST_CASE("normal " #TOKEN " on " #WORLD " ranks") {                               \
    on_ranks(WORLD, [](local_bootstrap& b) { return check_rank<TOKEN>(b, false); }); \
  }
#define EPCOMM_LL_CASE(TOKEN, WORLD)                                                    \
  TEST_CASE("low-latency " #TOKEN " on " #WORLD " ranks") {                             \
    on_ranks(WORLD, [](local_bootstrap& b) { return check_ll_rank<TOKEN>(b, false); }); \
  }

EPCOMM_NORMAL_CASE(bf16, 1)
EPCOMM_NORMAL_CASE(bf16, 2)
EPCOMM_NORMAL_CASE(bf16, 3)
EPCOMM_NORMAL_CASE(bf16, 4)
EPCOMM_NORMAL_CASE(fp8_e4m3, 1)
EPCOMM_NORMAL_CASE(fp8_e4m3, 2)
EPCOMM_NORMAL_CASE(float, 2)

// One buffer serving bf16, fp8 and fp32 calls (mixed_types.hpp).
TEST_CASE("normal every token type on one buffer on 3 ranks") {
  on_ranks(3, check_mixed_types_rank<>);
}
EPCOMM_LL_CASE(bf16, 1)
EPCOMM_LL_CASE(bf16, 2)
EPCOMM_LL_CASE(bf16, 3)
EPCOMM_LL_CASE(bf16, 4)
EPCOMM_LL_CASE(fp8_e4m3, 2)

// One buffer serving both wires, each call choosing its own (ll_wires.hpp).
TEST_CASE("low-latency both wires on one buffer on 3 ranks") { on_ranks(3, check_ll_wires_rank<>); }

// A block budget (max_blocks) below what the kernels would launch: the
// minimum each mode needs and an odd one; every kernel then loops.
#define EPCOMM_BUDGET_CASE(MODE, CHECK_RANK, TOKEN, WORLD, BLOCKS)                          \
  TEST_CASE(MODE " " #TOKEN " on " #WORLD " ranks, " #BLOCKS " blocks per kernel") {        \
    on_ranks(WORLD, [](local_bootstrap& b) { return CHECK_RANK<TOKEN>(b, true, BLOCKS); }); \
  }

EPCOMM_BUDGET_CASE("normal", check_rank, bf16, 3, 2)
EPCOMM_BUDGET_CASE("normal", check_rank, fp8_e4m3, 2, 3)
EPCOMM_BUDGET_CASE("low-latency", check_ll_rank, bf16, 3, 1)
EPCOMM_BUDGET_CASE("low-latency", check_ll_rank, fp8_e4m3, 2, 5)

TEST_CASE("normal absent peer on 3 ranks") { on_ranks(3, check_absent_peer<>); }

TEST_CASE("low-latency absent peer on 3 ranks") { on_ranks(3, check_ll_absent_peer<>); }
