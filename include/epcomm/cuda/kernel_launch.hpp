// The one spelling of a kernel launch in epcomm's instantiation headers:
//
//   EPCOMM_KERNEL_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...);
//
// is kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc. A
// build that compiles the kernels with a host compiler, to run them on the
// CPU (the test suite's execution layer, tests/support/cpu_cuda), defines the
// macro before including them, to enqueue the launch on its own streams.
#pragma once

#if !defined(EPCOMM_KERNEL_LAUNCH)
#define EPCOMM_KERNEL_LAUNCH(grid, block, shared_bytes, stream, ...) \
  __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#endif
