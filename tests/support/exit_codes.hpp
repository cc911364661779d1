// The verdict on a multi-process case from its ranks' exit codes, shared by
// every suite that launches ranks (launch_local returns one code per rank).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace epcomm::test {

// True when every rank exited 0; prints the exit codes otherwise.
inline bool all_ok(const std::vector<int>& codes, const std::string& what) {
  bool ok = true;
  for (int c : codes) ok = ok && c == 0;
  if (!ok) {
    std::fprintf(stderr, "case failed: %s; exit codes:", what.c_str());
    for (int c : codes) std::fprintf(stderr, " %d", c);
    std::fprintf(stderr, "\n");
  }
  return ok;
}

// Reports a rank's failure on stderr and turns it into an exit code.
inline int fail_rank(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

}  // namespace epcomm::test
