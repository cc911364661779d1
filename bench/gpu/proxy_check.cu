// Kernels and per-rank driver of proxy_check.hpp.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "epcomm/cuda/gpu_proxy.hpp"
#include "epcomm/proxy/channel.hpp"
#include "proxy_check.hpp"

#if defined(EPCOMM_GPU_PROXY_LIBFABRIC)
#include "epcomm/libfabric/transport.hpp"
#endif
#if defined(EPCOMM_GPU_PROXY_UCX)
#include "epcomm/ucx/transport.hpp"
#endif

namespace epcomm::gpu_check {

void default_to_loopback() {
  setenv("FI_PROVIDER", "tcp;ofi_rxm", 0);
  setenv("FI_TCP_IFACE", "lo", 0);
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_NET_DEVICES", "lo", 0);
}

namespace {

constexpr std::size_t region = (1 << 20) + 24;  // per (source, destination) block
constexpr int rounds = 3;

__host__ __device__ inline unsigned char proxy_pattern(int round, int src, int dst, std::size_t i) {
  return static_cast<unsigned char>((round * 89 + src * 131 + dst * 31 + i * 7 + (i >> 9)) & 0xff);
}

// What the kernel reports back: the first failed channel call and how many
// bytes differed.
struct kernel_result {
  std::int32_t status;  // proxy::channel_status
  std::int32_t peer;
  std::int32_t step;  // 1 push, 2 wait, 3 quiet
  std::uint32_t mismatches;
  std::uint64_t seen;  // the counter value a late wait last read
};

// Buffer layout: world receive regions (slot s: from source s), then world
// send regions (slot p: bound for peer p); signal slot s counts source s.
__global__ void exchange_kernel(proxy::channel ch, unsigned char* buf, int rank, int world,
                                int round, kernel_result* out) {
  const std::size_t send0 = static_cast<std::size_t>(world) * region;
  for (int p = 0; p < world; ++p)
    for (std::size_t i = threadIdx.x; i < region; i += blockDim.x)
      buf[send0 + p * region + i] = proxy_pattern(round, rank, p, i);
  // The NIC (or the proxy's memcpy to itself) reads these bytes once the
  // descriptor is out: every writer publishes them system-wide first.
  __threadfence_system();
  __syncthreads();
  __shared__ int failed;
  if (threadIdx.x == 0) {
    failed = 0;
    auto record = [&](proxy::channel_status s, int peer, int step, std::uint64_t seen) {
      if (s == proxy::channel_status::ok || failed) return;
      failed = 1;
      out->status = static_cast<std::int32_t>(s);
      out->peer = peer;
      out->step = step;
      out->seen = seen;
    };
    for (int p = 0; p < world && !failed; ++p) {
      const std::uint64_t from = send0 + p * region, to = static_cast<std::uint64_t>(rank) * region;
      if (round % 2 == 1) {
        record(ch.put_signal(p, from, to, region, rank, 1), p, 1, 0);
      } else {
        record(ch.put(p, from, to, region), p, 1, 0);
        if (!failed) record(ch.signal(p, rank, 1), p, 1, 0);
        if (!failed) record(ch.flush(p), p, 1, 0);
      }
    }
    for (int s = 0; s < world && !failed; ++s) {
      std::uint64_t seen = 0;
      record(ch.wait(s, round, &seen), s, 2, seen);
    }
    if (!failed) record(ch.quiet(), -1, 3, 0);
  }
  __syncthreads();
  if (failed) return;
  // The buffer may be host memory mapped into the device: read it afresh.
  const volatile unsigned char* recv = buf;
  unsigned bad = 0;
  for (int s = 0; s < world; ++s)
    for (std::size_t i = threadIdx.x; i < region; i += blockDim.x)
      bad += recv[s * region + i] != proxy_pattern(round, s, rank, i);
  if (bad != 0) atomicAdd(&out->mismatches, bad);
}

template <class Transport>
proxy_check_outcome exchange(local_bootstrap& boot) {
  const int rank = boot.rank(), world = boot.world_size();
  default_to_loopback();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) cudaSetDevice(rank % devices);
  const deadline dl = deadline::after(std::chrono::seconds(60));
  try {
    Transport t(boot, 2 * region * static_cast<std::size_t>(world), world, dl);
    cuda::gpu_proxy_options opt;
    opt.timeout = std::chrono::seconds(20);
    cuda::gpu_proxy<Transport> gp(t, opt);
    kernel_result* result = nullptr;
    cuda::check_cuda(cudaMalloc(&result, sizeof(kernel_result)), rank, "gpu proxy check", no_peer,
                     "cudaMalloc");
    for (int round = 1; round <= rounds; ++round) {
      cudaMemset(result, 0, sizeof(kernel_result));
      exchange_kernel<<<1, 256>>>(gp.channel(0),
                                  reinterpret_cast<unsigned char*>(gp.device_buffer()), rank, world,
                                  round, result);
      cuda::check_cuda(cudaGetLastError(), rank, "gpu proxy check", no_peer, "kernel launch");
      // The kernel's channel calls end by their deadlines, so this returns.
      cuda::check_cuda(cudaDeviceSynchronize(), rank, "gpu proxy check", no_peer,
                       "cudaDeviceSynchronize");
      kernel_result r{};
      cudaMemcpy(&r, result, sizeof r, cudaMemcpyDeviceToHost);
      const std::string where = "round " + std::to_string(round) + ": ";
      if (r.status != 0) {
        std::string text = where + "step " + std::to_string(r.step) + ", peer " +
                           std::to_string(r.peer) + ": " +
                           proxy::to_string(static_cast<proxy::channel_status>(r.status)) +
                           " (counter at " + std::to_string(r.seen) + ")";
        if (gp.engine().failed()) {
          try {
            gp.engine().rethrow();
          } catch (const error& e) {
            text += "; proxy: " + std::string(e.what());
          }
        }
        cudaFree(result);
        return {1, text};
      }
      if (r.mismatches != 0) {
        cudaFree(result);
        return {1, where + std::to_string(r.mismatches) + " bytes differ"};
      }
      t.barrier(dl);  // no rank still reads this round's blocks when the next is written
    }
    cudaFree(result);
    return {0, t.name()};
  } catch (const error& e) {
    return {2, e.what()};
  }
}

}  // namespace

#if defined(EPCOMM_GPU_PROXY_LIBFABRIC)
proxy_check_outcome gpu_fed_exchange_libfabric(local_bootstrap& boot) {
  return exchange<libfabric::transport>(boot);
}
#endif
#if defined(EPCOMM_GPU_PROXY_UCX)
proxy_check_outcome gpu_fed_exchange_ucx(local_bootstrap& boot) {
  return exchange<ucx::transport>(boot);
}
#endif

}  // namespace epcomm::gpu_check
