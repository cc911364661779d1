// Compilation-environment switches shared by every epcomm header.
#pragma once

// EPCOMM_HD marks helpers that the host engine and the CUDA kernels share:
// one definition of the arithmetic, unit-tested on the host.
#if defined(__CUDACC__)
#define EPCOMM_HD __host__ __device__
#else
#define EPCOMM_HD
#endif
