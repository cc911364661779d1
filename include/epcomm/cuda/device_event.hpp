// epcomm::cuda::device_event: DeepEP's EventOverlap for the device calls. A
// CUDA event recorded after a call's work, shared by its copies and
// destroyed with the last; the caller makes a stream wait for it (DeepEP's
// current_stream_wait) or waits for it on the host, within a deadline.
//
// The event orders and times work only: a call's errors come from its
// buffer's synchronize(), as for any call that does not synchronise.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>

#include "epcomm/core/cuda_check.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/spin_wait.hpp"

namespace epcomm::cuda {

class device_event {
 public:
  // Nothing to wait for.
  device_event() = default;

  // An event recorded on `stream` now; `limit` bounds a host wait for it.
  static device_event record(cudaStream_t stream, int rank, const char* op,
                             std::chrono::milliseconds limit) {
    auto s = std::make_shared<state>();
    s->rank = rank;
    s->op = op;
    s->limit = limit;
    check_cuda(cudaEventCreateWithFlags(&s->event, cudaEventDisableTiming), rank, op, no_peer,
               "cudaEventCreateWithFlags");
    check_cuda(cudaEventRecord(s->event, stream), rank, op, no_peer, "cudaEventRecord");
    device_event e;
    e.state_ = std::move(s);
    return e;
  }

  bool empty() const { return state_ == nullptr; }
  // The CUDA event (null when empty), valid while this object or a copy lives.
  cudaEvent_t get() const { return empty() ? nullptr : state_->event; }

  // Work enqueued on `stream` after this starts after the call's work.
  void wait(cudaStream_t stream) const {
    if (empty()) return;
    check_cuda(cudaStreamWaitEvent(stream, state_->event, 0), state_->rank, state_->op, no_peer,
               "cudaStreamWaitEvent");
  }

  // Whether the call's work has finished.
  bool done() const {
    if (empty()) return true;
    const cudaError_t status = cudaEventQuery(state_->event);
    if (status == cudaErrorNotReady) return false;
    check_cuda(status, state_->rank, state_->op, no_peer, "cudaEventQuery");
    return true;
  }

  // Blocks the host until done(), or throws at the deadline: the call's own
  // waits are bounded by the buffer's timeout, so only a stuck device (or
  // work the caller queued before the call) can take longer.
  void synchronize() const {
    if (empty()) return;
    const bool finished =
        ::epcomm::detail::spin_wait([&] { return done(); }, deadline::after(state_->limit), [] {});
    if (!finished)
      throw error(state_->rank, state_->op, no_peer,
                  "the call's work did not finish within " + std::to_string(state_->limit.count()) +
                      " ms (is the GPU oversubscribed, or is work it waits for stuck?)");
  }

 private:
  struct state {
    cudaEvent_t event = nullptr;
    int rank = 0;
    const char* op = "";
    std::chrono::milliseconds limit{};
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (event != nullptr) cudaEventDestroy(event);
    }
  };
  std::shared_ptr<state> state_;
};

}  // namespace epcomm::cuda
