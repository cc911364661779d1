// The first error of a component that runs on another thread (a proxy, a
// transport's progress), kept so that every later call on any thread rethrows
// it: the one that waits on a signal learns why it will never come.
#pragma once

#include <atomic>
#include <mutex>
#include <optional>

#include "epcomm/core/error.hpp"

namespace epcomm::proxy {

class failure_latch {
 public:
  // Keeps `e` unless an earlier error is already latched; returns the latched one.
  const error& latch(const error& e) {
    std::lock_guard lock(mu_);
    if (!first_) {
      first_.emplace(e);
      failed_.store(true, std::memory_order_release);
    }
    return *first_;
  }

  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // The peer the latched error blames, or no_peer (also when none is latched).
  int culprit() const {
    if (!failed()) return no_peer;
    std::lock_guard lock(mu_);
    return first_->peer();
  }

  // Throws the latched error, if any.
  void rethrow() const {
    if (!failed()) return;
    std::lock_guard lock(mu_);
    throw *first_;
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> failed_{false};
  std::optional<error> first_;
};

}  // namespace epcomm::proxy
