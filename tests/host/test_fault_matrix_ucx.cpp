// The fault matrix (tests/support/fault_matrix.hpp) over the UCX transport,
// through the proxy: a victim that stalls or drops its transport
// mid-protocol (normal mode or low latency) is named by every survivor, from
// the deadline or a relayed abort (an early goodbye word naming the
// culprit), and the survivors re-form on new endpoints. CTest runs it with
// UCX_TLS=tcp on loopback and over shared memory.
#include <cstdlib>
#include <string_view>

#include "epcomm/ucx/transport.hpp"
#include "support/fault_matrix.hpp"

using namespace epcomm;

namespace {

constexpr auto every_point = {fault::point::before_notify, fault::point::mid_dispatch,
                              fault::point::mid_combine, fault::point::low_latency};

// Whether UCX_TLS lets UCX use tcp (unset: every transport).
bool over_tcp() {
  const char* tls = std::getenv("UCX_TLS");
  return tls == nullptr || std::string_view(tls).find("tcp") != std::string_view::npos;
}

}  // namespace

TEST_CASE("fault matrix over UCX: {stall, drop} x protocol points") {
  test::faults::run_matrix<ucx::transport>({fault::action::stall, fault::action::drop},
                                           every_point);
}

// A victim that exits with puts or atomics to a survivor still unanswered
// can take the survivor down over tcp: UCX 1.13 emulates RMA there with
// active messages, and a request from the victim that the survivor serves
// after UCX marked the victim's endpoint failed, but before the endpoint's
// error callback ran (where the transport closes it), is answered through
// the failed endpoint, which UCX treats as fatal ("ucp_request.inl:346
// Fatal: unexpected error: Endpoint timeout"). 1 survivor in 1200 of
// epcomm-fault-stress over ucx-tcp, so over tcp this case runs there and
// with --no-skip, not in CI; over shared memory it runs.
TEST_CASE("fault matrix over UCX: exit x protocol points" * doctest::skip(over_tcp())) {
  test::faults::run_matrix<ucx::transport>({fault::action::exit}, every_point);
}
