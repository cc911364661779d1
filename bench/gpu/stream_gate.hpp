// A gate on a CUDA stream: the work enqueued after it waits until the host
// opens it, as a slow producer would hold the stream. Checks use it to show
// that a call waits for what it was told to follow: while the gate is shut,
// nothing behind it, nor anything ordered after that, can have run.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "epcomm/core/cuda_check.hpp"

namespace epcomm::gpu_check {

class stream_gate {
 public:
  // Shut on `stream`: a host function there blocks until open(), or for at
  // most `limit` (so a check that never opens it fails instead of hanging).
  stream_gate(cudaStream_t stream, int rank, std::chrono::milliseconds limit)
      : stream_(stream), state_(std::make_unique<state>()) {
    state_->limit = limit;
    cuda::check_cuda(cudaLaunchHostFunc(stream, &hold, state_.get()), rank, "gpu check", -1,
                     "cudaLaunchHostFunc(gate)");
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;
  // The host function must have run before its state goes.
  ~stream_gate() {
    open();
    cudaStreamSynchronize(stream_);
  }

  void open() { state_->opened.store(true, std::memory_order_release); }
  // Whether the gate gave up waiting for open().
  bool expired() const { return state_->expired.load(std::memory_order_acquire); }

 private:
  struct state {
    std::atomic<bool> opened{false};
    std::atomic<bool> expired{false};
    std::chrono::milliseconds limit{};
  };

  static void hold(void* p) {
    auto& s = *static_cast<state*>(p);
    const auto until = std::chrono::steady_clock::now() + s.limit;
    while (!s.opened.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() > until) {
        s.expired.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  cudaStream_t stream_;
  std::unique_ptr<state> state_;
};

}  // namespace epcomm::gpu_check
