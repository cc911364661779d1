// What every wire format (normal, low-latency, hierarchical) and every
// transport's buffer layout share: the boundary each array starts on, how a
// region is carved into arrays, and the room a rank has to tell its peers,
// in words, why it rejected a call.
#pragma once

#include <cstddef>

#include "epcomm/core/config.hpp"

namespace epcomm::wire {

inline constexpr std::size_t alignment = 256;  // every array starts on this boundary
inline constexpr int cause_bytes = 120;        // room for a human-readable input error

EPCOMM_HD constexpr std::size_t align_up(std::size_t n, std::size_t a = alignment) {
  return (n + a - 1) / a * a;
}

// Lays arrays out one after another, each on an `align` boundary: how every
// plan (normal, low-latency, hierarchical) and every device workspace carves
// its one region. Arrays never live at the same time may share bytes: carve
// the first set from an at(), back_to() it for the second, then past() the
// end of the first.
class carver {
 public:
  EPCOMM_HD constexpr explicit carver(std::size_t align = alignment) : align_(align) {}

  // The offset of the next array of `bytes`.
  EPCOMM_HD constexpr std::size_t take(std::size_t bytes) {
    const std::size_t here = at_;
    at_ = align_up(at_ + bytes, align_);
    return here;
  }
  // Where the next array would start; after the last, the region's size.
  EPCOMM_HD constexpr std::size_t at() const { return at_; }
  EPCOMM_HD constexpr void back_to(std::size_t at) { at_ = at; }
  EPCOMM_HD constexpr void past(std::size_t end) {
    if (at_ < end) at_ = end;
  }

 private:
  std::size_t align_;
  std::size_t at_ = 0;
};

}  // namespace epcomm::wire
