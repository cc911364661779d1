// The runtime switch over explicitly instantiated normal-mode kernels. Kernels
// are templates on the token type and on the topology values that size their
// loops (ranks, hidden; 0 = taken from the call at run time). Each
// instantiation registers its launchers here (EPCOMM_CUDA_INSTANTIATE_NORMAL
// in instantiate.cuh), and a call picks the most specialised one that fits.
#pragma once

#include <span>
#include <string>

#include "epcomm/cuda/registry.hpp"
#include "epcomm/normal/cuda/launch.hpp"

namespace epcomm::cuda {

// Launchers enqueue their kernels on the stream and return the first launch
// error as a cudaError_t value (0 = success).
using dispatch_launcher = int (*)(const dispatch_args&, stream_t);
using combine_launcher = int (*)(const combine_args&, stream_t);

// token_id: token_traits<Token>::id. ranks / hidden: the compile-time values,
// 0 where the kernel reads them from the call.
struct kernel_key {
  int token_id;
  int ranks;
  int hidden;
  friend bool operator==(const kernel_key&, const kernel_key&) = default;
};

struct normal_kernels {
  kernel_key key;
  dispatch_launcher dispatch;  // layout + notify + token rows
  combine_launcher combine;    // readiness + returned rows + reduction
};

// The most specialised entry for a call, or null: exact (ranks, hidden), then
// ranks only, then hidden only, then fully generic. Hidden-specialised kernels
// move rows in 16-byte vectors only, so they are eligible only when the call's
// rows and pointers are 16-byte aligned (`vector_aligned`).
inline const normal_kernels* select_kernels(std::span<const normal_kernels> entries, int token_id,
                                            int ranks, int hidden, bool vector_aligned) {
  const kernel_key order[] = {
      {token_id, ranks, hidden}, {token_id, ranks, 0}, {token_id, 0, hidden}, {token_id, 0, 0}};
  for (const kernel_key& want : order) {
    if (want.hidden != 0 && !vector_aligned) continue;
    for (const normal_kernels& e : entries)
      if (e.key == want) return &e;
  }
  return nullptr;
}

class kernel_registry : public registry<normal_kernels> {
 public:
  // The process-wide registry that instantiation macros fill during static
  // initialisation.
  static kernel_registry& global() {
    static kernel_registry r;
    return r;
  }

  bool find(int token_id, int ranks, int hidden, bool vector_aligned, normal_kernels& out) const {
    return registry::find(
        [&](std::span<const normal_kernels> entries) {
          return select_kernels(entries, token_id, ranks, hidden, vector_aligned);
        },
        out);
  }

  // "(ranks, hidden)" pairs instantiated for token_id, for error messages.
  std::string describe(int token_id) const {
    const auto any = [](int v) { return v != 0 ? std::to_string(v) : std::string("any"); };
    return registry::describe([&](const normal_kernels& e) { return e.key.token_id == token_id; },
                              [&](const normal_kernels& e) {
                                return "(ranks " + any(e.key.ranks) + ", hidden " +
                                       any(e.key.hidden) + ")";
                              });
  }
};

}  // namespace epcomm::cuda
