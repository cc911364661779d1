// The low-latency device buffer over an RMA transport (kernels that stage
// and hand puts to the GPU-fed proxy, docs/cuda.md) from CTest. On a machine
// with a GPU: the GPU check's quick scenarios (bench/gpu/ll_correctness.hpp,
// against the test suite's reference and the host engine, byte for byte) on
// 2 ranks. Without one: every rank refuses at construction, together, with
// an epcomm::error naming itself and the device it could not query, and
// nothing hangs.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <string>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/cuda/low_latency_buffer.hpp"
#include "ll_correctness.hpp"
#include "support/exit_codes.hpp"

#if defined(EPCOMM_TEST_LIBFABRIC)
#include "epcomm/libfabric/transport.hpp"
using link_transport = epcomm::libfabric::transport;
#elif defined(EPCOMM_TEST_UCX)
#include "epcomm/ucx/transport.hpp"
using link_transport = epcomm::ucx::transport;
#endif

using namespace epcomm;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace

TEST_CASE("low-latency device buffer through the proxy: checked on a GPU, refused without one") {
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    // Asked in the rank: CUDA must not be touched before fork().
    if (have_gpu()) return gpu_check::check_ll_rank<bf16, link_transport>(boot, true);
    const low_latency_config cfg{4, 256, 2, 8};
    try {
      cuda::low_latency_device_buffer<link_transport, fp8_e4m3> buf(boot, cfg);
      return test::fail_rank(boot.rank(), "constructed without a GPU");
    } catch (const error& e) {
      const std::string what = e.what();
      const bool named = what.find("rank " + std::to_string(boot.rank())) != std::string::npos &&
                         what.find("low_latency_buffer") != std::string::npos &&
                         what.find("cannot query the current CUDA device") != std::string::npos;
      return named ? 0 : test::fail_rank(boot.rank(), "said: " + what);
    }
  });
  CHECK(test::all_ok(codes, "low-latency device buffer over RMA"));
}
