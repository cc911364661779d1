// What a user does to add kernels for a shape the default matrix lacks: one
// macro in their own .cu file. Built with nvcc and run on the host (no GPU
// needed): the registrations happen at static initialisation, and the
// runtime switch must then pick them, or fall back to the generic kernels.
#include <doctest/doctest.h>

#include "epcomm/normal/cuda/instantiate.cuh"

EPCOMM_CUDA_INSTANTIATE_NORMAL(::epcomm::bf16, 3, 2880);
EPCOMM_CUDA_INSTANTIATE_NORMAL(::epcomm::bf16, 0, 0);
EPCOMM_CUDA_INSTANTIATE_NORMAL(::epcomm::fp8_e4m3, 0, 0);

using namespace epcomm;
using namespace epcomm::cuda;

TEST_CASE("instantiations in a user's .cu file reach the runtime switch") {
  const kernel_registry& reg = kernel_registry::global();
  const int bf16_id = token_traits<bf16>::id;
  normal_kernels k{};

  REQUIRE(reg.find(bf16_id, 3, 2880, true, k));
  CHECK((k.dispatch == &launch_dispatch<bf16, 3, 2880>));
  CHECK((k.combine == &launch_combine<bf16, 3, 2880>));

  // Unaligned rows cannot use the hidden-specialised kernels; other shapes
  // fall back to the generic ones.
  REQUIRE(reg.find(bf16_id, 3, 2880, false, k));
  CHECK((k.dispatch == &launch_dispatch<bf16, 0, 0>));
  REQUIRE(reg.find(bf16_id, 4, 2880, true, k));
  CHECK((k.dispatch == &launch_dispatch<bf16, 0, 0>));

  // fp8 tokens combine in bf16.
  REQUIRE(reg.find(token_traits<fp8_e4m3>::id, 8, 7168, true, k));
  CHECK((k.dispatch == &launch_dispatch<fp8_e4m3, 0, 0>));
  CHECK((k.combine == &launch_combine<bf16, 0, 0>));

  // Nothing instantiated for fp32 here: no kernels, and a clear description.
  CHECK_FALSE(reg.find(token_traits<float>::id, 2, 128, true, k));
  CHECK(reg.describe(token_traits<float>::id) == "none");
  CHECK(reg.describe(bf16_id) == "(ranks 3, hidden 2880), (ranks any, hidden any)");
}
