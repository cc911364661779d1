// One rank's inputs for a workload: tokens, routing and weights, generated from (seed, rank)
// so every run of a workload moves the same data.
#pragma once

#include <cstdint>
#include <vector>

#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/core/token_types.hpp"
#include "options.hpp"

namespace epcomm::bench {

// splitmix64: fast, and good enough that the data has no pattern a copy could exploit.
class random_stream {
 public:
  explicit random_stream(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t x = (state_ += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  std::uint64_t state_;
};

// topk_idx[T][K]: `topk` distinct experts per token, drawn with weights (e + 1)^-skew.
std::vector<std::int64_t> make_routing(const workload& w, int rank);

template <token_type Token>
struct rank_input {
  std::vector<Token> x;                // [T][H]
  std::vector<float> scales;           // [T][H/128] for fp8, else empty
  std::vector<std::int64_t> topk_idx;  // [T][K]
  std::vector<float> topk_weights;     // [T][K]
};

template <token_type Token>
rank_input<Token> make_input(const workload& w, int rank) {
  rank_input<Token> in;
  const std::size_t t = static_cast<std::size_t>(w.tokens);
  const std::size_t h = static_cast<std::size_t>(w.hidden);
  random_stream values(w.seed * 0x100000001b3ull + static_cast<std::uint64_t>(rank) * 2 + 1);
  in.x.resize(t * h);
  if constexpr (token_traits<Token>::has_scales) in.scales.resize(t * (h / fp8_block));
  std::vector<float> row(h);
  for (std::size_t i = 0; i < t; ++i) {
    for (auto& v : row) v = static_cast<float>(2.0 * values.uniform() - 1.0);
    if constexpr (token_traits<Token>::has_scales) {
      quantize_fp8_row(row.data(), w.hidden, in.x.data() + i * h,
                       in.scales.data() + i * (h / fp8_block), false);
    } else {
      for (std::size_t c = 0; c < h; ++c) in.x[i * h + c] = from_float<Token>(row[c]);
    }
  }
  in.topk_idx = make_routing(w, rank);
  in.topk_weights.resize(in.topk_idx.size());
  for (auto& wt : in.topk_weights) wt = static_cast<float>(0.05 + 0.95 * values.uniform());
  return in;
}

}  // namespace epcomm::bench
