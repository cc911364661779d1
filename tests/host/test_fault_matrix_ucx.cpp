// The fault matrix (tests/support/fault_matrix.hpp) over the UCX transport,
// through the proxy: a victim that stalls, drops its transport or exits
// mid-protocol (normal mode or low latency) is named by every survivor, from
// the deadline or a relayed abort (an early goodbye word naming the
// culprit), and the survivors re-form on new endpoints. CTest runs it with
// UCX_TLS=tcp on loopback and over shared memory.
#include "epcomm/ucx/transport.hpp"
#include "support/fault_matrix.hpp"

using namespace epcomm;

using test::faults::every_point;

TEST_CASE("fault matrix over UCX: {stall, drop} x protocol points") {
  test::faults::run_matrix<ucx::transport>({fault::action::stall, fault::action::drop},
                                           every_point);
}

// A victim that exits with writes to a survivor in flight: over tcp they are
// the transport's own messages, which the survivor applies without answering
// (UCX's emulated RMA answers each, and UCX aborted a survivor whose answer
// met the victim's failed endpoint: 1 in 1,000; epcomm/ucx/messages.hpp).
TEST_CASE("fault matrix over UCX: exit x protocol points") {
  test::faults::run_matrix<ucx::transport>({fault::action::exit}, every_point);
}

// Calls in rounds under a byte budget (windows of 4 rows per peer): a victim
// lost between rounds, where survivors wait for room in its windows too.
TEST_CASE("fault matrix over UCX, calls in windows: {exit, drop} x mid-call points") {
  test::faults::run_matrix<ucx::transport>({fault::action::exit, fault::action::drop},
                                           {fault::point::mid_dispatch, fault::point::mid_combine},
                                           {}, 4);
}
