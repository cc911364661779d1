// The runtime switch over explicitly instantiated low-latency kernels. Each
// call is a send kernel and a receive kernel; dispatch kernels are templates
// on the wire type (bf16 or fp8) and the hidden size, combine kernels (always
// bf16) on the hidden size only, 0 meaning "read at run time". Instantiations
// register here (low_latency/cuda/instantiate.cuh) and a call picks the most
// specialised pair that fits.
//
// Host-only and free of CUDA headers: launchers are opaque function pointers.
#pragma once

#include <span>
#include <string>

#include "epcomm/cuda/registry.hpp"
#include "epcomm/low_latency/cuda/launch.hpp"

namespace epcomm::cuda {

// Enqueues one kernel on the stream; returns the launch error as a
// cudaError_t value (0 = success).
using ll_launcher = int (*)(const ll_args&, stream_t);

struct ll_kernel_key {
  int wire_id;  // token_traits<Wire>::id; combine kernels: bf16's
  int hidden;   // 0: read from the call
  friend bool operator==(const ll_kernel_key&, const ll_kernel_key&) = default;
};

// The two phases of one operation (dispatch or combine).
struct ll_kernel_pair {
  ll_kernel_key key;
  ll_launcher send;
  ll_launcher recv;
};

// Exact hidden first, then the generic kernels. Hidden-specialised kernels
// move rows in whole 16-byte vectors, so they are eligible only when the
// call's pointers are 16-byte aligned (`vector_aligned`).
inline const ll_kernel_pair* select_ll_kernels(std::span<const ll_kernel_pair> entries, int wire_id,
                                               int hidden, bool vector_aligned) {
  const ll_kernel_key order[] = {{wire_id, hidden}, {wire_id, 0}};
  for (const ll_kernel_key& want : order) {
    if (want.hidden != 0 && !vector_aligned) continue;
    for (const ll_kernel_pair& e : entries)
      if (e.key == want) return &e;
  }
  return nullptr;
}

class ll_kernel_registry : public registry<ll_kernel_pair> {
 public:
  // The process-wide registries the instantiation macros fill during static
  // initialisation: one for dispatch kernels, one for combine kernels.
  static ll_kernel_registry& dispatch() {
    static ll_kernel_registry r;
    return r;
  }
  static ll_kernel_registry& combine() {
    static ll_kernel_registry r;
    return r;
  }

  bool find(int wire_id, int hidden, bool vector_aligned, ll_kernel_pair& out) const {
    return registry::find(
        [&](std::span<const ll_kernel_pair> entries) {
          return select_ll_kernels(entries, wire_id, hidden, vector_aligned);
        },
        out);
  }

  // The hidden sizes instantiated for wire_id, for error messages.
  std::string describe(int wire_id) const {
    return registry::describe(
        [&](const ll_kernel_pair& e) { return e.key.wire_id == wire_id; },
        [](const ll_kernel_pair& e) {
          return "hidden " + (e.key.hidden ? std::to_string(e.key.hidden) : std::string("any"));
        });
  }
};

}  // namespace epcomm::cuda
