// What both GPU buffers (normal/cuda/device_buffer.hpp,
// low_latency/cuda/device_buffer.hpp) do around their kernels, written once:
// the one device workspace their kernels keep state in, with the kernels'
// Report at its end and a pinned host copy of it; launches that break the
// buffer when they fail (peers are then left mid-protocol); the stream a
// call runs on (call_stream: the caller's, or the buffer's communication
// stream) and the event it returns; and the end of a call: a wait for the
// stream bounded on the host, the report read, and the host engine's error
// for what it says.
//
// Report is a mode's device report (normal/report.hpp, low_latency/report.hpp):
// trivially copyable, with a failure `code` whose zero is "none" and a
// sticky `broken` word.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "epcomm/core/call_guard.hpp"
#include "epcomm/core/cuda_check.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/spin_wait.hpp"
#include "epcomm/core/wire_basics.hpp"
#include "epcomm/cuda/call_stream.hpp"
#include "epcomm/cuda/device_event.hpp"

namespace epcomm::cuda {

template <class Report>
class device_calls {
 public:
  device_calls(int rank, std::chrono::milliseconds timeout) : rank_(rank), timeout_(timeout) {}
  device_calls(const device_calls&) = delete;
  device_calls& operator=(const device_calls&) = delete;
  ~device_calls() { release(); }

