// Include first in a translation unit that compiles epcomm's kernels with the
// host compiler, to run them on the CPU: the real toolkit's runtime header
// (types, enums, host declarations), then the device spellings of
// device_api.hpp in place of its keywords, the three inline-PTX helpers of
// cuda/device_sync.cuh routed to runtime.cpp (EPCOMM_DEVICE_CODE_ON_HOST), and
// EPCOMM_KERNEL_LAUNCH enqueueing on runtime.hpp's streams. The build puts
// tests/support/cpu_cuda/include (cub's BlockScan) before the toolkit's.
#pragma once

#define EPCOMM_DEVICE_CODE_ON_HOST 1

#include <cuda_runtime.h>

#include "support/cpu_cuda/device_api.hpp"
#include "support/cpu_cuda/runtime.hpp"

// Occupancy hints and a parameter-space qualifier: nothing to do on the CPU.
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __grid_constant__
#define __grid_constant__

// The kernels' `extern __shared__` arrays, by name (a kernel that declares
// another fails to link), each as large as a launch may ask (launch_on_stream
// checks): one copy per SM thread, like __shared__. (Built with
// -fno-extern-tls-init: g++ would otherwise call a dynamic initialiser
// through the kernels' block-scope extern declarations, which has none.)
namespace epcomm::cuda::device {
inline constexpr std::size_t shared_ints = test::cpu_cuda::max_dynamic_shared_bytes / sizeof(int);
alignas(16) inline thread_local std::byte dyn[test::cpu_cuda::max_dynamic_shared_bytes];
alignas(16) inline thread_local std::byte smem[test::cpu_cuda::max_dynamic_shared_bytes];
alignas(16) inline thread_local int expert_count[shared_ints];
alignas(16) inline thread_local int first_row[shared_ints];
}  // namespace epcomm::cuda::device

// cuda_runtime.h's typed overload, which it declares for nvcc only.
template <class... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

#define EPCOMM_KERNEL_LAUNCH(grid, block, shared_bytes, stream, ...)                            \
  [&](auto&&... epcomm_launch_args) {                                                           \
    ::epcomm::test::cpu_cuda::launch_on_stream(#__VA_ARGS__, grid, block, shared_bytes, stream, \
                                               __VA_ARGS__, epcomm_launch_args...);             \
  }
