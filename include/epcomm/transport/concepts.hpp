// The transport contract, as C++20 concepts, all in this one file. A
// transport owns one symmetric buffer per rank (same size everywhere) plus an
// array of 64-bit signal counters, and offers a few primitives over them
// (MSCCL++-style). Three kinds refine the base: how bytes reach a peer
// (peer_mapped_transport, rma_transport) or who writes them (device_transport,
// for kernels). The has_* capabilities are what some transports offer beyond
// their kind; the engines branch on them with `if constexpr`, and every
// transport static_asserts each capability it offers next to its class, so a
// renamed member fails there rather than silently dropping a feature.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/transport/peer_table.hpp"

namespace epcomm {

// Context for a wait, so that a late or lost peer yields an error that says
// who was waited for and why.
struct wait_site {
  const char* op;    // "dispatch", "combine", ...
  int peer;          // the rank expected to bump the counter
  const char* what;  // "notify counts", "token rows", ...
};

// What every transport, host- or device-driven, has: its rank in a group of
// world_size, and a barrier: every rank has arrived, or epcomm::error.
template <class T>
concept transport_base = requires(T& t, const T& ct, deadline dl) {
  { ct.rank() } -> std::same_as<int>;
  { ct.world_size() } -> std::same_as<int>;
  { t.barrier(dl) } -> std::same_as<void>;
};

// A host-driven transport: the local symmetric buffer and counting signals.
// signal_add(peer, slot, n) adds n to `slot` of `peer`'s signal array after
// every write this rank issued to `peer` before it has become visible there
// (release semantics). wait(slot, expected, dl, site) returns once the local
// counter `slot` is >= expected (acquire semantics) and throws epcomm::error
// when dl expires or the transport knows site.peer is gone.
template <class T>
concept transport = transport_base<T> &&
    requires(T& t, int peer, std::size_t slot, std::uint64_t n, deadline dl, wait_site site) {
  { t.local_buffer() } -> std::same_as<std::span<std::byte>>;
  { t.signal_add(peer, slot, n) } -> std::same_as<void>;
  { t.wait(slot, n, dl, site) } -> std::same_as<void>;
};

// Peer-mapped (shared memory, NVLink IPC): a producer stores straight into a
// peer's buffer through peer_ptr, for the peers is_peer_mapped says are on its
// node.
template <class T>
concept peer_mapped_transport = transport<T> &&
    requires(T& t, const T& ct, int peer, std::size_t offset) {
  { t.peer_ptr(peer, offset) } -> std::same_as<std::byte*>;
  { ct.is_peer_mapped(peer) } -> std::same_as<bool>;
};

// RMA (libfabric, UCX): one-sided writes from the local buffer into a peer's,
// issued by a proxy thread (proxy::engine). put, put_signal, signal_add and
// flush each start one operation and return at once; operations are numbered
// 1, 2, ... in call order (proxy::engine also needs has_completion_count). put_signal adds to a
// peer's counter once its bytes and every earlier write to that peer have landed; flush completes
// once every earlier put to `peer` is complete at the target. progress() drives completions and
// incoming signals. Those calls come from one thread at a time; wait() and barrier() may run on
// another thread meanwhile.
template <class T>
concept rma_transport = transport<T> &&
    requires(T& t, int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes,
             std::size_t slot, std::uint64_t n) {
  { t.put(peer, local_off, remote_off, bytes) } -> std::same_as<void>;
  { t.put_signal(peer, local_off, remote_off, bytes, slot, n) } -> std::same_as<void>;
  { t.flush(peer) } -> std::same_as<void>;
  { t.progress() } -> std::same_as<void>;
};

// Device-driven (nvlink_ipc): a transport whose symmetric buffer and signals
// live in device memory and are written by kernels through the pointers of
// device_handle() (transport/peer_table.hpp); the host only sets it up.
//  - local_device_buffer(): this rank's data region (a device address);
//  - peer_device_ptr(peer, offset): the peer's data region as mapped here;
//  - is_peer_mapped(peer): whether the peer's memory is reachable from here;
//  - signal_slots(): the counters each rank has.
// Its memory is device memory, which host code must not dereference, so it
// does not model peer_mapped_transport (whose host engine stores through
// peer_ptr).
template <class T>
concept device_transport = transport_base<T> &&
    requires(T& t, const T& ct, int peer, std::size_t offset) {
  { t.local_device_buffer() } -> std::same_as<std::span<std::byte>>;
  { t.peer_device_ptr(peer, offset) } -> std::same_as<std::byte*>;
  { ct.is_peer_mapped(peer) } -> std::same_as<bool>;
  { ct.device_handle() } -> std::same_as<cuda::peer_table>;
  { ct.signal_slots() } -> std::same_as<std::size_t>;
};

// ---- Capabilities -----------------------------------------------------------

// completed(): the largest n such that operations 1..n are all complete,
// source bytes reusable and signals delivered. What proxy::engine counts on.
template <class T>
concept has_completion_count = rma_transport<T> && requires(const T& t) {
  { t.completed() } -> std::same_as<std::uint64_t>;
};

// peer_exited(r): rank r's process is known to be gone (a peer on this host,
// in this pid namespace). Masking lost ranks (host/lost_ranks.hpp) needs it.
template <class T>
concept has_peer_exit = requires(const T& t, int r) {
  { t.peer_exited(r) } -> std::convertible_to<bool>;
};

// mask_lost_peers(): from now on a lost peer (its process exited, or the
// fabric failed an operation to it) no longer fails the transport: operations
// to it complete without moving bytes, peer_exited() says it is gone, and a
// wait for it throws an error naming it that leaves the transport usable;
// waits for the others go on. An engine that masks lost ranks over an RMA
// transport (host/lost_ranks.hpp) calls it before its first call: the proxy
// meets a loss before the engine does, and would otherwise fail everything.
// Throws epcomm::error where the fabric cannot go on without a peer.
template <class T>
concept has_lost_peer_masking = has_peer_exit<T> && requires(T& t) {
  { t.mask_lost_peers() } -> std::same_as<void>;
};

// abort(culprit): give up on the group and tell every peer, whose waits then
// fail naming `culprit` (no_peer: none) as the root cause; the word peers read
// is transport/peer_abort.hpp's. aborted(): whether this rank has (or a
// failure made it).
template <class T>
concept has_abort = requires(T& t, const T& ct, int culprit) {
  { t.abort(culprit) } -> std::same_as<void>;
  { ct.aborted() } -> std::same_as<bool>;
};

// serve(): answers what peers still ask of this rank (acknowledgements, their
// goodbyes) once its own work has ended in a failure; the proxy engine calls
// it while it drains.
template <class T>
concept has_serve = requires(T& t) {
  { t.serve() } -> std::same_as<void>;
};

// leave_open(): the transport is about to be left, never destroyed, because
// a proxy thread stuck inside its provider may still use it
// (proxy/transport_with_proxy.hpp); it releases what outlives the process
// and needs no provider call (libfabric's shm files). A transport without
// it simply stays as it is.
template <class T>
concept has_leave_open = requires(T& t) {
  t.leave_open();
  requires noexcept(t.leave_open());
};

// An RMA transport a CUDA kernel can drive through the proxy (cuda::gpu_proxy):
// the engine's contract, plus its counters and the placement of its buffer.
template <class T>
concept gpu_fed_transport = has_completion_count<T> && requires(const T& t) {
  { t.signal_counters() } -> std::same_as<std::span<const std::uint64_t>>;
  { t.local_buffer_on_device() } -> std::same_as<bool>;
};

// A transport that can be brought up from bootstrap B: every rank constructs
// it with the same buffer size and signal count, collectively.
template <class T, class B>
concept transport_for = transport<T> && bootstrap<B> &&
    std::constructible_from<T, B&, std::size_t, std::size_t, deadline>;

}  // namespace epcomm
