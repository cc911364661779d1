// The default instantiation matrix for fp8 tokens, one translation unit per
// token type so a parallel build compiles the three side by side.
#include "epcomm/normal/cuda/instantiate.cuh"

EPCOMM_CUDA_INSTANTIATE_DEFAULT_MATRIX(::epcomm::fp8_e4m3);
