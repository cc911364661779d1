// The multi-process normal-mode suite (support/dispatch_combine_suite.hpp)
// over shared memory, the peer-mapped path. test_transport_*.cpp run the same
// suite over the RMA transports.
#include "support/dispatch_combine_suite.hpp"

TYPE_TO_STRING(epcomm::shm::transport);
EPCOMM_DISPATCH_COMBINE_SUITE(epcomm::shm::transport);
