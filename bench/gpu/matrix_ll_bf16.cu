// The default low-latency dispatch kernels for the bf16 wire; one translation
// unit per wire type (and one for combine) so a parallel build compiles them
// side by side.
#include "epcomm/low_latency/cuda/instantiate.cuh"

EPCOMM_CUDA_INSTANTIATE_LL_DISPATCH_DEFAULT(::epcomm::bf16);
