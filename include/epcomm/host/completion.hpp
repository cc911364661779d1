// completion<T>: the result of a host engine's call that runs on the buffer's
// communication thread (host/call_queue.hpp), DeepEP's EventOverlap for the
// host: the caller goes on computing and collects the result when it needs
// it. Waiting is bounded: the call has its deadline, as every call does.
#pragma once

#include <chrono>
#include <future>
#include <utility>

namespace epcomm {

template <class T>
class completion {
 public:
  explicit completion(std::future<T> f) : f_(std::move(f)) {}

  // Whether the call has finished (with a result or an error); never blocks.
  bool ready() const { return f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

  // Blocks until the call has finished.
  void wait() const { f_.wait(); }

  // The call's result, or its epcomm::error rethrown; once.
  T get() { return f_.get(); }

 private:
  std::future<T> f_;
};

}  // namespace epcomm
