// The low-latency suite's RMA subset over UCX, through the proxy. CTest runs
// this file once per transport selection, by UCX_TLS: shared memory
// (posix,sysv,cma,self) and tcp on loopback.
#include "epcomm/ucx/transport.hpp"
#include "support/ll_suite.hpp"

TYPE_TO_STRING(epcomm::ucx::transport);
EPCOMM_LL_RMA_SUITE(epcomm::ucx::transport);
