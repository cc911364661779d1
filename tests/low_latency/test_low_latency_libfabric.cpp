// The low-latency suite's RMA subset over libfabric, through the proxy. CTest
// runs this file once per provider, selected by FI_PROVIDER ("tcp;ofi_rxm",
// "shm") on loopback.
#include "epcomm/libfabric/transport.hpp"
#include "support/ll_suite.hpp"

TYPE_TO_STRING(epcomm::libfabric::transport);
EPCOMM_LL_RMA_SUITE(epcomm::libfabric::transport);
