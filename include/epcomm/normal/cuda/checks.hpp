// Host-side checks of a device call's arguments, before any kernel runs. Only
// what the host can see: shapes, bounds and null pointers (expert ids live in
// device memory and are checked by the layout kernel). The wording follows
// normal/buffer.hpp so either engine reports a given mistake the same way. A
// non-empty result does not throw here: it travels in the notify round, so
// every rank rejects the call together.
#pragma once

#include <cstdint>
#include <string>

#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm::cuda {

struct dispatch_shape {
  int num_tokens;
  int hidden;
  int topk;
  bool has_x, has_scales, has_topk_idx, has_topk_weights;  // non-null pointers
};

inline std::string check_dispatch_shape(const wire::capacity& cap, const dispatch_shape& in) {
  const auto n = [](long long v) { return std::to_string(v); };
  if (in.num_tokens < 0) return "num_tokens is negative";
  if (in.num_tokens > cap.max_tokens_per_rank)
    return n(in.num_tokens) + " tokens exceed the buffer's max_tokens_per_rank " +
           n(cap.max_tokens_per_rank);
  if (in.hidden < 1 || in.hidden > cap.max_hidden)
    return "hidden " + n(in.hidden) + " is outside [1, " + n(cap.max_hidden) + "]";
  if (cap.has_scales && in.hidden % 128 != 0)
    return input_error_text(describe_unscaled_hidden, in.hidden);
  if (in.topk < 1 || in.topk > cap.max_topk)
    return "topk " + n(in.topk) + " is outside [1, " + n(cap.max_topk) + "]";
  if (in.num_tokens > 0) {
    if (!in.has_x) return "x is null with " + n(in.num_tokens) + " tokens";
    if (cap.has_scales && !in.has_scales) return "x_scales is null for fp8 tokens";
    if (!in.has_topk_idx) return "topk_idx is null with " + n(in.num_tokens) + " tokens";
    if (!in.has_topk_weights) return "topk_weights is null with " + n(in.num_tokens) + " tokens";
  }
  if (!cap.has_scales && in.has_scales) return "x_scales given for a token type without scales";
  return {};
}

struct combine_shape {
  // From the handle of the dispatch being answered.
  int handle_rank, handle_world;
  int num_tokens, hidden, topk;
  long long y_rows;
  bool has_y, has_weights, has_out_x, has_out_weights;
};

inline std::string check_combine_shape(int rank, int world, const combine_shape& in) {
  const auto n = [](long long v) { return std::to_string(v); };
  if (in.handle_world != world || in.handle_rank != rank)
    return input_error_text(describe_foreign_handle, in.handle_rank, in.handle_world);
  if (in.y_rows < 0) return "y_rows is negative";
  if (in.y_rows > 0 && !in.has_y) return "y is null with " + n(in.y_rows) + " rows";
  if (in.num_tokens > 0 && !in.has_out_x)
    return "output is null with " + n(in.num_tokens) + " tokens";
  if (in.has_weights && in.num_tokens > 0 && !in.has_out_weights)
    return "topk_weights given but the output weights are null";
  return {};
}

}  // namespace epcomm::cuda