  // One device allocation, zeroed, for the arrays `regions` took (a carver
  // aligned to 16) and the report after them, and a pinned host report with
  // `host_extra` bytes after it. init(start) sets up the rest before the
  // device synchronises. Returns the workspace's start. `op` names the
  // buffer's construction in errors.
  template <class Init>
  std::byte* allocate(wire::carver regions, std::size_t host_extra, const char* op, Init&& init) {
    try {
      int device = 0;
      check(cudaGetDevice(&device), op, "cudaGetDevice");
      check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device), op,
            "cudaDeviceGetAttribute(multiProcessorCount)");
      const std::size_t rep = regions.take(sizeof(Report));
      check(cudaMalloc(&workspace_, regions.at()), op, "cudaMalloc(workspace)");
      check(cudaMemset(workspace_, 0, regions.at()), op, "cudaMemset(workspace)");
      auto* start = static_cast<std::byte*>(workspace_);
      device_report_ = reinterpret_cast<Report*>(start + rep);
      std::forward<Init>(init)(start);
      check(cudaDeviceSynchronize(), op, "cudaDeviceSynchronize");
      void* pinned = nullptr;
      check(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), op,
            "cudaEventCreateWithFlags");
      check(cudaMallocHost(&pinned, sizeof(Report) + host_extra), op, "cudaMallocHost(report)");
      host_report_ = static_cast<Report*>(pinned);
      std::memset(pinned, 0, sizeof(Report) + host_extra);
      return start;
    } catch (...) {
      release();
      throw;
    }
  }

  // Where the kernels write their report.
  Report* device_report() const { return device_report_; }
  // The last report finish() read.
  const Report& report() const { return *host_report_; }
  // allocate()'s host_extra bytes (pinned).
  std::byte* host_extra() { return reinterpret_cast<std::byte*>(host_report_ + 1); }

  // The blocks one kernel launch may use: the config's max_blocks, or two
  // per SM when it is 0 (the kernels loop, so more would only queue).
  int block_budget(int max_blocks) const {
    return max_blocks > 0 ? max_blocks : 2 * std::max(sm_count_, 1);
  }
  std::uint64_t timeout_ns() const {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count());
  }

  void check(cudaError_t status, const char* op, const char* call) const {
    check_cuda(status, rank_, op, no_peer, call);
  }

  // Throws for `op` once a call has broken the buffer.
  void ensure_usable(const char* op) const { guard_.check(rank_, op, false); }
  bool broken() const { return guard_.broken(); }

  // A kernel that could not even be launched leaves peers mid-protocol.
  void launch(const char* op, int launch_status) {
    guard_.run([&] { check(static_cast<cudaError_t>(launch_status), op, "kernel launch"); },
               [](int) {});
  }

  static bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
           status != cudaStreamCaptureStatusNone;
  }

  // The stream a call runs on, ordered after what `c` says it follows: its
  // previous event, else the work already on the caller's stream.
  cudaStream_t enter(const call_stream& c, const char* op) {
    const cudaStream_t exec = c.on_comm_stream ? comm_stream(op) : c.stream;
    if (c.previous != nullptr) {
      check(cudaStreamWaitEvent(exec, c.previous, 0), op, "cudaStreamWaitEvent(previous)");
    } else if (exec != c.stream) {
      check(cudaEventRecord(fork_, c.stream), op, "cudaEventRecord(caller's stream)");
      check(cudaStreamWaitEvent(exec, fork_, 0), op, "cudaStreamWaitEvent(caller's stream)");
    }
    return exec;
  }

  // After a call's work on `exec`: its event, which the caller's stream
  // waits for unless the call finishes asynchronously.
  device_event leave(const call_stream& c, cudaStream_t exec, const char* op) {
    device_event e = device_event::record(exec, rank_, op, host_limit());
    if (exec != c.stream && !c.async_finish) e.wait(c.stream);
    return e;
  }

  // `stream`'s later work follows what the communication stream holds, so
  // that a wait for `stream` covers the calls that ran there too.
  void join_comm(cudaStream_t stream, const char* op) {
    if (comm_ == nullptr) return;
    check(cudaEventRecord(fork_, comm_), op, "cudaEventRecord(communication stream)");
    check(cudaStreamWaitEvent(stream, fork_, 0), op, "cudaStreamWaitEvent(communication stream)");
  }

  // Waits for the stream with a host deadline: the kernels bound each wait
  // by the timeout, and a call makes at most three waits in sequence.
  void wait_stream(cudaStream_t stream, const char* op) {
    const auto limit = host_limit();
    cudaError_t status = cudaSuccess;
    const bool done = ::epcomm::detail::spin_wait(
        [&] {
          status = cudaStreamQuery(stream);
          return status != cudaErrorNotReady;
        },
        deadline::after(limit), [] {});
    guard_.run(
        [&] {
          if (!done)
            throw error(
                rank_, op, no_peer,
                "the device did not finish the enqueued work within " +
                    std::to_string(
                        std::chrono::duration_cast<std::chrono::milliseconds>(limit).count()) +
                    " ms (is the GPU oversubscribed or another kernel stuck?)");
          check(status, op, "the enqueued kernels");
        },
        [](int) {});
  }

  // Reads the report after the work on `stream` and throws what it
  // recorded: describe(report) is the mode's error for it. A failure that
  // breaks(report) (or one before it) breaks the buffer; any other is a
  // verdict every rank reached together, cleared so the buffer goes on.
  template <class Describe, class Breaks>
  void finish(cudaStream_t stream, const char* op, Describe&& describe, Breaks&& breaks) {
    check(cudaMemcpyAsync(host_report_, device_report_, sizeof(Report), cudaMemcpyDeviceToHost,
                          stream),
          op, "cudaMemcpyAsync(report)");
    wait_stream(stream, op);
    const Report r = *host_report_;
    if (r.code == decltype(r.code){} && r.broken == 0) return;
    const error e = describe(r);
    if (breaks(r) || r.broken != 0) {
      guard_.mark_broken(e);
    } else {
      check(cudaMemsetAsync(&device_report_->code, 0, sizeof(device_report_->code), stream), op,
            "cudaMemsetAsync(report)");
      wait_stream(stream, op);
    }
    throw e;
  }

  // `cause` into a kernel argument's fixed buffer, NUL-terminated.
  static void copy_cause(char (&out)[wire::cause_bytes], const std::string& cause) {
    std::memset(out, 0, sizeof out);
    std::memcpy(out, cause.data(), std::min(cause.size(), sizeof out - 1));
  }

 private:
  std::chrono::milliseconds host_limit() const { return 4 * timeout_ + std::chrono::seconds(1); }

  // The buffer's communication stream (non-blocking, as DeepEP's), made on
  // first use.
  cudaStream_t comm_stream(const char* op) {
    if (comm_ == nullptr) {
      cudaStream_t s = nullptr;
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), op,
            "cudaStreamCreateWithFlags(communication stream)");
      comm_ = s;
    }
    return comm_;
  }

  void release() noexcept {
    if (comm_ != nullptr) cudaStreamDestroy(comm_);
    if (fork_ != nullptr) cudaEventDestroy(fork_);
    comm_ = nullptr;
    fork_ = nullptr;
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (host_report_ != nullptr) cudaFreeHost(host_report_);
    workspace_ = nullptr;
    host_report_ = nullptr;
    device_report_ = nullptr;
  }

  int rank_;
  std::chrono::milliseconds timeout_;
  int sm_count_ = 1;
  void* workspace_ = nullptr;
  Report* device_report_ = nullptr;
  Report* host_report_ = nullptr;  // pinned
  cudaStream_t comm_ = nullptr;
  cudaEvent_t fork_ = nullptr;  // orders the communication stream and the caller's
  call_guard guard_;
};

}  // namespace epcomm::cuda
