// The one spelling of "the proxy this transport needs": an owner of a
// transport whose peers' memory it cannot store into (libfabric, UCX) holds
// a proxy that issues its puts; an owner of a peer-mapped one (shm,
// nvlink_ipc) holds nothing in its place. The host link (host/link.hpp)
// and the device link (cuda/device_link.hpp) name their member with it.
#pragma once

#include <utility>

namespace epcomm::proxy {

// What stands where no proxy is needed: it takes whatever a proxy would be
// built from and holds nothing.
struct none {
  template <class... Args>
  explicit none(Args&&...) {}
};

template <bool needed, template <class> class Proxy, class Transport>
struct select_proxy {
  using type = none;
};
template <template <class> class Proxy, class Transport>
struct select_proxy<true, Proxy, Transport> {
  using type = Proxy<Transport>;
};

// Proxy<Transport> when `needed`, else none. Proxy<Transport> is named only
// when needed, so its constraints (an RMA transport) bind only then.
template <bool needed, template <class> class Proxy, class Transport>
using proxy_if = typename select_proxy<needed, Proxy, Transport>::type;

}  // namespace epcomm::proxy
