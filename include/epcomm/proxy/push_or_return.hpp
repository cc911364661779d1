// For code that pushes a sequence of descriptors through a proxy::channel
// (the kernels' push loops, cuda/*_route.hpp): push one, and return its
// status from the enclosing function unless it is ok, so that nothing after
// a failed push is pushed.
#pragma once

#include "epcomm/proxy/channel.hpp"

#define EPCOMM_PUSH_OR_RETURN(call)                                                   \
  do {                                                                                \
    const ::epcomm::proxy::channel_status epcomm_pushed_ = (call);                    \
    if (epcomm_pushed_ != ::epcomm::proxy::channel_status::ok) return epcomm_pushed_; \
  } while (false)
