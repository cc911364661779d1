// Low-latency mode with mask_lost_ranks over shared memory
// (tests/support/ll_mask_suite.hpp).
#include "epcomm/shm/transport.hpp"
#include "support/ll_mask_suite.hpp"

TYPE_TO_STRING(epcomm::shm::transport);
EPCOMM_LL_MASK_SUITE(epcomm::shm::transport);
