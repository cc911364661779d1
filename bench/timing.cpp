#include "timing.hpp"

#include <algorithm>
#include <cmath>

namespace epcomm::bench {
namespace {

// Linear interpolation between the closest ranks of a sorted sample.
double percentile(const std::vector<double>& sorted, double p) {
  const double at = p * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(at));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  return sorted[below] + (sorted[above] - sorted[below]) * (at - static_cast<double>(below));
}

}  // namespace

summary summarize(std::vector<double> us) {
  summary s;
  s.samples = static_cast<int>(us.size());
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.median_us = percentile(us, 0.5);
  s.p10_us = percentile(us, 0.1);
  s.p90_us = percentile(us, 0.9);
  s.min_us = us.front();
  return s;
}

}  // namespace epcomm::bench
