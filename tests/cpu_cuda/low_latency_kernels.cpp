// The low-latency kernels of include/epcomm, compiled by the host compiler
// for the CPU execution layer: generic ones and the hidden-7168
// specialisation, for both wires.
#include "support/cpu_cuda/kernels.hpp"

#include "epcomm/low_latency/cuda/instantiate.cuh"

EPCOMM_CUDA_INSTANTIATE_LOW_LATENCY(epcomm::bf16, 0);
EPCOMM_CUDA_INSTANTIATE_LOW_LATENCY(epcomm::bf16, 7168);
EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH(epcomm::fp8_e4m3, 0);
EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH(epcomm::fp8_e4m3, 7168);
