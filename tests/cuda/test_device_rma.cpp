// Both modes' device buffers over an RMA transport (kernels that stage and
// hand puts to the GPU-fed proxy, docs/cuda.md "Between nodes") from CTest.
// On a machine with a GPU: the GPU check's quick scenarios
// (bench/gpu/correctness.hpp, ll_correctness.hpp: against the test suite's
// reference and the host engine, byte for byte) on 2 ranks. Without one:
// every rank refuses at construction with an epcomm::error naming itself
// and the CUDA query that failed, and nothing hangs.
#include <doctest/doctest.h>

#include <string>

#include "correctness.hpp"
#include "epcomm/bootstrap/local.hpp"
#include "epcomm/normal/cuda/device_buffer.hpp"
#include "epcomm/low_latency/cuda/device_buffer.hpp"
#include "ll_correctness.hpp"
#include "support/exit_codes.hpp"
#include "support/have_gpu.hpp"

#if defined(EPCOMM_TEST_LIBFABRIC)
#include "epcomm/libfabric/transport.hpp"
using link_transport = epcomm::libfabric::transport;
#elif defined(EPCOMM_TEST_UCX)
#include "epcomm/ucx/transport.hpp"
using link_transport = epcomm::ucx::transport;
#endif

using namespace epcomm;

namespace {

// Construction without a GPU must throw on this rank an error naming it,
// `op` and `says`.
template <class Construct>
int refused(local_bootstrap& boot, const char* op, const char* says, Construct construct) {
  try {
    construct();
    return test::fail_rank(boot.rank(), "constructed without a GPU");
  } catch (const error& e) {
    const std::string what = e.what();
    const bool named = what.find("rank " + std::to_string(boot.rank())) != std::string::npos &&
                       what.find(op) != std::string::npos && what.find(says) != std::string::npos;
    return named ? 0 : test::fail_rank(boot.rank(), "said: " + what);
  }
}

}  // namespace

TEST_CASE("normal-mode device buffer through the proxy: checked on a GPU, refused without one") {
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    // Asked in the rank: CUDA must not be touched before fork().
    if (test::have_gpu()) return gpu_check::check_rank<bf16, link_transport>(boot, true);
    const buffer_config cfg{4, 256, 2, 8};
    return refused(boot, "device buffer setup", "cudaGetDevice",
                   [&] { cuda::device_buffer<link_transport, fp8_e4m3> buf(boot, cfg); });
  });
  CHECK(test::all_ok(codes, "normal-mode device buffer over RMA"));
}

TEST_CASE("low-latency device buffer through the proxy: checked on a GPU, refused without one") {
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    if (test::have_gpu()) return gpu_check::check_ll_rank<bf16, link_transport>(boot, true);
    const low_latency_config cfg{4, 256, 2, 8};
    return refused(boot, "low_latency_buffer", "cannot query the current CUDA device", [&] {
      cuda::low_latency_device_buffer<link_transport, fp8_e4m3> buf(boot, cfg);
    });
  });
  CHECK(test::all_ok(codes, "low-latency device buffer over RMA"));
}
