// What a kernel needs to reach its peers over peer-mapped device memory
// (NVLink, or one GPU shared by several processes): for every rank, the device
// address of its symmetric buffer and of its signal counters as mapped into
// this process, or null where the rank is not mapped. Passed to kernels by
// value, so it is a trivially copyable table of plain pointers.
//
// Also the narrower transport concept device-side transports satisfy: their
// memory is device memory, which host code must not dereference, so they do
// not model peer_mapped_transport (whose host engine stores through peer_ptr).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "epcomm/core/deadline.hpp"

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

// A transport whose symmetric buffer and signals live in device memory and
// are written by kernels through the pointers of device_handle().
//  - local_device_buffer(): this rank's data region (a device address);
//  - peer_device_ptr(peer, offset): the peer's data region as mapped here;
//  - is_peer_mapped(peer): whether the peer's memory is reachable from here;
//  - barrier(dl): every rank of the node has arrived, or epcomm::error.
template <class T>
concept device_transport = requires(T& t, const T& ct, int peer, std::size_t offset, deadline dl) {
  { ct.rank() } -> std::same_as<int>;
  { ct.world_size() } -> std::same_as<int>;
  { t.local_device_buffer() } -> std::same_as<std::span<std::byte>>;
  { t.peer_device_ptr(peer, offset) } -> std::same_as<std::byte*>;
  { ct.is_peer_mapped(peer) } -> std::same_as<bool>;
  { ct.device_handle() } -> std::same_as<peer_table>;
  { ct.signal_slots() } -> std::same_as<std::size_t>;
  { t.barrier(dl) } -> std::same_as<void>;
};

}  // namespace epcomm::cuda
