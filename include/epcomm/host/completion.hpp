// completion<T>: the result of a host engine's call that runs on the buffer's
// communication thread (host/call_queue.hpp), DeepEP's EventOverlap for the
// host: the caller goes on computing and collects the result when it needs
// it. Waiting is bounded: the call has its deadline, as every call does.
//
// The result is handed over, not shared: the serving thread moves the value
// or the exception into the state under its mutex and keeps no reference to
// it, and get() moves it out the same way. So the thread that reads an error
// is the only one that ever frees it; with std::future both threads held the
// exception and the last one freed it, through reference counts inside
// libstdc++ that ThreadSanitizer cannot see (the tsan preset reported it).
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace epcomm {

// Where a call's outcome waits for its completion; filled once by run().
template <class T>
class completion_state {
 public:
  // Runs f and keeps what it returned or threw.
  template <class F>
  void run(F& f) {
    std::optional<stored> value;
    std::exception_ptr error;
    try {
      if constexpr (std::is_void_v<T>) {
        f();
        value.emplace();
      } else {
        value.emplace(f());
      }
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      value_ = std::move(value);
      error_ = std::move(error);
      done_ = true;
    }
    finished_.notify_all();
  }

  bool done() const {
    std::lock_guard lock(mu_);
    return done_;
  }

  void wait() const {
    std::unique_lock lock(mu_);
    finished_.wait(lock, [&] { return done_; });
  }

  T take() {
    std::unique_lock lock(mu_);
    finished_.wait(lock, [&] { return done_; });
    if (error_) {
      std::exception_ptr error = std::move(error_);
      lock.unlock();
      std::rethrow_exception(std::move(error));
    }
    if constexpr (!std::is_void_v<T>) {
      T out = std::move(*value_);
      value_.reset();
      return out;
    }
  }

 private:
  struct nothing {};
  using stored = std::conditional_t<std::is_void_v<T>, nothing, T>;

  mutable std::mutex mu_;
  mutable std::condition_variable finished_;
  bool done_ = false;
  std::optional<stored> value_;
  std::exception_ptr error_;
};

template <class T>
class completion {
 public:
  explicit completion(std::shared_ptr<completion_state<T>> state) : state_(std::move(state)) {}

  // Whether the call has finished (with a result or an error); never blocks.
  bool ready() const { return state_->done(); }

  // Blocks until the call has finished.
  void wait() const { state_->wait(); }

  // The call's result, or its epcomm::error rethrown; once.
  T get() { return state_->take(); }

 private:
  std::shared_ptr<completion_state<T>> state_;
};

}  // namespace epcomm
