// The default low-latency combine kernels: bf16 rows whatever the dispatch
// wire was, so one set serves both.
#include "epcomm/low_latency/cuda/instantiate.cuh"

EPCOMM_CUDA_INSTANTIATE_LL_COMBINE_DEFAULT();
