// What every wire format (normal, low-latency, hierarchical) and every
// transport's buffer layout share: the boundary each array starts on, and the
// room a rank has to tell its peers, in words, why it rejected a call.
#pragma once

#include <cstddef>

#include "epcomm/core/config.hpp"

namespace epcomm::wire {

inline constexpr std::size_t alignment = 256;  // every array starts on this boundary
inline constexpr int cause_bytes = 120;        // room for a human-readable input error

EPCOMM_HD constexpr std::size_t align_up(std::size_t n, std::size_t a = alignment) {
  return (n + a - 1) / a * a;
}

}  // namespace epcomm::wire
