// An independent reference for normal-mode dispatch/combine: plain loops over
// every rank's regenerated input, sharing no code with the library's layout.
#pragma once

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "epcomm/normal/arguments.hpp"
#include "support/workload.hpp"

namespace epcomm::test {

// The "expert" every test applies to a received row: different per rank and
// per channel so a row that lands on the wrong rank or position shows up.
template <class Out, class Token>
Out expert_output(const Token* x, const float* scales, int c, int rank) {
  float v;
  if constexpr (token_traits<Token>::has_scales)
    v = to_float(x[c]) * scales[c / fp8_block];
  else
    v = to_float(x[c]);
  return from_float<Out>(v * static_cast<float>(1 + rank) + 0.25f * static_cast<float>(rank));
}

// `padded_source`: a lost rank whose rows never all arrived (mask_lost_ranks);
// its rows must read as padding (src_idx and topk_idx -1, weight 0).
// `expert_alignment`: the dispatch's option, by which per-expert counts round up.
template <token_type Token>
std::string check_dispatch(const shape& s, int rank, const std::vector<rank_input<Token>>& all,
                           const dispatch_result<Token>& res, int padded_source = -1,
                           int expert_alignment = 1) {
  std::ostringstream err;
  const int per_rank = s.experts / s.world;
  const std::size_t h = s.hidden, k = s.topk,
                    ns = token_traits<Token>::has_scales ? h / fp8_block : 0;
  std::vector<int> per_expert(per_rank, 0);
  int row = 0;
  for (int src = 0; src < s.world; ++src) {
    const auto& in = all[src];
    const bool padded = src == padded_source;
    for (int t = 0; t < s.tokens; ++t) {
      bool mine = false;
      for (std::size_t j = 0; j < k; ++j) {
        const auto e = in.topk_idx[t * k + j];
        if (e >= rank * per_rank && e < (rank + 1) * per_rank) {
          mine = true;
          if (!padded) ++per_expert[e - rank * per_rank];
        }
      }
      if (!mine) continue;
      if (row >= res.num_recv_tokens) {
        ++row;
        continue;
      }
      auto fail = [&](const char* what) {
        if (err.tellp() == 0)
          err << "row " << row << " (src rank " << src << ", token " << t << "): " << what;
      };
      if (padded) {
        if (res.recv_src_idx[row] != -1) fail("src_idx of a padding row is not -1");
        for (std::size_t j = 0; j < k; ++j)
          if (res.recv_topk_idx[row * k + j] != -1 || res.recv_topk_weights[row * k + j] != 0.0f)
            fail("topk_idx / weight of a padding row is not -1 / 0");
        ++row;
        continue;
      }
      if (std::memcmp(res.recv_x.data() + row * h, in.x.data() + t * h, h * sizeof(Token)) != 0)
        fail("x differs");
      if (ns &&
          std::memcmp(res.recv_x_scales.data() + row * ns, in.scales.data() + t * ns, ns * 4) != 0)
        fail("scales differ");
      if (res.recv_src_idx[row] != t) fail("src_idx differs");
      for (std::size_t j = 0; j < k; ++j) {
        const auto e = in.topk_idx[t * k + j];
        const std::int64_t local =
            e >= rank * per_rank && e < (rank + 1) * per_rank ? e - rank * per_rank : -1;
        if (res.recv_topk_idx[row * k + j] != local) fail("topk_idx differs");
        const float w = local >= 0 ? in.topk_weights[t * k + j] : 0.0f;
        if (res.recv_topk_weights[row * k + j] != w) fail("topk_weights differ");
      }
      ++row;
    }
  }
  if (row != res.num_recv_tokens)
    err << " received " << res.num_recv_tokens << " rows, expected " << row;
  for (int& n : per_expert)
    if (n % expert_alignment != 0) n += expert_alignment - n % expert_alignment;
  if (res.num_recv_tokens_per_expert != per_expert) err << " tokens per expert differ";
  return err.str();
}

// y for this rank's received rows (as the expert would produce it).
template <token_type Token>
std::vector<combine_type_t<Token>> expert_rows(const dispatch_result<Token>& res, int hidden,
                                               int rank) {
  using Out = combine_type_t<Token>;
  const std::size_t h = hidden, ns = token_traits<Token>::has_scales ? h / fp8_block : 0;
  const std::size_t rows = res.recv_x.size() / h;
  std::vector<Out> y(rows * h);
  for (std::size_t r = 0; r < static_cast<std::size_t>(res.num_recv_tokens); ++r)
    for (std::size_t c = 0; c < h; ++c)
      y[r * h + c] = expert_output<Out>(res.recv_x.data() + r * h,
                                        ns ? res.recv_x_scales.data() + r * ns : nullptr,
                                        static_cast<int>(c), rank);
  return y;
}

template <token_type Token>
std::string check_combine(const shape& s, const rank_input<Token>& in,
                          const combine_result<combine_type_t<Token>>& out) {
  using Out = combine_type_t<Token>;
  const int per_rank = s.experts / s.world;
  const std::size_t h = s.hidden, k = s.topk,
                    ns = token_traits<Token>::has_scales ? h / fp8_block : 0;
  const double eps = std::is_same_v<Out, float> ? std::ldexp(1.0, -22) : std::ldexp(1.0, -7);
  for (int t = 0; t < s.tokens; ++t) {
    std::vector<bool> dest(s.world, false);
    for (std::size_t j = 0; j < k; ++j)
      if (in.topk_idx[t * k + j] >= 0) dest[in.topk_idx[t * k + j] / per_rank] = true;
    for (std::size_t c = 0; c < h; ++c) {
      double ref = 0, mag = 0;
      for (int r = 0; r < s.world; ++r) {
        if (!dest[r]) continue;
        const double v = to_float(expert_output<Out>(
            in.x.data() + t * h, ns ? in.scales.data() + t * ns : nullptr, static_cast<int>(c), r));
        ref += v;
        mag += std::fabs(v);
      }
      const double got = to_float(out.x[t * h + c]);
      if (std::fabs(got - ref) > eps * mag + 1e-30)
        return "combine token " + std::to_string(t) + " channel " + std::to_string(c) + ": got " +
               std::to_string(got) + ", expected " + std::to_string(ref);
    }
    for (std::size_t j = 0; j < k; ++j) {
      const float w = in.topk_idx[t * k + j] >= 0 ? in.topk_weights[t * k + j] : 0.0f;
      if (out.topk_weights[t * k + j] != w)
        return "combined weight token " + std::to_string(t) + " slot " + std::to_string(j) +
               " differs";
    }
  }
  return {};
}

}  // namespace epcomm::test
