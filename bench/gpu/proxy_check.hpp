// The GPU-fed proxy, checked end to end: on every rank a kernel writes a
// block for every rank into the transport's buffer, pushes put_signal
// descriptors through its proxy::channel, waits on its signal counters for
// every source's block, and compares what arrived with what each source
// wrote. Three rounds, alternating put_signal with put + signal + flush, so
// that buffers and counters are reused. Over libfabric (tcp;ofi_rxm) and UCX
// (tcp), bound to loopback unless the environment says otherwise.
#pragma once

#include <string>

#include "epcomm/bootstrap/local.hpp"

namespace epcomm::gpu_check {

// What a rank's check came to: 0 every block arrived intact, 1 a mismatch or
// a channel call that failed (text says which), 2 setup refused (no GPU, no
// mapping: text holds the epcomm::error).
struct proxy_check_outcome {
  int code = 0;
  std::string text;
};

// Loopback, as every test of this project, unless the environment already
// chose (FI_PROVIDER, FI_TCP_IFACE, UCX_TLS, UCX_NET_DEVICES).
void default_to_loopback();

#if defined(EPCOMM_GPU_PROXY_LIBFABRIC)
proxy_check_outcome gpu_fed_exchange_libfabric(local_bootstrap& boot);
#endif
#if defined(EPCOMM_GPU_PROXY_UCX)
proxy_check_outcome gpu_fed_exchange_ucx(local_bootstrap& boot);
#endif

}  // namespace epcomm::gpu_check
