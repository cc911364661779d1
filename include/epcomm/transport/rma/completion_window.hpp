// In-order completion over out-of-order events. An RMA transport numbers its
// operations as it issues them, but the fabric completes them in any order
// (EFA's SRD reorders freely); what callers need is the watermark: how many
// operations, counted from the first, are all complete.
#pragma once

#include <cstdint>
#include <deque>

namespace epcomm::proxy {

class completion_window {
 public:
  // Opens the next operation, complete once `parts` events have arrived for
  // it (0: complete already). Returns its index, counted from 0.
  std::uint64_t open(std::uint32_t parts) {
    remaining_.push_back(parts);
    const std::uint64_t index = base_ + remaining_.size() - 1;
    advance();
    return index;
  }

  // One more event for operation `index`.
  void complete(std::uint64_t index) {
    --remaining_[index - base_];
    advance();
  }

  // One more part that operation `index` must wait for (decided after open).
  void add_part(std::uint64_t index) { ++remaining_[index - base_]; }

  // Operations [0, watermark()) are all complete.
  std::uint64_t watermark() const { return base_; }
  // Operations opened so far.
  std::uint64_t opened() const { return base_ + remaining_.size(); }
  bool idle() const { return remaining_.empty(); }

 private:
  void advance() {
    while (!remaining_.empty() && remaining_.front() == 0) {
      remaining_.pop_front();
      ++base_;
    }
  }

  std::uint64_t base_ = 0;
  std::deque<std::uint32_t> remaining_;  // parts still missing, from operation base_ on
};

}  // namespace epcomm::proxy
