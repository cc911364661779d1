// The UCX transport under the RMA contract suite and the normal-mode
// dispatch/combine suite. CTest runs this file once per transport selection,
// by UCX_TLS: shared memory (posix,sysv,cma,self) and tcp on loopback.
#include "epcomm/ucx/transport.hpp"
#include "support/dispatch_combine_suite.hpp"
#include "support/rma_transport_suite.hpp"

TYPE_TO_STRING(epcomm::ucx::transport);
EPCOMM_RMA_TRANSPORT_SUITE(epcomm::ucx::transport);
EPCOMM_DISPATCH_COMBINE_SUITE(epcomm::ucx::transport);
