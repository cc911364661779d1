// A gate on a CUDA stream: the work enqueued after it waits until the host
// opens it, as a slow producer would hold the stream. Checks use it to show
// that a call waits for what it was told to follow: while the gate is shut,
// nothing behind it, nor anything ordered after that, can have run. Then
// the order DeepEP's previous_event gives a call (check_after_event).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "epcomm/core/cuda_check.hpp"
#include "epcomm/cuda/call_stream.hpp"
#include "epcomm/cuda/device_event.hpp"

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

// `host` copied to `device` on `stream`, over memory zeroed first, so that a
// reader that runs before the copy sees zeros.
template <class T>
void copy_over_zeros(cudaStream_t stream, int rank, T* device, std::span<const T> host) {
  cuda::check_cuda(cudaMemset(device, 0, host.size_bytes()), rank, "gpu check", -1, "cudaMemset");
  cuda::check_cuda(
      cudaMemcpyAsync(device, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream), rank,
      "gpu check", -1, "cudaMemcpyAsync");
}

// Whether `e` gets done within `limit` (a call must not wait for work it
// does not follow).
inline bool done_within(const cuda::device_event& e, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!e.done())
    if (std::chrono::steady_clock::now() > until) return false;
  return true;
}

// The order of a call made with call_stream(stream).after(ready).on_comm()
// .async(): enqueue_input() (work on `stream`) held behind a gate, `ready`
// recorded after it, then a second gate; call(on) makes the call and returns
// its event. The event must not be done while the first gate is shut (the
// call follows `ready`), and must get done while the second still is (it
// follows nothing after `ready`). Returns what went wrong, or "".
template <class Input, class Call>
std::string check_after_event(cudaStream_t stream, int rank, Input&& enqueue_input, Call&& call) {
  const auto limit = std::chrono::seconds(30);
  cudaEvent_t ready = nullptr;
  cuda::check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), rank, "gpu check", -1,
                   "cudaEventCreateWithFlags");
  const std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> owner(ready, cudaEventDestroy);
  stream_gate before(stream, rank, limit);
  enqueue_input();
  cuda::check_cuda(cudaEventRecord(ready, stream), rank, "gpu check", -1, "cudaEventRecord");
  stream_gate after(stream, rank, limit);
  const cuda::device_event done = call(cuda::call_stream(stream).after(ready).on_comm().async());
  if (done.empty() || done.done()) return "its event was done before the event it follows";
  before.open();
  if (!done_within(done, limit)) return "it waited for work enqueued after the event it follows";
  after.open();
  return {};
}

}  // namespace epcomm::gpu_check
