// Consumer smoke test: compiled against epcomm as a downstream project would
// (add_subdirectory, FetchContent or find_package). Exit status 0 = pass.
#include <epcomm/deadline.hpp>
#include <epcomm/error.hpp>

#include <cstdio>
#include <string_view>

int main() {
  const epcomm::error e(3, "dispatch", 1, "consumer smoke test");
  const std::string_view what = e.what();
  if (what.find("rank 3") == std::string_view::npos || e.rank() != 3 || e.peer() != 1) {
    std::fprintf(stderr, "epcomm consumer: unexpected error text: %s\n", e.what());
    return 1;
  }
  const auto d = epcomm::deadline::after(epcomm::effective_timeout(epcomm::default_timeout));
  if (d.expired()) {
    std::fprintf(stderr, "epcomm consumer: a fresh deadline has already expired\n");
    return 1;
  }
  std::printf("epcomm consumer: ok (%s)\n", e.what());
  return 0;
}
