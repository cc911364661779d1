// Deterministic inputs for multi-rank tests: any rank can regenerate any
// other rank's tokens and routing from (seed, rank), which is what lets each
// rank check its results against an independent reference without talking.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "epcomm/core/enum_names.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/core/token_types.hpp"

namespace epcomm::test {

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0,
                          std::uint64_t d = 0) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

// A value in [-1, 1), never exactly zero-heavy: checks must see real data.
inline float uniform(std::uint64_t h) { return static_cast<float>(h >> 40) / (1 << 23) - 1.0f; }

enum class routing {
  random,         // k distinct experts per token, uniformly
  uneven,         // 0..k valid experts per token, the rest -1
  one_expert,     // every token picks expert 0 only
  none,           // every id is -1
  starve_last,    // no token picks an expert of the last rank
  duplicate_rank  // all k experts of a token on one rank (it still goes there once)
};

inline const char* name(routing r) {
  static constexpr auto names = names_for<routing, routing::duplicate_rank>(
      "random", "uneven", "one_expert", "none", "starve_last", "duplicate_rank");
  return names(r);
}

struct shape {
  int world = 1;
  int tokens = 0;
  int hidden = 128;
  int topk = 1;
  int experts = 1;
  routing route = routing::random;
  std::uint64_t seed = 1;
};

template <token_type Token>
struct rank_input {
  std::vector<Token> x;       // [T][H]
  std::vector<float> scales;  // [T][H/128] for fp8
  std::vector<std::int64_t> topk_idx;
  std::vector<float> topk_weights;
};

inline std::vector<std::int64_t> make_routing(const shape& s, int rank) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(s.tokens) * s.topk, -1);
  const int per_rank = s.experts / s.world;
  for (int t = 0; t < s.tokens; ++t) {
    std::int64_t* row = idx.data() + static_cast<std::size_t>(t) * s.topk;
    const std::uint64_t h = hash(s.seed, rank, t, 0xabc);
    switch (s.route) {
      case routing::none:
        break;
      case routing::one_expert:
        row[0] = 0;
        break;
      case routing::random:
      case routing::uneven:
      case routing::starve_last:
      case routing::duplicate_rank: {
        int pool = s.experts;
        if (s.route == routing::starve_last) pool = s.experts - per_rank;
        std::vector<std::int64_t> cand(pool);
        std::iota(cand.begin(), cand.end(), 0);
        if (s.route == routing::duplicate_rank) {
          const int r = static_cast<int>(h % s.world);
          cand.resize(per_rank);
          std::iota(cand.begin(), cand.end(), static_cast<std::int64_t>(r) * per_rank);
        }
        const int valid = s.route == routing::uneven ? static_cast<int>(h % (s.topk + 1)) : s.topk;
        const int take = std::min<int>(valid, static_cast<int>(cand.size()));
        for (int k = 0; k < take; ++k) {  // partial Fisher-Yates: distinct experts
          const auto j = k + hash(s.seed, rank, t, k + 1) % (cand.size() - k);
          std::swap(cand[k], cand[j]);
          row[k] = cand[k];
        }
        if (s.route == routing::uneven)  // scatter the -1 slots, not only at the tail
          std::rotate(row, row + static_cast<int>(h % s.topk), row + s.topk);
        break;
      }
    }
  }
  return idx;
}

template <token_type Token>
rank_input<Token> make_input(const shape& s, int rank) {
  rank_input<Token> in;
  const std::size_t t = s.tokens;
  const std::size_t h = s.hidden;
  std::vector<float> row(h);
  in.x.resize(t * h);
  if constexpr (token_traits<Token>::has_scales) in.scales.resize(t * (h / fp8_block));
  for (std::size_t i = 0; i < t; ++i) {
    // Rows differ in magnitude so fp8 scales differ between blocks and tokens.
    const float mag =
        0.5f + 4.0f * uniform(hash(s.seed, rank, i, 7)) * uniform(hash(s.seed, rank, i, 8));
    for (std::size_t c = 0; c < h; ++c) row[c] = mag * uniform(hash(s.seed ^ 0x55, rank, i, c));
    if constexpr (token_traits<Token>::has_scales)
      quantize_fp8_row(row.data(), static_cast<int>(h), in.x.data() + i * h,
                       in.scales.data() + i * (h / fp8_block), false);
    else
      for (std::size_t c = 0; c < h; ++c) in.x[i * h + c] = from_float<Token>(row[c]);
  }
  in.topk_idx = make_routing(s, rank);
  in.topk_weights.resize(in.topk_idx.size());
  for (std::size_t i = 0; i < in.topk_weights.size(); ++i)
    in.topk_weights[i] = 0.05f + 0.95f * (uniform(hash(s.seed, rank, i, 9)) + 1.0f) / 2.0f;
  return in;
}

inline std::string describe(const shape& s, const char* dtype) {
  return std::string(dtype) + " world=" + std::to_string(s.world) +
         " T=" + std::to_string(s.tokens) + " H=" + std::to_string(s.hidden) +
         " K=" + std::to_string(s.topk) + " E=" + std::to_string(s.experts) +
         " route=" + name(s.route) + " seed=" + std::to_string(s.seed);
}

}  // namespace epcomm::test
