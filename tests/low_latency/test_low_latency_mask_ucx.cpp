// Low-latency mode with mask_lost_ranks over UCX, through the proxy
// (tests/support/ll_mask_suite.hpp). CTest runs it over tcp on loopback: the
// shared-memory transports refuse the option (ll_suite.hpp's ll_mask_option).
#include "epcomm/ucx/transport.hpp"
#include "support/ll_mask_suite.hpp"

TYPE_TO_STRING(epcomm::ucx::transport);
EPCOMM_LL_MASK_SUITE(epcomm::ucx::transport);
