#include "inputs.hpp"

#include <cmath>

namespace epcomm::bench {

std::vector<std::int64_t> make_routing(const workload& w, int rank) {
  std::vector<double> weight(static_cast<std::size_t>(w.experts));
  for (int e = 0; e < w.experts; ++e) weight[e] = std::pow(e + 1.0, -w.skew);
  random_stream pick(w.seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(rank) * 2);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(w.tokens) * w.topk);
  std::vector<double> left(weight.size());
  for (int t = 0; t < w.tokens; ++t) {
    // Draw without replacement: a chosen expert's weight drops to zero for this token.
    left = weight;
    double total = 0;
    for (double v : left) total += v;
    for (int k = 0; k < w.topk; ++k) {
      double u = pick.uniform() * total;
      int e = 0;
      while (e + 1 < w.experts && (left[e] == 0.0 || u >= left[e])) {
        u -= left[e];
        ++e;
      }
      // Rounding can walk past the last expert still available; take the last one left.
      while (left[e] == 0.0) --e;
      idx[static_cast<std::size_t>(t) * w.topk + k] = e;
      total -= left[e];
      left[e] = 0.0;
    }
  }
  return idx;
}

}  // namespace epcomm::bench
