// Host-side checks of the device low-latency path, before any kernel runs:
// what the host can see of a call's input (counts, null pointers, the
// handle). Expert ids and the dispatched routing live in device memory and
// are checked by the kernels. The configuration agreement and the checks
// both engines make are low_latency/validation.hpp's; the rest keeps the
// host engine's (low_latency/buffer.hpp) wording and order. A non-empty cause does
// not throw here: it travels as the rank's reject record, so every rank
// rejects the call together.
#pragma once

#include <cstdint>
#include <string>

#include "epcomm/low_latency/validation.hpp"
#include "epcomm/low_latency/wire.hpp"

namespace epcomm::cuda {

// What the host sees of a dispatch: counts and whether the pointers are set.
struct ll_dispatch_request {
  int num_tokens;
  int topk;
  bool has_x;
  bool has_topk_idx;
};

inline std::string check_ll_dispatch(const wire::ll::shape& s, const ll_dispatch_request& in) {
  if (std::string cause = check_ll_counts(s, in.num_tokens, in.topk); !cause.empty()) return cause;
  // The host engine checks span sizes here; device pointers carry none.
  if (in.num_tokens > 0 && !in.has_x)
    return "x is null with " + std::to_string(in.num_tokens) + " tokens";
  if (in.num_tokens > 0 && !in.has_topk_idx)
    return "topk_idx is null with " + std::to_string(in.num_tokens) + " tokens";
  return {};
}

// What the host sees of a combine: the handle against the dispatch this rank
// last issued on the handle's parity, and the pointers.
struct ll_combine_request {
  int parity;
  std::uint64_t handle_dispatch;  // the handle's dispatch number on its parity
  std::uint64_t last_dispatch;    // the parity's last dispatch number
  bool dispatch_accepted;         // that dispatch was not rejected on the host
  int handle_tokens, handle_topk;
  int dispatch_tokens, dispatch_topk;
  bool has_y, has_topk_idx, has_topk_weights;
};

inline std::string check_ll_combine(const ll_combine_request& in) {
  if (std::string cause =
          check_ll_handle({in.parity, in.handle_dispatch, in.last_dispatch, in.dispatch_accepted,
                           in.handle_tokens, in.handle_topk, in.dispatch_tokens, in.dispatch_topk});
      !cause.empty())
    return cause;
  if (!in.has_y) return "y is null";
  const long long tk = static_cast<long long>(in.handle_tokens) * in.handle_topk;
  if (tk > 0 && (!in.has_topk_idx || !in.has_topk_weights))
    return std::string(!in.has_topk_idx ? "topk_idx" : "topk_weights") +
           " is null with T*K = " + std::to_string(tk) + " values";
  return {};
}

}  // namespace epcomm::cuda
