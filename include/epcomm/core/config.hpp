// Compilation-environment switches shared by every epcomm header.
#pragma once

// EPCOMM_HD marks helpers that the host engine and the CUDA kernels share:
// one definition of the arithmetic, unit-tested on the host.
#if defined(__CUDACC__)
#define EPCOMM_HD __host__ __device__
#else
#define EPCOMM_HD
#endif

// Before a function template marked EPCOMM_HD whose instantiations may call
// host-only code (a host container behind a template parameter): nvcc then
// checks each instantiation where it is used, not the template (Thrust's
// __thrust_exec_check_disable__).
#if defined(__CUDACC__)
#define EPCOMM_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define EPCOMM_HD_TEMPLATE
#endif
