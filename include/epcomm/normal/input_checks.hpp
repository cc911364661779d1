// Normal mode's checks of a call's arguments, written once for the flat and
// the hierarchical host engine and the device buffer's host side, so that a
// given mistake gets the same words whichever engine finds it. Each returns
// empty when the arguments fit the buffer, else why not; the engines carry
// that text in their notify or combine-status round, so every rank rejects
// the call together.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/layout.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/arguments.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm {

inline std::string wrong_size(const char* what, std::size_t held, const char* unit,
                              const char* shape, std::size_t expected) {
  return input_error_text(describe_wrong_size, what, static_cast<long long>(held), unit, shape,
                          static_cast<long long>(expected));
}

// A call's shape against the buffer's bounds; `scaled`: the call's token
// type carries fp8 scales.
inline std::string check_dispatch_bounds(const wire::capacity& cap, bool scaled, int num_tokens,
                                         int hidden, int topk) {
  const auto n = [](long long v) { return std::to_string(v); };
  if (num_tokens < 0) return "num_tokens is negative";
  if (num_tokens > cap.max_tokens_per_rank)
    return n(num_tokens) + " tokens exceed the buffer's max_tokens_per_rank " +
           n(cap.max_tokens_per_rank);
  if (hidden < 1 || hidden > cap.max_hidden)
    return "hidden " + n(hidden) + " is outside [1, " + n(cap.max_hidden) + "]";
  if (scaled && hidden % 128 != 0) return input_error_text(describe_unscaled_hidden, hidden);
  if (topk < 1 || topk > cap.max_topk)
    return "topk " + n(topk) + " is outside [1, " + n(cap.max_topk) + "]";
  return {};
}

// x [T][H] and, for fp8, x_scales [T][H/128], given their element counts.
template <token_type Token>
std::string check_rows(std::size_t x, std::size_t scales, std::size_t t, std::size_t h) {
  if (x != t * h) return wrong_size("x", x, "elements", "T*H", t * h);
  const std::size_t expected = token_traits<Token>::has_scales ? t * (h / 128) : 0;
  if (scales != expected)
    return "x_scales holds " + std::to_string(scales) + " values, expected " +
           std::to_string(expected);
  return {};
}

template <token_type Token>
std::string check_dispatch_input(const dispatch_input<Token>& in, const dispatch_options& opt,
                                 const wire::capacity& cap) {
  if (auto bad = check_dispatch_bounds(cap, token_traits<Token>::has_scales, in.num_tokens,
                                       in.hidden, in.topk);
      !bad.empty())
    return bad;
  const auto t = static_cast<std::size_t>(in.num_tokens);
  const auto k = static_cast<std::size_t>(in.topk);
  if (auto bad = check_rows<Token>(in.x.size(), in.x_scales.size(), t, in.hidden); !bad.empty())
    return bad;
  if (in.topk_idx.size() != t * k)
    return wrong_size("topk_idx", in.topk_idx.size(), "ids", "T*K", t * k);
  if (in.topk_weights.size() != t * k)
    return wrong_size("topk_weights", in.topk_weights.size(), "values", "T*K", t * k);
  if (auto bad = check_dispatch_options(opt, cap.max_recv_tokens); !bad.empty()) return bad;
  if (auto bad = find_invalid_expert(in.topk_idx, in.topk, cap.num_experts)) return *bad;
  return {};
}

// `h` is a handle a dispatch of rank `rank` returned, within the buffer's bounds.
inline std::string check_own_handle(const dispatch_handle& h, int rank, const wire::capacity& cap) {
  return check_handle(h, rank, cap.world_size, cap.max_tokens_per_rank, cap.max_hidden,
                      cap.max_topk);
}

// A dispatch along the routing of `h`: rows for its tokens and hidden.
template <token_type Token>
std::string check_cached_dispatch_input(const cached_dispatch_input<Token>& in,
                                        const dispatch_handle& h, int rank,
                                        const wire::capacity& cap) {
  if (auto bad = check_own_handle(h, rank, cap); !bad.empty()) return bad;
  if (token_traits<Token>::has_scales && h.hidden % 128 != 0)
    return input_error_text(describe_unscaled_hidden, h.hidden);
  return check_rows<Token>(in.x.size(), in.x_scales.size(), h.num_tokens, h.hidden);
}

// A combine answering `h`, writing out_x [T][H] and out_weights [T][K] (when
// in.topk_weights is given).
template <class Out>
std::string check_combine_input(const combine_input<Out>& in, const dispatch_handle& h,
                                std::span<const Out> out_x, std::span<const float> out_weights,
                                int rank, const wire::capacity& cap) {
  const auto n = [](long long v) { return std::to_string(v); };
  if (auto bad = check_own_handle(h, rank, cap); !bad.empty()) return bad;
  const std::size_t hidden = h.hidden;
  const std::size_t t = h.num_tokens;
  const std::size_t k = h.topk;
  if (in.y.size() % hidden != 0 || in.y.size() < h.num_recv_tokens * hidden)
    return input_error_text(describe_short_y, static_cast<long long>(in.y.size()),
                            static_cast<long long>(hidden), h.num_recv_tokens);
  const std::size_t rows = in.y.size() / hidden;
  if (in.topk_weights && in.topk_weights->size() != rows * k)
    return "topk_weights holds " + n(in.topk_weights->size()) + " values, expected " + n(rows * k) +
           " (rows of y times topk)";
  for (auto bias : {in.bias_0, in.bias_1})
    if (!bias.empty() && bias.size() != t * hidden)
      return wrong_size("bias", bias.size(), "elements", "T*H", t * hidden);
  if (out_x.size() != t * hidden)
    return wrong_size("output", out_x.size(), "elements", "T*H", t * hidden);
  if (in.topk_weights && out_weights.size() != t * k)
    return "output weights hold " + n(out_weights.size()) + " values, expected T*K = " + n(t * k);
  return {};
}

}  // namespace epcomm
