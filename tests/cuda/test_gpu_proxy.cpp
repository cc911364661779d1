// The GPU-fed proxy's check (bench/gpu/proxy_check.hpp) from CTest: on a
// machine with a GPU its kernels must move every block intact through the
// proxy over each RMA transport; without one, every rank must refuse at
// setup with an epcomm::error naming itself, "gpu proxy setup" and the CUDA
// call that failed, and nothing may hang or crash.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "epcomm/bootstrap/local.hpp"
#include "proxy_check.hpp"
#include "support/exit_codes.hpp"
#include "support/have_gpu.hpp"

using namespace epcomm;

namespace {

template <class Check>
void run_check(const char* what, Check check) {
  const auto codes = launch_local(2, [&](local_bootstrap& boot) {
    // Asked in the rank: CUDA must not be touched before fork().
    const bool gpu = test::have_gpu();
    const gpu_check::proxy_check_outcome out = check(boot);
    std::fprintf(stderr, "rank %d: code %d: %s\n", boot.rank(), out.code, out.text.c_str());
    if (gpu) return out.code;
    const std::string prefix = "epcomm: rank " + std::to_string(boot.rank()) + ": gpu proxy setup";
    return out.code == 2 && out.text.find(prefix) != std::string::npos &&
                   out.text.find("failed: cudaError") != std::string::npos
               ? 0
               : 1;
  });
  CHECK(test::all_ok(codes, what));
}

}  // namespace

#if defined(EPCOMM_TEST_LIBFABRIC)
TEST_CASE("libfabric: kernels drive the proxy, or setup says why they cannot") {
  run_check("gpu-fed libfabric", gpu_check::gpu_fed_exchange_libfabric);
}
#endif

#if defined(EPCOMM_TEST_UCX)
TEST_CASE("ucx: kernels drive the proxy, or setup says why they cannot") {
  run_check("gpu-fed ucx", gpu_check::gpu_fed_exchange_ucx);
}
#endif
