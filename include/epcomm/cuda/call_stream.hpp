// epcomm::cuda::call_stream: where a device call runs among the caller's CUDA
// work, DeepEP's previous_event, async_finish and communication stream as
// one argument. A plain cudaStream_t converts to it: the call runs on that
// stream, in its order, as before.
//
//   buf.dispatch(in, opt, stream);                       // on `stream`
//   auto r = buf.dispatch(in, opt, call_stream(stream).after(ready).on_comm().async());
//   ...                                                   // compute overlaps
//   r.event.wait(stream);                                 // DeepEP's current_stream_wait
#pragma once

#include <cuda_runtime_api.h>

namespace epcomm::cuda {

struct call_stream {
  // The caller's stream (DeepEP's compute stream).
  cudaStream_t stream = nullptr;
  // previous_event: the call starts after it. Null: after the work already
  // on `stream` (which the call then follows wherever it runs).
  cudaEvent_t previous = nullptr;
  // Run on the buffer's own communication stream instead of `stream`.
  bool on_comm_stream = false;
  // With on_comm_stream: `stream` does not wait for the call; the caller
  // waits on the event the call returns. Under CUDA-graph capture that wait
  // must come before the capture ends (CUDA joins the forked stream there).
  bool async_finish = false;

  call_stream() = default;
  call_stream(cudaStream_t s) : stream(s) {}  // NOLINT(google-explicit-constructor): as before

  call_stream after(cudaEvent_t e) const {
    call_stream c = *this;
    c.previous = e;
    return c;
  }
  call_stream on_comm() const {
    call_stream c = *this;
    c.on_comm_stream = true;
    return c;
  }
  call_stream async() const {
    call_stream c = *this;
    c.async_finish = true;
    return c;
  }
};

}  // namespace epcomm::cuda
