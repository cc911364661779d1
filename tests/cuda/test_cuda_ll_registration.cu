// What a user does to add low-latency kernels for a hidden size the default
// matrix lacks: one macro in their own .cu file. Built with nvcc and run on
// the host (no GPU needed): the registrations happen at static
// initialisation, and the runtime switch must then pick them, or fall back
// to the generic kernels.
#include <doctest/doctest.h>

#include "epcomm/low_latency/cuda/instantiate.cuh"

EPCOMM_CUDA_INSTANTIATE_LOW_LATENCY(::epcomm::fp8_e4m3, 2048);
EPCOMM_CUDA_INSTANTIATE_LOW_LATENCY(::epcomm::bf16, 0);

using namespace epcomm;
using namespace epcomm::cuda;

TEST_CASE("low-latency instantiations in a user's .cu file reach the runtime switch") {
  const ll_kernel_registry& dispatch = ll_kernel_registry::dispatch();
  const ll_kernel_registry& combine = ll_kernel_registry::combine();
  const int fp8_id = token_traits<fp8_e4m3>::id;
  const int bf16_id = token_traits<bf16>::id;
  ll_kernel_pair k{};

  REQUIRE(dispatch.find(fp8_id, 2048, true, k));
  CHECK((k.send == &launch_ll_dispatch_send<fp8_e4m3, 2048>));
  CHECK((k.recv == &launch_ll_dispatch_recv<fp8_e4m3, 2048>));
  // No generic fp8 kernels here: an unaligned call or another size finds none.
  CHECK_FALSE(dispatch.find(fp8_id, 2048, false, k));
  CHECK_FALSE(dispatch.find(fp8_id, 7168, true, k));
  CHECK(dispatch.describe(fp8_id) == "hidden 2048");

  REQUIRE(dispatch.find(bf16_id, 7168, true, k));
  CHECK((k.send == &launch_ll_dispatch_send<bf16, 0>));

  // Combine kernels do not depend on the wire: both macros registered theirs.
  REQUIRE(combine.find(bf16_id, 2048, true, k));
  CHECK((k.send == &launch_ll_combine_send<2048>));
  CHECK((k.recv == &launch_ll_combine_recv<2048>));
  REQUIRE(combine.find(bf16_id, 2048, false, k));
  CHECK((k.send == &launch_ll_combine_send<0>));
  CHECK(combine.describe(bf16_id) == "hidden 2048, hidden any");
}
