// Consumer smoke test: compiled against epcomm as a downstream project would
// (add_subdirectory, FetchContent or find_package), it runs one dispatch and
// combine on 2 local ranks. Exit status 0 = pass.
#include <epcomm/epcomm.hpp>
#include <epcomm/shm/transport.hpp>

#include <cstdio>
#include <vector>

int main() {
  constexpr int tokens = 8, hidden = 128, topk = 2, experts = 4;
  const auto codes = epcomm::launch_local(2, [](epcomm::local_bootstrap& boot) {
    epcomm::buffer<epcomm::shm::transport, epcomm::bf16> buf(boot, {experts, hidden, topk, tokens});
    std::vector<epcomm::bf16> x(tokens * hidden);
    std::vector<std::int64_t> idx(tokens * topk);
    std::vector<float> w(tokens * topk, 0.5f);
    for (int t = 0; t < tokens; ++t) {
      for (int c = 0; c < hidden; ++c)
        x[t * hidden + c] = epcomm::to_bf16(static_cast<float>(t + 1));
      idx[t * topk] = t % experts;            // one expert on either rank,
      idx[t * topk + 1] = (t + 1) % experts;  // so some tokens go to both
    }
    const auto got = buf.dispatch({tokens, hidden, topk, x, {}, idx, w});
    // Each destination returns its rows unchanged: combine sums one copy per
    // destination rank, so token t comes back as (t + 1) * destinations.
    std::vector<epcomm::bf16> y(got.recv_x.begin(), got.recv_x.end());
    const auto out = buf.combine({y, std::nullopt, {}, {}}, got.handle);
    for (int t = 0; t < tokens; ++t) {
      const int dests = (t % experts) / 2 == ((t + 1) % experts) / 2 ? 1 : 2;
      if (epcomm::to_float(out.x[t * hidden]) != static_cast<float>((t + 1) * dests)) {
        std::fprintf(stderr, "rank %d token %d: got %g\n", boot.rank(), t,
                     epcomm::to_float(out.x[t * hidden]));
        return 1;
      }
    }
    return 0;
  });
  for (int c : codes)
    if (c != 0) return 1;
  std::printf("epcomm consumer: 2-rank dispatch/combine ok\n");
  return 0;
}
