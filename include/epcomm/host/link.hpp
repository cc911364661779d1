// The transport a host engine drives, with the proxy an RMA transport needs:
// one per group of ranks an engine talks to (the world for normal and
// low-latency mode, the node and the rail for the hierarchical engine,
// hierarchical/link.hpp). It is where an engine's choice between storing
// into peers and handing puts to the proxy is made, once:
//
//   - bytes for peer i are written where outgoing() says: i's buffer itself
//     over a peer-mapped transport (shm), this rank's staging area over an
//     RMA one (libfabric, UCX);
//   - put / put_signal / signal hand them over: through the proxy thread
//     over RMA (a put_signal's signal lands after its bytes and every
//     earlier write to i), as a release add over a peer-mapped transport
//     (the bytes are there already);
//   - writer() gives the proxy as a kernel's channel_writer sees it, for the
//     routes written once for the host engine and the kernels.
//
// Channels are the proxy's producers: an engine whose calls can overlap
// (low-latency mode's two parities) asks for one each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/proxy/engine.hpp"
#include "epcomm/proxy/transport_with_proxy.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm {

template <class T>
requires peer_mapped_transport<T> || has_completion_count<T>
class host_link {
 public:
  static constexpr bool via_proxy = !peer_mapped_transport<T>;

  // `make()` builds the transport (collective, as its constructor is).
  template <class Make>
  explicit host_link(Make&& make, int channels = 1)
      : owned_(std::forward<Make>(make), proxy::engine_options{.channels = channels}) {}

  T& transport() { return owned_.transport(); }
  const T& transport() const { return owned_.transport(); }
  int rank() const { return owned_.transport().rank(); }

  std::byte* local(std::size_t offset) { return transport().local_buffer().data() + offset; }

  // Peer i's buffer at `offset`, for direct stores and loads.
  std::byte* peer(int i, std::size_t offset) requires(!via_proxy) {
    return transport().peer_ptr(i, offset);
  }

  // True when this rank stores into i's buffer itself: every peer over a
  // peer-mapped transport, only itself over an RMA one.
  bool direct(int i) const { return !via_proxy || i == rank(); }

  // i's buffer at `remote` when direct(i); the caller stores there.
  std::byte* direct_ptr(int i, std::size_t remote) {
    if constexpr (via_proxy)
      return local(remote);
    else
      return transport().peer_ptr(i, remote);
  }

  // Where this rank writes the bytes i will read at `remote`: i's buffer
  // itself, or the staging offset `staged` that put() puts from.
  std::byte* outgoing(int i, std::size_t remote, std::size_t staged) {
    if constexpr (via_proxy)
      return local(staged);
    else
      return transport().peer_ptr(i, remote);
  }

  // Hands over `bytes` written at outgoing(i, remote, staged).
  void put(int channel, int i, std::size_t staged, std::size_t remote, std::size_t bytes,
           const deadline& dl) {
    if constexpr (via_proxy)
      proxy().push(channel, proxy::op_code::put, i, staged, remote, bytes, 0, 0, dl);
  }

  // put(), then adds 1 to i's counter `slot` once those bytes and every
  // earlier write to i are visible there.
  void put_signal(int channel, int i, std::size_t staged, std::size_t remote, std::size_t bytes,
                  std::size_t slot, const deadline& dl) {
    if constexpr (via_proxy)
      proxy().push(channel, proxy::op_code::put_signal, i, staged, remote, bytes, slot, 1, dl);
    else
      transport().signal_add(i, slot, 1);
  }

  // Adds 1 to i's counter `slot` after every earlier write to i.
  void signal(int channel, int i, std::size_t slot, const deadline& dl) {
    if constexpr (via_proxy)
      proxy().push(channel, proxy::op_code::signal, i, 0, 0, 0, slot, 1, dl);
    else
      transport().signal_add(i, slot, 1);
  }

  // Over RMA: returns once every put `channel` handed over is complete, so
  // the staging area it read may be written again.
  void quiet(int channel, const deadline& dl) {
    if constexpr (via_proxy) proxy().quiet(channel, dl);
  }

  // The proxy behind a channel_writer's calls, for the routes.
  auto writer(int channel, const deadline& dl) requires via_proxy {
    return proxy().writer(channel, dl);
  }

  // Gives up on the group where the transport can (peers waiting in it fail
  // at once), blaming `culprit` (a peer of this transport, or no_peer).
  void abort(int culprit = no_peer) {
    if constexpr (has_abort<T>) transport().abort(culprit);
  }

  bool aborted() const {
    if constexpr (has_abort<T>)
      return transport().aborted();
    else
      return false;
  }

 private:
  auto& proxy() requires via_proxy { return owned_.proxy(); }

  proxy::transport_with_proxy<via_proxy, proxy::engine, T> owned_;
};

}  // namespace epcomm
