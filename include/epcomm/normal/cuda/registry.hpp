// The runtime switch over explicitly instantiated normal-mode kernels. Kernels
// are templates on the token type and on the topology values that size their
// loops (ranks, hidden; 0 = taken from the call at run time). Each
// instantiation registers its launchers here (EPCOMM_CUDA_INSTANTIATE_NORMAL
// in instantiate.cuh), and a call picks the most specialised one that fits.
//
// Host-only and free of CUDA headers: the launchers are opaque function
// pointers, and the stream type is CUDA's own cudaStream_t spelled without
// its header.
#pragma once

#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "epcomm/normal/cuda/launch.hpp"

struct CUstream_st;

namespace epcomm::cuda {

using stream_t = CUstream_st*;  // == cudaStream_t

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

class kernel_registry {
 public:
  // The process-wide registry that instantiation macros fill during static
  // initialisation.
  static kernel_registry& global() {
    static kernel_registry r;
    return r;
  }

  // Adds an instantiation; a key registered twice (the same template in two
  // translation units) keeps the first, as both launch identical code.
  void add(const normal_kernels& k) {
    std::lock_guard lock(mutex_);
    for (const normal_kernels& e : entries_)
      if (e.key == k.key) return;
    entries_.push_back(k);
  }

  // Copies the entry so the caller holds no reference into the registry.
  bool find(int token_id, int ranks, int hidden, bool vector_aligned, normal_kernels& out) const {
    std::lock_guard lock(mutex_);
    const normal_kernels* e = select_kernels(entries_, token_id, ranks, hidden, vector_aligned);
    if (e != nullptr) out = *e;
    return e != nullptr;
  }

  // "(ranks, hidden)" pairs instantiated for token_id, for error messages.
  std::string describe(int token_id) const {
    std::lock_guard lock(mutex_);
    std::string s;
    for (const normal_kernels& e : entries_) {
      if (e.key.token_id != token_id) continue;
      if (!s.empty()) s += ", ";
      s += "(ranks " + (e.key.ranks ? std::to_string(e.key.ranks) : std::string("any")) +
           ", hidden " + (e.key.hidden ? std::to_string(e.key.hidden) : std::string("any")) + ")";
    }
    return s.empty() ? "none" : s;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<normal_kernels> entries_;
};

}  // namespace epcomm::cuda
