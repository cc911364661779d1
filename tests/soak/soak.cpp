// Soak: many dispatch/combine rounds on one buffer, every result checked
// against the reference, and resident memory sampled so that growth shows.
//
//   epcomm_soak --iterations 100000 [--ranks 2] [--tokens 64] [--hidden 256]
//
// Exits non-zero on the first wrong result, or when resident memory after the
// warm-up grows by more than --max-rss-growth-kib (default 1024).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "support/run_case.hpp"

namespace {

long resident_kib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

struct options {
  long iterations = 100'000;
  int ranks = 2;
  int tokens = 64;
  int hidden = 256;
  long max_rss_growth_kib = 1024;
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (flag == "--iterations")
      o.iterations = v;
    else if (flag == "--ranks")
      o.ranks = static_cast<int>(v);
    else if (flag == "--tokens")
      o.tokens = static_cast<int>(v);
    else if (flag == "--hidden")
      o.hidden = static_cast<int>(v);
    else if (flag == "--max-rss-growth-kib")
      o.max_rss_growth_kib = v;
    else {
      std::fprintf(stderr, "epcomm_soak: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  using namespace epcomm;
  const auto codes = launch_local(
      o.ranks,
      [&](local_bootstrap& boot) {
        const int rank = boot.rank();
        test::shape s{o.ranks, o.tokens, o.hidden, 4, 4 * o.ranks, test::routing::uneven, 1};
        buffer<shm::transport, bf16> buf(boot, {s.experts, s.hidden, s.topk, s.tokens});
        const long warmup = std::min<long>(1000, o.iterations / 10);
        long rss_after_warmup = 0;
        const auto start = std::chrono::steady_clock::now();
        for (long it = 0; it < o.iterations; ++it) {
          s.seed = 1 + it % 97;  // a few distinct routings, revisited
          std::vector<test::rank_input<bf16>> all;
          for (int r = 0; r < s.world; ++r) all.push_back(test::make_input<bf16>(s, r));
          const auto& mine = all[rank];
          const auto res = buf.dispatch(
              {s.tokens, s.hidden, s.topk, mine.x, {}, mine.topk_idx, mine.topk_weights});
          if (auto e = test::check_dispatch(s, rank, all, res); !e.empty()) {
            std::fprintf(stderr, "rank %d iteration %ld dispatch: %s\n", rank, it, e.c_str());
            return 1;
          }
          const auto y = test::expert_rows(res, s.hidden, rank);
          const auto out = buf.combine({y, res.recv_topk_weights, {}, {}}, res.handle);
          if (auto e = test::check_combine(s, mine, out); !e.empty()) {
            std::fprintf(stderr, "rank %d iteration %ld: %s\n", rank, it, e.c_str());
            return 1;
          }
          if (it + 1 == warmup) rss_after_warmup = resident_kib();
        }
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const long growth = resident_kib() - rss_after_warmup;
        std::printf(
            "rank %d: %ld iterations in %.1f s (%.1f us each), resident memory %+ld KiB since "
            "warm-up\n",
            rank, o.iterations, secs, 1e6 * secs / static_cast<double>(o.iterations), growth);
        return growth <= o.max_rss_growth_kib ? 0 : 3;
      },
      {std::chrono::hours(2)});
  for (int c : codes)
    if (c != 0) return 1;
  return 0;
}
