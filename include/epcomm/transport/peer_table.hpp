// What a kernel needs to reach its peers over peer-mapped device memory
// (NVLink, or one GPU shared by several processes): for every rank, the device
// address of its symmetric buffer and of its signal counters as mapped into
// this process, or null where the rank is not mapped. Passed to kernels by
// value, so it is a trivially copyable table of plain pointers. The handle of
// a device_transport (transport/concepts.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace epcomm::cuda {

struct peer_table {
  // Enough for an NVL72 domain plus spare; the table travels as a kernel
  // parameter (2 KiB of the 4 KiB every architecture accepts).
  static constexpr int max_ranks = 128;

  int rank;
  int world_size;
  std::byte* buffer[max_ranks];       // data region of each rank's symmetric buffer
  std::uint64_t* signals[max_ranks];  // 64-bit counters, indexed by wire::signal_slot
};

static_assert(std::is_trivially_copyable_v<peer_table> && std::is_standard_layout_v<peer_table>);
static_assert(sizeof(peer_table) <= 4096 - 512, "leave room for the other kernel parameters");

}  // namespace epcomm::cuda
