// The proxy's descriptor ring: how a producer (a host engine thread today, a
// CUDA kernel writing pinned host memory later) asks the proxy thread to issue
// RMA operations. The ring's memory layout is part of the wire format between
// producer and proxy, so it is plain integers only, fixed-size and
// cache-line aligned, and the producer side compiles for the device.
//
// One ring per channel, one producer per ring, one consumer (the proxy).
// The producer claims ticket `head`, fills slot head % capacity and publishes
// it by storing sequence = ticket + 1 last, with release semantics; the proxy
// accepts a slot only when its sequence is the one it expects, so it never
// reads a half-written descriptor. The proxy retires tickets in order by
// advancing `tail` once their operations are complete (source bytes reusable,
// signals delivered); the producer reuses a slot only below tail + capacity,
// and knows that every operation it enqueued is done once tail == head.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "epcomm/core/config.hpp"

namespace epcomm::proxy {

// What a descriptor asks for; the numbers are part of the wire format.
enum class op_code : std::uint32_t {
  put = 1,         // bytes from local_offset to the peer's remote_offset
  put_signal = 2,  // put, then add signal_value to the peer's signal_slot (release)
  signal = 3,      // add signal_value to the peer's signal_slot after earlier writes land
  flush = 4,       // complete once every earlier put to the peer is complete at the peer
};

// One request, exactly one cache line. Offsets are relative to the symmetric
// buffer (transport::local_buffer on both sides).
struct alignas(64) descriptor {
  std::uint64_t sequence;  // ticket + 1 once published; written last
  std::uint32_t op;        // op_code
  std::int32_t peer;
  std::uint64_t local_offset;
  std::uint64_t remote_offset;
  std::uint64_t bytes;
  std::uint64_t signal_slot;
  std::uint64_t signal_value;
  std::uint64_t reserved;  // zero; keeps the line fully defined
};

static_assert(sizeof(descriptor) == 64);
static_assert(std::is_standard_layout_v<descriptor> && std::is_trivially_copyable_v<descriptor>);
static_assert(offsetof(descriptor, sequence) == 0 && offsetof(descriptor, op) == 8 &&
              offsetof(descriptor, peer) == 12 && offsetof(descriptor, local_offset) == 16 &&
              offsetof(descriptor, remote_offset) == 24 && offsetof(descriptor, bytes) == 32 &&
              offsetof(descriptor, signal_slot) == 40 && offsetof(descriptor, signal_value) == 48);

// The ring's control block. head is written only by the producer and tail only
// by the proxy, each on its own cache line so that neither side's polling
// bounces the other's line.
struct alignas(64) ring_header {
  std::uint64_t head;  // next ticket the producer will claim
  std::uint64_t producer_pad[7];
  std::uint64_t tail;    // tickets retired by the proxy (all below are complete)
  std::uint64_t failed;  // nonzero once the proxy stopped on an error: do not wait on it
  std::uint64_t consumer_pad[6];
  std::uint64_t capacity;  // slots, a power of two; fixed at creation
  std::uint64_t config_pad[7];
};

static_assert(sizeof(ring_header) == 192);
static_assert(std::is_standard_layout_v<ring_header> && std::is_trivially_copyable_v<ring_header>);
static_assert(offsetof(ring_header, head) == 0 && offsetof(ring_header, tail) == 64 &&
              offsetof(ring_header, failed) == 72 && offsetof(ring_header, capacity) == 128);

// Bytes of memory a ring of `capacity` slots needs: the header, then the slots.
EPCOMM_HD constexpr std::size_t ring_bytes(std::size_t capacity) {
  return sizeof(ring_header) + capacity * sizeof(descriptor);
}

EPCOMM_HD constexpr bool valid_capacity(std::uint64_t capacity) {
  return capacity >= 2 && (capacity & (capacity - 1)) == 0;
}

// Acquire / release on plain integers: the GCC builtins on the host; on the
// device, volatile accesses ordered by a system-scope fence, because the other
// side is a host thread reading pinned memory over PCIe.
EPCOMM_HD inline std::uint64_t load_acquire(const std::uint64_t* p) {
#if defined(__CUDA_ARCH__)
  const std::uint64_t v = *reinterpret_cast<const volatile std::uint64_t*>(p);
  __threadfence_system();
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

EPCOMM_HD inline void store_release(std::uint64_t* p, std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  *reinterpret_cast<volatile std::uint64_t*>(p) = v;
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

// A view of one ring in memory someone else owns (ring_storage on the host,
// pinned host memory for a kernel). Trivially copyable, so it can be passed
// to a kernel by value.
struct ring_view {
  ring_header* header;
  descriptor* slots;

  // Lays a fresh ring over `memory` (ring_bytes(capacity) bytes, 64-byte
  // aligned, zeroed by the caller).
  static ring_view over(void* memory, std::uint64_t capacity) {
    auto* h = static_cast<ring_header*>(memory);
    h->capacity = capacity;
    return {h, reinterpret_cast<descriptor*>(h + 1)};
  }
};

static_assert(std::is_trivially_copyable_v<ring_view>);

// Producer side, for a ticket the producer knows to be free (below tail +
// capacity): fills its slot and publishes it, then advances head.
EPCOMM_HD inline void write_slot(ring_view r, std::uint64_t ticket, std::uint64_t capacity,
                                 op_code op, int peer, std::uint64_t local_offset,
                                 std::uint64_t remote_offset, std::uint64_t bytes,
                                 std::uint64_t signal_slot, std::uint64_t signal_value) {
  descriptor& d = r.slots[ticket & (capacity - 1)];
  d.op = static_cast<std::uint32_t>(op);
  d.peer = peer;
  d.local_offset = local_offset;
  d.remote_offset = remote_offset;
  d.bytes = bytes;
  d.signal_slot = signal_slot;
  d.signal_value = signal_value;
  d.reserved = 0;
  store_release(&d.sequence, ticket + 1);
  store_release(&r.header->head, ticket + 1);
}

// Producer side. Claims the next slot, fills it, publishes it. Returns false,
// touching nothing, when the ring is full (the proxy has not retired enough).
EPCOMM_HD inline bool try_push(ring_view r, op_code op, int peer, std::uint64_t local_offset,
                               std::uint64_t remote_offset, std::uint64_t bytes,
                               std::uint64_t signal_slot = 0, std::uint64_t signal_value = 0) {
  const std::uint64_t ticket = r.header->head;
  const std::uint64_t capacity = r.header->capacity;
  if (ticket - load_acquire(&r.header->tail) >= capacity) return false;
  write_slot(r, ticket, capacity, op, peer, local_offset, remote_offset, bytes, signal_slot,
             signal_value);
  return true;
}

// Producer side: true once every descriptor pushed so far is retired.
EPCOMM_HD inline bool drained(ring_view r) {
  return load_acquire(&r.header->tail) == r.header->head;
}

// Producer side: the proxy gave up on this ring (see proxy::engine).
EPCOMM_HD inline bool proxy_failed(ring_view r) { return load_acquire(&r.header->failed) != 0; }

// Consumer side (the proxy, host only). Reads descriptors in ticket order,
// possibly far ahead of retirement, and retires them in order.
class ring_consumer {
 public:
  explicit ring_consumer(ring_view r)
      : ring_(r),
        mask_(r.header->capacity - 1),
        next_(load_acquire(&r.header->tail)),
        retired_(next_) {}

  // Copies the next published descriptor into `out` and moves past it, or
  // returns false when the producer has not published it yet.
  bool pop(descriptor& out) {
    const descriptor& d = ring_.slots[next_ & mask_];
    if (load_acquire(&d.sequence) != next_ + 1) return false;
    out = d;
    ++next_;
    return true;
  }

  // Tickets read but not yet retired.
  std::uint64_t in_flight() const { return next_ - retired_; }

  // Marks the oldest `n` read tickets complete: their slots may be reused.
  void retire(std::uint64_t n) {
    retired_ += n;
    store_release(&ring_.header->tail, retired_);
  }

  void mark_failed() { store_release(&ring_.header->failed, 1); }

  ring_view view() const { return ring_; }

 private:
  ring_view ring_;
  std::uint64_t mask_;
  std::uint64_t next_;
  std::uint64_t retired_;
};

}  // namespace epcomm::proxy
