// The CUDA runtime as the kernels' host code sees it, on the CPU: runtime.cpp
// defines the cuda* functions epcomm's device buffers, the nvlink_ipc
// transport and bench/gpu's checks call on that path (over the real toolkit's
// declarations, so the code compiles as it does for a GPU; the GPU-fed
// proxy's host-memory calls are not among them), and this header adds the
// one thing nvcc would generate: kernel launches, enqueued on a stream
// (launch_on_stream, what EPCOMM_KERNEL_LAUNCH expands to in kernels.hpp).
//
// Device memory is host memory: cudaMalloc maps a memfd, which
// cudaIpcOpenMemHandle maps again in another process, as CUDA IPC maps a
// peer GPU's allocation. A created stream runs its operations in order on a
// thread of its own, so streams overlap each other and the host as on a GPU
// and only events order them (cudaEventRecord, cudaStreamWaitEvent); the
// legacy default stream (null) runs each operation in place after the
// blocking streams' earlier work, as do cudaMemcpy and cudaMemset. While
// captured into a graph a stream records its operations for cudaGraphLaunch
// to replay, and a stream that waits on an event recorded into the capture
// joins it (CUDA's fork and join). A kernel that faults (device_fault) is reported
// on stderr and makes the process's CUDA context sticky-broken, as a device
// exception would: every later call returns cudaErrorLaunchFailure.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "support/cpu_cuda/dim3.hpp"
#include "support/cpu_cuda/grid.hpp"

namespace epcomm::test::cpu_cuda {

// An H200's: what cudaDeviceGetAttribute reports and what a launch may ask.
inline constexpr std::size_t max_dynamic_shared_bytes = 232448;

// How kernels run, from the environment at first use:
//   EPCOMM_CPU_CUDA_SMS       OS threads per grid (default 2);
//   EPCOMM_CPU_CUDA_SEED      first schedule seed (default 1), advanced per launch;
//   EPCOMM_CPU_CUDA_DEADLINE_MS  a grid's deadline (default 120000), past which it faults.
// The device reports `sms` multiprocessors, so the buffers size their grids
// for them, and a grid whose blocks wait on blocks that are not running
// deadlocks here as it could on a busy GPU.
struct device_settings {
  unsigned sms;
  std::uint64_t seed;
  std::chrono::milliseconds deadline;
};
const device_settings& settings();

// Runs `op` in `stream`'s order (see above).
void enqueue(cudaStream_t stream, std::function<void()> op);
// What the next cudaGetLastError returns (a launch CUDA would refuse).
void set_launch_error(cudaError_t e);
// Runs one grid; a fault becomes the sticky error, its text on stderr.
void run_grid(const char* kernel, const std::function<void(const launch_options&)>& grid);

template <class... Params, class... Args>
void launch_on_stream(const char* name, dim3 grid, dim3 block, std::size_t shared,
                      cudaStream_t stream, void (*kernel)(Params...), Args&&... args) {
  if (grid.volume() == 0 || block.volume() == 0 || block.volume() > max_threads_per_block) {
    set_launch_error(cudaErrorInvalidConfiguration);
    return;
  }
  if (shared > max_dynamic_shared_bytes) {
    set_launch_error(cudaErrorInvalidValue);
    return;
  }
  // Converted to the parameter types now, as CUDA copies a launch's
  // arguments when it is enqueued (and a graph when it is captured).
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  enqueue(stream, [=] {
    run_grid(name, [&](const launch_options& opt) {
      std::apply([&](const auto&... p) { launch(grid, block, opt, kernel, p...); }, params);
    });
  });
}

}  // namespace epcomm::test::cpu_cuda
