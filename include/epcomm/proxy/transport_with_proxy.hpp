// A transport and the proxy that drives it, owned together, for the links
// (host/link.hpp, cuda/device_link.hpp). Teardown stops the proxy before
// the transport closes. When the proxy has to leave its thread behind,
// stuck inside a provider call (proxy/engine.hpp), neither is destroyed nor
// freed: that thread holds their addresses and may come back to them at
// any time, so their memory stays theirs for the rest of the process (a
// bounded leak per stuck teardown), where destroying them, or returning
// their storage to the heap or the stack for the next buffer, would let a
// late return write into whatever lives there next.
#pragma once

#include <atomic>
#include <memory>
#include <utility>

#include "epcomm/proxy/proxy_if.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm::proxy {

// `needed`, `Proxy`, `T`: as for proxy_if. Without a proxy this is just the
// transport (on the heap).
template <bool needed, template <class> class Proxy, class T>
class transport_with_proxy {
 public:
  // `make()` builds the transport; the proxy is built from it and `opt`.
  template <class Make, class Options>
  transport_with_proxy(Make&& make, const Options& opt)
      : parts_(std::make_unique<parts>(std::forward<Make>(make), opt)) {}

  transport_with_proxy(const transport_with_proxy&) = delete;
  transport_with_proxy& operator=(const transport_with_proxy&) = delete;

  ~transport_with_proxy() {
    if constexpr (needed) {
      if (parts_->proxy.stop()) return;  // parts_ then goes: the proxy, then the transport
      if constexpr (has_leave_open<T>) parts_->transport.leave_open();
      keep(std::move(parts_));
    }
  }

  T& transport() { return parts_->transport; }
  const T& transport() const { return parts_->transport; }
  auto& proxy() requires needed { return parts_->proxy; }
  const auto& proxy() const requires needed { return parts_->proxy; }

 private:
  struct parts {
    template <class Make, class Options>
    parts(Make&& make, const Options& opt)
        : transport(std::forward<Make>(make)()), proxy(transport, opt) {}
    T transport;
    proxy_if<needed, Proxy, T> proxy;  // after transport: destroyed first
    parts* next_kept = nullptr;
  };

  // Parts left to stuck threads, chained from a static head so that they
  // stay reachable (leak checkers count them as kept, not lost).
  static void keep(std::unique_ptr<parts> p) {
    parts* kept = p.release();
    kept->next_kept = kept_.load(std::memory_order_relaxed);
    while (!kept_.compare_exchange_weak(kept->next_kept, kept, std::memory_order_release,
                                        std::memory_order_relaxed)) {
    }
  }

  std::unique_ptr<parts> parts_;
  inline static std::atomic<parts*> kept_{nullptr};
};

}  // namespace epcomm::proxy
