// call_queue: a buffer's communication thread. Calls submitted to it run one
// at a time, in submission order, on a thread of the queue's own (started on
// the first submission), while the submitting thread goes on; each returns a
// completion. A host engine's synchronous calls first drain the queue, so
// that the engine only ever runs one call at a time whichever thread asked
// for it. Every call is bounded by its own deadline, so draining is too.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "epcomm/host/completion.hpp"

namespace epcomm {

class call_queue {
 public:
  call_queue() = default;
  call_queue(const call_queue&) = delete;
  call_queue& operator=(const call_queue&) = delete;

  // Runs what is queued, then stops the thread.
  ~call_queue() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Queues f (called with no arguments) and returns its completion.
  template <class F>
  completion<std::invoke_result_t<F>> submit(F&& f) {
    using result = std::invoke_result_t<F>;
    auto state = std::make_shared<completion_state<result>>();
    auto call = std::make_shared<std::decay_t<F>>(std::forward<F>(f));
    completion<result> done(state);
    {
      std::lock_guard lock(mu_);
      if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
      queue_.push_back([state, call] { state->run(*call); });
      ++unfinished_;
    }
    work_.notify_one();
    return done;
  }

  // Returns once every call submitted so far has finished; at once on the
  // queue's own thread (a queued call making a synchronous call).
  void drain() {
    std::unique_lock lock(mu_);
    if (std::this_thread::get_id() == thread_.get_id()) return;
    idle_.wait(lock, [&] { return unfinished_ == 0; });
  }

 private:
  void serve() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<void()> call = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      call();  // the call's exception goes to its completion
      lock.lock();
      if (--unfinished_ == 0) idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> queue_;
  std::size_t unfinished_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace epcomm
