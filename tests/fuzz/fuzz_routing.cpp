// libFuzzer target over everything that turns untrusted routing input into
// offsets: topology validation, expert-id validation, layout, and the region
// plan. Any input must either be rejected with a message or yield a layout
// and plan whose invariants hold; a crash, a UB report or a trap is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "epcomm/core/layout.hpp"
#include "epcomm/core/topology.hpp"
#include "epcomm/normal/wire.hpp"

namespace {

struct reader {
  const std::uint8_t* p;
  std::size_t n;
  template <class T>
  T take() {
    T v{};
    const std::size_t k = n < sizeof(T) ? n : sizeof(T);
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
};

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void check_plan(const epcomm::wire::capacity& c) {
  const auto p = epcomm::wire::plan_regions(c);
  // Regions are aligned, in order, and each fits before the next begins.
  const std::size_t starts[] = {p.notify,          p.combine_status, p.recv_x,       p.recv_scales,
                                p.recv_topk_idx,   p.recv_weights,   p.recv_src_idx, p.combine_x,
                                p.combine_weights, p.total};
  for (std::size_t i = 0; i + 1 < std::size(starts); ++i) {
    require(starts[i] % epcomm::wire::alignment == 0);
    require(starts[i] <= starts[i + 1]);
  }
  const std::size_t n = c.window_rows > 0
                            ? static_cast<std::size_t>(c.world_size) * c.window_rows
                            : static_cast<std::size_t>(c.max_recv_tokens);
  require(p.recv_x + n * c.max_hidden * c.token_bytes <= p.recv_scales);
  require(p.recv_src_idx + n * sizeof(std::int32_t) <= p.combine_x);
  require(p.notify_slot_bytes >= sizeof(epcomm::wire::notify_header));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  reader in{data, size};
  epcomm::topology topo;
  topo.world_size = in.take<std::uint8_t>() % 9;
  topo.ranks_per_node = in.take<std::uint8_t>() % 9;
  topo.num_experts = in.take<std::uint16_t>() % 300;
  topo.hidden = 1 + in.take<std::uint16_t>() % 8192;
  topo.topk = in.take<std::uint8_t>() % 10;
  const int tokens = in.take<std::uint8_t>() % 64;
  try {
    topo.validate(0, "fuzz");
  } catch (const epcomm::error&) {
    return 0;
  }
  std::vector<std::int64_t> idx(static_cast<std::size_t>(tokens) * topo.topk);
  for (auto& e : idx) {
    // Mostly plausible ids, with the raw 64-bit value often enough to hit the
    // extremes (INT64_MIN, -2, E, ...).
    const auto raw = in.take<std::int64_t>();
    e = (raw & 1) ? raw : (raw >> 1) % (topo.num_experts + 2) - 1;
  }
  if (auto bad = epcomm::find_invalid_expert(idx, topo.topk, topo.num_experts)) {
    require(!bad->empty());
    return 0;
  }
  const auto lay = epcomm::make_layout(topo, idx, tokens);
  int sent = 0;
  for (int r = 0; r < topo.world_size; ++r) {
    int next = 0;
    for (int t = 0; t < tokens; ++t)
      if (lay.in_rank(t, r)) require(lay.position(t, r) == next++);
    require(next == lay.tokens_per_rank[r]);
    sent += next;
  }
  require(sent <= tokens * topo.world_size);
  const int entries = static_cast<int>(
      std::count_if(idx.begin(), idx.end(), [](std::int64_t e) { return e >= 0; }));
  require(std::accumulate(lay.tokens_per_expert.begin(), lay.tokens_per_expert.end(), 0) ==
          entries);

  epcomm::wire::capacity cap{topo.world_size,
                             topo.num_experts,
                             topo.hidden,
                             topo.topk,
                             tokens,
                             tokens * topo.world_size,
                             tokens * std::min(topo.topk, topo.world_size),
                             1 + (topo.hidden & 3),
                             2,
                             (topo.hidden % 128) == 0,
                             tokens % 4};  // 0: whole calls; else a window of rows per peer
  check_plan(cap);
  return 0;
}
