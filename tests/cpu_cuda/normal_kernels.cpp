// The normal-mode kernels of include/epcomm, compiled by the host compiler
// for the CPU execution layer: generic ones and the hidden-7168, 2-rank
// specialisation, for each token type.
#include "support/cpu_cuda/kernels.hpp"

#include "epcomm/normal/cuda/instantiate.cuh"

#define EPCOMM_CPU_NORMAL_KERNELS(TOKEN)       \
  EPCOMM_CUDA_INSTANTIATE_NORMAL(TOKEN, 0, 0); \
  EPCOMM_CUDA_INSTANTIATE_NORMAL(TOKEN, 2, 7168)

EPCOMM_CPU_NORMAL_KERNELS(epcomm::bf16);
EPCOMM_CPU_NORMAL_KERNELS(epcomm::fp8_e4m3);
EPCOMM_CPU_NORMAL_KERNELS(float);
