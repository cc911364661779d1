// The default low-latency dispatch kernels for the fp8 wire (bf16 input cast
// on the device, one scale per 128 channels).
#include "epcomm/low_latency/cuda/instantiate.cuh"

EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH_DEFAULT(::epcomm::fp8_e4m3);
