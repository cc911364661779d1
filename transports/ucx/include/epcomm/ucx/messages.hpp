// The UCX transport's own active messages: where UCX would emulate RMA with
// messages of its own (tcp), puts, signal adds, goodbyes and flushes travel
// as these instead. UCX answers each emulated put or atomic from the target,
// and an answer through the endpoint of a peer that has just died aborts the
// target's process (UCX 1.13: "ucp_request.inl:346 Fatal: unexpected error:
// Endpoint timeout"); these need no answer, and the one that has one (a
// flush) is sent as a message of ours, whose failure UCX reports as an error.
//
// A message is a header and, for a write, its bytes. Every message from one
// rank to another carries the next number of that pair, from 1: UCX does not
// promise that active messages arrive in the order they were sent, and a
// signal must not overtake the writes before it, so the target applies each
// sender's messages in its numbering (in_order_delivery), holding one that
// comes early until those before it have been applied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "epcomm/core/error.hpp"

namespace epcomm::ucx {

enum class message_kind : std::uint32_t {
  write,          // copy the payload to `offset` of `region`
  add,            // add `value` to the 8-byte counter at `offset` of `region`
  flush_request,  // answer with a flush_reply carrying `value` once applied
  flush_reply,    // the flush numbered `value` has been applied at the sender
};

struct message_header {
  message_kind kind;
  std::uint32_t region;   // write, add: which mapped region
  std::int32_t sender;    // its rank
  std::uint32_t padding;  // zero; the layout has no implicit holes
  std::uint64_t number;   // 1, 2, ... per (sender, target) pair
  std::uint64_t offset;   // write, add: byte offset in the region
  std::uint64_t value;    // add: the amount; flush_request, flush_reply: the flush's ticket
};

// One sender's messages at one target, applied in the sender's numbering.
class in_order_delivery {
 public:
  // Applies `h` (apply(header, payload)) if it is next, then every held one
  // that follows; holds a copy of it if it came early. A number already
  // applied or held means a broken stream: an error naming the sender.
  template <class Apply>
  void deliver(int rank, const message_header& h, std::span<const std::byte> payload,
               Apply&& apply) {
    if (h.number < next_ || held_.contains(h.number))
      throw error(rank, "ucx message", h.sender,
                  "message " + std::to_string(h.number) +
                      " arrived twice (next expected: " + std::to_string(next_) + ")");
    if (h.number != next_) {
      held_.emplace(h.number, held_message{h, {payload.begin(), payload.end()}});
      return;
    }
    apply(h, payload);
    ++next_;
    for (auto it = held_.begin(); it != held_.end() && it->first == next_; it = held_.erase(it)) {
      apply(it->second.header, std::span<const std::byte>(it->second.payload));
      ++next_;
    }
  }

  // Messages that came early and wait for those before them.
  std::size_t held() const { return held_.size(); }

 private:
  struct held_message {
    message_header header;
    std::vector<std::byte> payload;
  };

  std::uint64_t next_ = 1;
  std::map<std::uint64_t, held_message> held_;
};

}  // namespace epcomm::ucx
