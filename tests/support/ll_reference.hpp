// An independent reference for low-latency dispatch/combine: plain loops over
// every rank's regenerated input, sharing no code with the library beyond the
// element conversions and the fp8 cast it is defined by.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/low_latency/arguments.hpp"
#include "support/workload.hpp"

namespace epcomm::test {

// One call's inputs on every rank (any rank regenerates all of them).
struct ll_call {
  int hidden = 0;
  int topk = 0;
  int experts = 0;
  std::vector<rank_input<bf16>> in;  // [R]
  std::vector<int> tokens;           // [R]
};

// `call` as the survivors see it once rank `lost` is gone: it sends nothing,
// and every (token, top-k slot) routed to one of its experts contributes
// nothing, like an unrouted slot. Returns how many such slots `rank` has.
inline std::uint64_t without_rank(test::ll_call& call, int lost, int local_experts, int rank) {
  call.tokens[lost] = 0;
  std::uint64_t masked = 0;
  for (std::size_t r = 0; r < call.in.size(); ++r)
    for (auto& e : call.in[r].topk_idx)
      if (e >= 0 && e / local_experts == lost) {
        e = -1;
        if (static_cast<int>(r) == rank) ++masked;
      }
  return masked;
}

// Regenerates one call's inputs on every rank: rank r has tokens[r] tokens;
// with repeat_expert the last top-k slot repeats the first, so a token names
// one expert twice (two rows there, two contributions in combine).
inline ll_call make_ll_call(int world, int hidden, int topk, int experts,
                            const std::vector<int>& tokens, routing route, std::uint64_t seed,
                            bool repeat_expert = false) {
  ll_call call{hidden, topk, experts, {}, tokens};
  for (int r = 0; r < world; ++r) {
    const shape s{world, tokens[r], hidden, topk, experts, route, seed};
    call.in.push_back(make_input<bf16>(s, r));
    if (repeat_expert && topk > 1)
      for (int t = 0; t < tokens[r]; ++t)
        call.in[r].topk_idx[static_cast<std::size_t>(t) * topk + topk - 1] =
            call.in[r].topk_idx[static_cast<std::size_t>(t) * topk];
  }
  return call;
}

// The expert every test applies: different per expert (scale and offset) so a
// row that lands at the wrong expert or slot shows up in combine.
inline float ll_expert(float v, int expert) {
  return v * (1.0f + 0.125f * static_cast<float>(expert)) +
         0.03125f * static_cast<float>(expert % 5);
}

// Token t of rank src as it travels on the wire: bf16 unchanged, or the fp8
// cast with its scales.
template <class Wire>
struct wire_row {
  std::vector<Wire> x;
  std::vector<float> scales;
};

template <class Wire>
wire_row<Wire> cast_row(const bf16* x, int hidden, bool round_scale) {
  wire_row<Wire> r;
  r.x.resize(hidden);
  if constexpr (std::is_same_v<Wire, fp8_e4m3>) {
    r.scales.resize(hidden / fp8_block);
    for (int b = 0; b < hidden / fp8_block; ++b) {
      float amax = 0;
      for (int c = 0; c < fp8_block; ++c)
        amax = std::max(amax, std::fabs(to_float(x[b * fp8_block + c])));
      const float inv = fp8_block_inv_scale(amax, round_scale);
      r.scales[b] = fp8_block_scale(amax, round_scale);
      for (int c = 0; c < fp8_block; ++c)
        r.x[b * fp8_block + c] = to_fp8_e4m3(to_float(x[b * fp8_block + c]) * inv);
    }
  } else {
    std::copy(x, x + hidden, r.x.begin());
  }
  return r;
}

template <class Wire>
float wire_value(const Wire* x, const float* scales, int c) {
  if constexpr (std::is_same_v<Wire, fp8_e4m3>)
    return to_float(x[c]) * scales[c / fp8_block];
  else
    return to_float(x[c]);
}

// Scale group g of packed row `row` of local expert le, decoded as DeepEP
// documents its layouts (see low_latency/scale_layout.hpp; written here
// without the library's helpers). NaN when the views are too short.
template <class Wire>
float received_scale(const ll_dispatch_result<Wire>& res, ll_scale_layout layout,
                     std::size_t rows_per_expert, std::size_t groups, std::size_t le,
                     std::size_t row, std::size_t g) {
  const std::size_t stride = (rows_per_expert + 3) / 4 * 4;  // tokens, 16-byte aligned
  std::size_t at = 0;
  switch (layout) {
    case ll_scale_layout::row_major:
      at = (le * rows_per_expert + row) * groups + g;
      break;
    case ll_scale_layout::token_major:
      at = (le * groups + g) * stride + row;
      break;
    case ll_scale_layout::ue8m0: {
      const std::size_t words = (groups + 3) / 4;
      at = (le * words + g / 4) * stride + row;
      if (at >= res.recv_x_scales_ue8m0.size()) return NAN;
      const auto word = static_cast<std::uint32_t>(res.recv_x_scales_ue8m0[at]);
      const int exponent = static_cast<int>((word >> (8 * (g % 4))) & 0xFFu);
      return std::ldexp(1.0f, exponent - 127);
    }
  }
  return at < res.recv_x_scales.size() ? res.recv_x_scales[at] : NAN;
}

// Checks everything rank `rank` received against the inputs of every rank.
template <class Wire>
std::string check_ll_dispatch(const ll_call& call, int rank, int world, int max_tokens,
                              bool round_scale, const ll_dispatch_result<Wire>& res,
                              ll_scale_layout layout = ll_scale_layout::row_major) {
  std::ostringstream err;
  const int el = call.experts / world;
  const std::size_t h = call.hidden;
  const std::size_t ns = std::is_same_v<Wire, fp8_e4m3> ? h / fp8_block : 0;
  const std::size_t rows_per_expert = static_cast<std::size_t>(world) * max_tokens;
  auto fail = [&](const std::string& what) {
    if (err.tellp() == 0) err << what;
  };
  if (res.recv_x.size() != el * rows_per_expert * h ||
      res.recv_src.size() != el * rows_per_expert ||
      res.recv_count.size() != static_cast<std::size_t>(el) ||
      res.recv_range.size() != static_cast<std::size_t>(el) * world)
    return "result views have the wrong sizes";
  const std::size_t scale_words = layout == ll_scale_layout::row_major ? el * rows_per_expert * ns
                                  : layout == ll_scale_layout::token_major
                                      ? el * ((rows_per_expert + 3) / 4 * 4) * ns
                                      : el * ((rows_per_expert + 3) / 4 * 4) * ((ns + 3) / 4);
  const bool ue8m0 = layout == ll_scale_layout::ue8m0;
  if ((ue8m0 ? res.recv_x_scales_ue8m0.size() : res.recv_x_scales.size()) != scale_words ||
      (ue8m0 ? res.recv_x_scales.size() : res.recv_x_scales_ue8m0.size()) != 0)
    return "scale views have the wrong sizes";
  for (int le = 0; le < el; ++le) {
    const std::int64_t expert = static_cast<std::int64_t>(rank) * el + le;
    int row = 0;
    for (int s = 0; s < world; ++s) {
      const int begin = row;
      const auto& in = call.in[s];
      for (int t = 0; t < call.tokens[s]; ++t) {
        for (int j = 0; j < call.topk; ++j) {
          if (in.topk_idx[static_cast<std::size_t>(t) * call.topk + j] != expert) continue;
          const std::size_t at = le * rows_per_expert + row;
          const std::string where = "expert " + std::to_string(le) + " row " + std::to_string(row) +
                                    " (src " + std::to_string(s) + ", token " + std::to_string(t) +
                                    ", slot " + std::to_string(j) + "): ";
          if (row < res.recv_count[le]) {
            const auto& src = res.recv_src[at];
            if (src.rank != s || src.token != t || src.topk_slot != j)
              fail(where + "source is (" + std::to_string(src.rank) + ", " +
                   std::to_string(src.token) + ", " + std::to_string(src.topk_slot) + ")");
            const auto w = cast_row<Wire>(in.x.data() + t * h, call.hidden, round_scale);
            if (std::memcmp(res.recv_x.data() + at * h, w.x.data(), h * sizeof(Wire)) != 0)
              fail(where + "x differs");
            for (std::size_t g = 0; g < ns; ++g) {
              const float got = received_scale(res, layout, rows_per_expert, ns, le, row, g);
              if (std::memcmp(&got, &w.scales[g], 4) != 0)
                fail(where + "scale " + std::to_string(g) + " is " + std::to_string(got) +
                     ", expected " + std::to_string(w.scales[g]));
            }
          }
          ++row;
        }
      }
      const auto& r = res.recv_range[static_cast<std::size_t>(le) * world + s];
      if (r.begin != begin || r.count != row - begin)
        fail("expert " + std::to_string(le) + " range from rank " + std::to_string(s) + " is [" +
             std::to_string(r.begin) + ", +" + std::to_string(r.count) + "), expected [" +
             std::to_string(begin) + ", +" + std::to_string(row - begin) + ")");
    }
    if (res.recv_count[le] != row)
      fail("expert " + std::to_string(le) + " received " + std::to_string(res.recv_count[le]) +
           " rows, expected " + std::to_string(row));
  }
  return err.str();
}

// The expert outputs this rank computes from what it received, written into
// y[E_local][R * max_tokens][H] (rows past recv_count are left alone).
template <class Wire>
void ll_expert_rows(const ll_dispatch_result<Wire>& res, int rank, int el, int hidden,
                    std::size_t rows_per_expert, std::span<bf16> y,
                    ll_scale_layout layout = ll_scale_layout::row_major) {
  const std::size_t h = hidden;
  const std::size_t ns = std::is_same_v<Wire, fp8_e4m3> ? h / fp8_block : 0;
  std::vector<float> scales(ns);
  for (int le = 0; le < el; ++le)
    for (std::size_t i = 0; i < static_cast<std::size_t>(res.recv_count[le]); ++i) {
      const std::size_t row = le * rows_per_expert + i;
      for (std::size_t g = 0; g < ns; ++g)
        scales[g] = received_scale(res, layout, rows_per_expert, ns, le, i, g);
      for (std::size_t c = 0; c < h; ++c)
        y[row * h + c] = to_bf16(
            ll_expert(wire_value(res.recv_x.data() + row * h, scales.data(), static_cast<int>(c)),
                      rank * el + le));
    }
}

// Checks rank `rank`'s combined output twice against float64 references:
//  - tightly against the data path (the wire cast, the expert's bf16 output):
//    only fp32 accumulation and the final bf16 rounding may differ;
//  - loosely against the exact math on the original bf16 input: within the
//    wire format's error (bf16 or fp8) plus the bf16 outputs.
template <class Wire>
std::string check_ll_combine(const ll_call& call, int rank, bool round_scale,
                             std::span<const bf16> out) {
  const auto& in = call.in[rank];
  const int t_count = call.tokens[rank];
  const std::size_t h = call.hidden, k = call.topk;
  constexpr bool fp8 = std::is_same_v<Wire, fp8_e4m3>;
  if (out.size() != t_count * h)
    return "combine output holds " + std::to_string(out.size()) + " values, expected " +
           std::to_string(t_count * h);
  for (int t = 0; t < t_count; ++t) {
    const auto w = cast_row<Wire>(in.x.data() + t * h, call.hidden, round_scale);
    for (std::size_t c = 0; c < h; ++c) {
      double path = 0, path_mag = 0, exact = 0, bound = 0;
      for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t e = in.topk_idx[t * k + j];
        if (e < 0) continue;
        const double wt = in.topk_weights[t * k + j];
        const double y = to_float(to_bf16(ll_expert(
            wire_value(w.x.data(), w.scales.data(), static_cast<int>(c)), static_cast<int>(e))));
        path += wt * y;
        path_mag += std::fabs(wt * y);
        const double x = to_float(in.x[t * h + c]);
        const double f = 1.0 + 0.125 * e;
        exact += wt * (x * f + 0.03125 * (e % 5));
        // fp8: 3 mantissa bits (relative 2^-4) or, below the normal range, an
        // absolute step of scale * 2^-9; then the expert's bf16 rounding.
        const double cast = fp8 ? std::fabs(x) * 0x1p-4 + w.scales[c / fp8_block] * 0x1p-9 : 0;
        bound += std::fabs(wt) * (f * cast + 0x1p-8 * std::fabs(y));
      }
      const double got = to_float(out[t * h + c]);
      const double tight = 0x1p-8 * std::fabs(path) + 0x1p-20 * path_mag + 1e-30;
      const double loose = bound + 0x1p-8 * std::fabs(exact) + 0x1p-20 * path_mag + 1e-30;
      if (std::fabs(got - path) > tight || std::fabs(got - exact) > loose) {
        std::ostringstream err;
        err << "combine token " << t << " channel " << c << ": got " << got << ", data path "
            << path << " (tolerance " << tight << "), exact " << exact << " (tolerance " << loose
            << ")";
        return err.str();
      }
    }
  }
  return {};
}

}  // namespace epcomm::test
