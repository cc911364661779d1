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

#if defined(EPCOMM_TEST_LIBFABRIC)
#include "epcomm/libfabric/transport.hpp"
#endif
#if defined(EPCOMM_TEST_UCX)
#include "epcomm/ucx/transport.hpp"
#endif

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

// A peer whose process exits fails the others at once, not at their deadline.
TEST_CASE("normal exited peer on 3 ranks") {
  on_ranks(3, check_absent_peer<nvlink_ipc::transport, absence::exited>);
}

TEST_CASE("low-latency exited peer on 3 ranks") {
  on_ranks(3, check_ll_absent_peer<nvlink_ipc::transport, absence::exited>);
}

// mask_lost_ranks: the kernels go on without a rank that leaves, as the host
// engine does (ll_correctness.hpp: check_ll_lost_rank).
#define EPCOMM_LL_LOSS_CASE(HOW, SAYS)                                                     \
  TEST_CASE("low-latency masks a rank that leaves " SAYS " on 3 ranks") {                  \
    on_ranks(3, [](local_bootstrap& b) { return check_ll_lost_rank<>(b, ll_loss::HOW); }); \
  }

EPCOMM_LL_LOSS_CASE(after_a_call, "after a call")
EPCOMM_LL_LOSS_CASE(at_dispatch, "as its dispatch starts")
EPCOMM_LL_LOSS_CASE(before_combine, "before its combine")

// Through the GPU-fed proxy over libfabric and UCX (the provider or
// transports the test's environment names, on loopback): the kernels stage in
// this rank's buffer, in host memory here as for a fabric library without
// CUDA support (check_rma_memory), and hand puts to the proxy thread. Named
// "proxy ..." so that the per-mode runs above leave them to a run with that
// environment.
#if defined(EPCOMM_TEST_LIBFABRIC)
using fabric = epcomm::libfabric::transport;

TEST_CASE("proxy: normal bf16 over libfabric on 2 ranks") {
  on_ranks(2, [](local_bootstrap& b) { return check_rank<bf16, fabric>(b, true); });
}
TEST_CASE("proxy: low-latency bf16 over libfabric on 3 ranks") {
  on_ranks(3, [](local_bootstrap& b) { return check_ll_rank<bf16, fabric>(b, true); });
}
TEST_CASE("proxy: low-latency over libfabric masks a rank that leaves as its dispatch starts") {
  on_ranks(3,
           [](local_bootstrap& b) { return check_ll_lost_rank<fabric>(b, ll_loss::at_dispatch); });
}
TEST_CASE("proxy: normal exited peer over libfabric on 3 ranks") {
  on_ranks(3, check_absent_peer<fabric, absence::exited>);
}
TEST_CASE("proxy: low-latency exited peer over libfabric on 3 ranks") {
  on_ranks(3, check_ll_absent_peer<fabric, absence::exited>);
}
TEST_CASE("proxy: low-latency over libfabric masks a rank that leaves before its combine") {
  on_ranks(
      3, [](local_bootstrap& b) { return check_ll_lost_rank<fabric>(b, ll_loss::before_combine); });
}
#endif
#if defined(EPCOMM_TEST_UCX)
TEST_CASE("proxy: low-latency bf16 over ucx on 3 ranks") {
  on_ranks(3, [](local_bootstrap& b) { return check_ll_rank<bf16, ucx::transport>(b, true); });
}
TEST_CASE("proxy: low-latency over ucx masks a rank that leaves as its dispatch starts") {
  on_ranks(3, [](local_bootstrap& b) {
    return check_ll_lost_rank<ucx::transport>(b, ll_loss::at_dispatch);
  });
}
#endif
