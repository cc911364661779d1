// The runtime switch both modes' device buffers look their kernels up in.
// Kernels are templates on the problem's axes (token or wire type, ranks,
// hidden); each explicit instantiation registers its launchers during static
// initialisation (normal/cuda/instantiate.cuh, low_latency/cuda/instantiate.cuh)
// and a call takes the most specialised entry that fits, by the mode's own
// order of preference (normal/cuda/registry.hpp, low_latency/cuda/registry.hpp).
//
// Host-only and free of CUDA headers: launchers are opaque function pointers,
// and the stream type is CUDA's own cudaStream_t spelled without its header.
#pragma once

#include <mutex>
#include <span>
#include <string>
#include <vector>

struct CUstream_st;

namespace epcomm::cuda {

using stream_t = CUstream_st*;  // == cudaStream_t

// Entries of one kind (Entry has a `key` with operator==), shared by every
// thread of the process.
template <class Entry>
class registry {
 public:
  // A key registered twice (one template in two translation units) keeps the
  // first: both launch identical code.
  void add(const Entry& entry) {
    std::lock_guard lock(mutex_);
    for (const Entry& e : entries_)
      if (e.key == entry.key) return;
    entries_.push_back(entry);
  }

  // `select(entries)` returns the entry a call takes, or null. Copies it, so
  // that the caller holds no reference into the registry.
  template <class Select>
  bool find(Select select, Entry& out) const {
    std::lock_guard lock(mutex_);
    const Entry* e = select(std::span<const Entry>(entries_));
    if (e != nullptr) out = *e;
    return e != nullptr;
  }

  // The entries `keep` accepts, each as `text` words it, comma-separated
  // ("none" if there are none): what an error message lists as available.
  template <class Keep, class Text>
  std::string describe(Keep keep, Text text) const {
    std::lock_guard lock(mutex_);
    std::string s;
    for (const Entry& e : entries_) {
      if (!keep(e)) continue;
      if (!s.empty()) s += ", ";
      s += text(e);
    }
    return s.empty() ? "none" : s;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

}  // namespace epcomm::cuda
