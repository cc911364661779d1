// The fault matrix (tests/support/fault_matrix.hpp) over the libfabric
// transport, through the proxy: a victim that exits, stalls or drops its
// transport mid-protocol (normal mode or low latency) is named by every
// survivor, from its detected loss or a relayed abort (abort words written
// into the peers' registered memory), and the survivors re-form on new
// endpoints. CTest runs it with FI_PROVIDER=tcp;ofi_rxm on loopback and with
// FI_PROVIDER=shm, where a victim's exit mid-combine used to hold up the
// other survivor's abort in the provider's queue until aborts got a lane of
// their own.
#include "epcomm/libfabric/transport.hpp"
#include "support/fault_matrix.hpp"

using namespace epcomm;
using namespace epcomm::test::faults;

namespace {

// A call over tcp;ofi_rxm under ThreadSanitizer takes up to a few hundred ms
// on a loaded 2-core machine: a 3 s deadline, and a stall of 5 s that
// outlasts it. (Set-up, 2.5-3 s there, has its own bound: setup_timeout.)
const timing loaded{std::chrono::milliseconds(3'000), std::chrono::milliseconds(5'000),
                    std::chrono::milliseconds(2'500)};

}  // namespace

TEST_CASE("fault matrix over libfabric: {exit, stall, drop} x protocol points") {
  run_matrix<libfabric::transport>(every_action, every_point, loaded);
}

// Calls in rounds under a byte budget (windows of 4 rows per peer): a victim
// lost between rounds, where survivors wait for room in its windows too.
TEST_CASE("fault matrix over libfabric, calls in windows: {exit, drop} x mid-call points") {
  run_matrix<libfabric::transport>({fault::action::exit, fault::action::drop},
                                   {fault::point::mid_dispatch, fault::point::mid_combine}, loaded,
                                   4);
}
