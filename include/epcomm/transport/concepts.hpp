// The transport contract, as C++20 concepts. A transport owns one symmetric
// buffer per rank (same size everywhere) plus an array of 64-bit signal
// counters, and offers a few primitives over them (MSCCL++-style). Capability
// refinements tell the algorithms how bytes can reach a peer.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/deadline.hpp"

namespace epcomm {

// Context for a wait, so that a late or lost peer yields an error that says
// who was waited for and why.
struct wait_site {
  const char* op;    // "dispatch", "combine", ...
  int peer;          // the rank expected to bump the counter
  const char* what;  // "notify counts", "token rows", ...
};

// Base: identity, the local symmetric buffer, counting signals, a barrier.
// signal_add(peer, slot, n) adds n to `slot` of `peer`'s signal array after
// every write this rank issued to `peer` before it has become visible there
// (release semantics). wait(slot, expected, dl, site) returns once the local
// counter `slot` is >= expected (acquire semantics) and throws epcomm::error
// when dl expires or the transport knows site.peer is gone.
template <class T>
concept transport = requires(T& t, const T& ct, int peer, std::size_t slot, std::uint64_t n,
                             deadline dl, wait_site site) {
  { ct.rank() } -> std::same_as<int>;
  { ct.world_size() } -> std::same_as<int>;
  { t.local_buffer() } -> std::same_as<std::span<std::byte>>;
  { t.signal_add(peer, slot, n) } -> std::same_as<void>;
  { t.wait(slot, n, dl, site) } -> std::same_as<void>;
  { t.barrier(dl) } -> std::same_as<void>;
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
// 1, 2, ... in call order (proxy::engine also needs completed(): the largest
// n such that operations 1..n are complete, source bytes reusable and signals
// delivered). put_signal adds to a peer's counter once its bytes and every earlier write
// to that peer have landed; flush completes once every earlier put to `peer`
// is complete at the target. progress() drives completions and incoming
// signals. Those calls come from one thread at a time; wait() and barrier()
// may run on another thread meanwhile.
template <class T>
concept rma_transport = transport<T> &&
    requires(T& t, int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes,
             std::size_t slot, std::uint64_t n) {
  { t.put(peer, local_off, remote_off, bytes) } -> std::same_as<void>;
  { t.put_signal(peer, local_off, remote_off, bytes, slot, n) } -> std::same_as<void>;
  { t.flush(peer) } -> std::same_as<void>;
  { t.progress() } -> std::same_as<void>;
};

// A transport that can be brought up from bootstrap B: every rank constructs
// it with the same buffer size and signal count, collectively.
template <class T, class B>
concept transport_for = transport<T> && bootstrap<B> &&
    std::constructible_from<T, B&, std::size_t, std::size_t, deadline>;

}  // namespace epcomm
