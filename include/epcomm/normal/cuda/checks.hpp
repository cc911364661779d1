// Host-side checks of a device call's arguments, before any kernel runs. Only
// what the host can see: shapes, bounds and null pointers (expert ids live in
// device memory and are checked by the layout kernel). The bounds are
// normal/input_checks.hpp's, as the host engines check them. A
// non-empty result does not throw here: it travels in the notify round, so
// every rank rejects the call together.
#pragma once

#include <cstdint>
#include <string>

#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/input_checks.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm::cuda {

struct dispatch_shape {
  int num_tokens;
  int hidden;
  int topk;
  bool has_x, has_scales, has_topk_idx, has_topk_weights;  // non-null pointers
};

// x and x_scales for num_tokens rows (both dispatches); `scaled`: the call's
// token type carries fp8 scales (a buffer may serve several types).
inline std::string check_row_pointers(bool scaled, int num_tokens, bool has_x, bool has_scales) {
  if (num_tokens > 0 && !has_x) return "x is null with " + std::to_string(num_tokens) + " tokens";
  if (num_tokens > 0 && scaled && !has_scales) return "x_scales is null for fp8 tokens";
  if (!scaled && has_scales) return "x_scales given for a token type without scales";
  return {};
}

inline std::string check_dispatch_shape(const wire::capacity& cap, bool scaled,
                                        const dispatch_shape& in) {
  const auto n = [](long long v) { return std::to_string(v); };
  if (auto bad = check_dispatch_bounds(cap, scaled, in.num_tokens, in.hidden, in.topk);
      !bad.empty())
    return bad;
  if (auto bad = check_row_pointers(scaled, in.num_tokens, in.has_x, in.has_scales); !bad.empty())
    return bad;
  if (in.num_tokens > 0) {
    if (!in.has_topk_idx) return "topk_idx is null with " + n(in.num_tokens) + " tokens";
    if (!in.has_topk_weights) return "topk_weights is null with " + n(in.num_tokens) + " tokens";
  }
  return {};
}

struct cached_dispatch_shape {
  // From the handle of the dispatch whose routing the call follows.
  int handle_rank, handle_world;
  int num_tokens, hidden, topk;
  bool has_x, has_scales;  // non-null pointers
};

// A handle is plain data a caller could alter: its shape must be one a
// dispatch of this buffer could have returned (the kernels index the slot's
// routing by its token count). The rows' type may differ from the one the
// handle's dispatch moved: fp8 rows then need a hidden of whole scale blocks.
inline std::string check_cached_dispatch_shape(const wire::capacity& cap, bool scaled, int rank,
                                               int world, const cached_dispatch_shape& in) {
  if (in.handle_world != world || in.handle_rank != rank)
    return input_error_text(describe_foreign_handle, in.handle_rank, in.handle_world);
  if (!check_dispatch_bounds(cap, false, in.num_tokens, in.hidden, in.topk).empty())
    return input_error_text(describe_malformed_handle);
  // A shape some dispatch could have had: what the rows' own type adds.
  if (auto bad = check_dispatch_bounds(cap, scaled, in.num_tokens, in.hidden, in.topk);
      !bad.empty())
    return bad;
  return check_row_pointers(scaled, in.num_tokens, in.has_x, in.has_scales);
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
