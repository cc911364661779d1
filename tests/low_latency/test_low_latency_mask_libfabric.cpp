// Low-latency mode with mask_lost_ranks over libfabric, through the proxy
// (tests/support/ll_mask_suite.hpp). CTest runs it over tcp;ofi_rxm on
// loopback: the shm provider refuses the option (ll_suite.hpp's
// ll_mask_option).
#include "epcomm/libfabric/transport.hpp"
#include "support/ll_mask_suite.hpp"

TYPE_TO_STRING(epcomm::libfabric::transport);
EPCOMM_LL_MASK_SUITE(epcomm::libfabric::transport);
