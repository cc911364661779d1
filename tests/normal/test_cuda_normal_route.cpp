// The normal-mode kernels' pushes over an RMA transport
// (normal/route.hpp), replayed on the host against a channel that
// applies each descriptor at once to simulated rank buffers. Where the rows,
// notify slots, combine statuses and returned rows land is compared with
// buffers built from the host engine's own layout arithmetic (the count
// matrix offsets, normal/count_matrix.hpp, and wire::region_plan): the same rows at
// the same final rows as the peer-mapped stores, nothing else changed, every
// round's signal counted once per peer, and each signal added only after
// the bytes it announces.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "epcomm/normal/count_matrix.hpp"
#include "epcomm/normal/route.hpp"
#include "epcomm/normal/wire.hpp"
#include "support/simulated_rma.hpp"

using namespace epcomm;
using normal_push::row_shape;

namespace {

using bytes = std::vector<std::byte>;

// Rank buffers and counters, and the channel of rank `self`
// (support/simulated_rma.hpp), checking at the data and combine signals that
// the rows they announce are in place. A failed push reports proxy_failed.
struct world_model : test::simulated_rma {
  int world;
  wire::region_plan pl;
  // What must already be in place at `peer` when `slot` is signalled there.
  std::vector<std::vector<std::pair<std::size_t, bytes>>> expected_at_signal;

  world_model(const wire::capacity& c, int rank)
      : simulated_rma(c.world_size, rank, wire::plan_regions(c, true).total,
                      wire::signal_slots(c.world_size)),
        world(c.world_size),
        pl(wire::plan_regions(c, true)),
        expected_at_signal(c.world_size) {
    fail_with = proxy::channel_status::proxy_failed;
    on_signal = [this](int peer, std::size_t slot, std::uint64_t add) -> std::string {
      CHECK(add == 1);
      if (slot != wire::signal_slot(wire::signal_kind::data, self, world) &&
          slot != wire::signal_slot(wire::signal_kind::combine_data, self, world))
        return {};
      for (const auto& [at, want] : expected_at_signal[peer])
        if (std::memcmp(buf[peer].data() + at, want.data(), want.size()) != 0)
          return "rank " + std::to_string(peer) + " signalled before its rows landed";
      return {};
    };
  }

  // Records that `n` bytes at `from` in this rank's buffer must reach `at`
  // in `peer`'s, before the round's signal, and applies that to `expect`.
  void expect(std::vector<bytes>& want, int peer, std::size_t at, std::size_t from, std::size_t n) {
    std::memcpy(want[peer].data() + at, buf[self].data() + from, n);
    expected_at_signal[peer].push_back(
        {at, bytes(buf[self].begin() + static_cast<long>(from),
                   buf[self].begin() + static_cast<long>(from + n))});
  }
};

void fill(std::byte* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>((seed * 97u + i * 13u) & 0xffu);
}

wire::capacity make_capacity(int world, bool fp8) {
  wire::capacity c{};
  c.world_size = world;
  c.num_experts = 2 * world;
  c.max_hidden = 256;
  c.max_topk = 4;
  c.max_tokens_per_rank = 8;
  c.max_recv_tokens = world * 8;
  c.max_combine_rows = world * 8;
  c.token_bytes = fp8 ? 1 : 2;
  c.combine_bytes = 2;
  c.has_scales = fp8;
  return c;
}

// counts[s][r]: tokens s sends r; rank 2 sends rank 0 nothing.
std::vector<int> count_matrix(int world) {
  std::vector<int> m(static_cast<std::size_t>(world) * world);
  for (int s = 0; s < world; ++s)
    for (int r = 0; r < world; ++r) m[s * world + r] = (s * 3 + r * 5) % 7;
  m[2 * world + 0] = 0;
  return m;
}

}  // namespace

TEST_CASE("normal route: dispatch rows land at their final rows, then the data signal") {
  for (const bool fp8 : {false, true}) {
    CAPTURE(fp8);
    const int world = 4, self = 2, hidden = 256, k = 3;
    const wire::capacity c = make_capacity(world, fp8);
    world_model m(c, self);
    const std::vector<int> counts = count_matrix(world);
    const row_shape rs{static_cast<std::size_t>(hidden) * c.token_bytes,
                       fp8 ? (hidden / 128) * sizeof(float) : 0, k, 0};
    // Staged rows: this rank's rows by destination, in rank order.
    fill(m.buf[self].data() + m.pl.send_x, m.pl.send_tokens - m.pl.send_x, 5);
    std::vector<bytes> want = m.buf;
    for (int r = 0, first = 0; r < world; first += counts[self * world + r], ++r) {
      CHECK(return_offset(counts.data(), world, self, r) == first);
      const std::size_t n = counts[self * world + r];
      if (r == self || n == 0) continue;  // the kernel stores its own rows in place
      const std::size_t to = recv_offset(counts.data(), world, self, r);
      const std::size_t idx = k * sizeof(std::int64_t), w = k * sizeof(float);
      m.expect(want, r, m.pl.recv_x + to * rs.x, m.pl.send_x + first * rs.x, n * rs.x);
      if (fp8)
        m.expect(want, r, m.pl.recv_scales + to * rs.scales, m.pl.send_scales + first * rs.scales,
                 n * rs.scales);
      m.expect(want, r, m.pl.recv_topk_idx + to * idx, m.pl.send_topk_idx + first * idx, n * idx);
      m.expect(want, r, m.pl.recv_weights + to * w, m.pl.send_weights + first * w, n * w);
      m.expect(want, r, m.pl.recv_src_idx + to * 4, m.pl.send_src_idx + first * 4, n * 4);
    }
    CHECK(normal_push::rows(m.ch(), m.pl, world, self, counts.data(), rs, true) ==
          proxy::channel_status::ok);
    CHECK(m.errors.empty());
    for (int r = 0; r < world; ++r) {
      CHECK_MESSAGE(m.buf[r] == want[r], "rank ", r);
      CHECK(m.counters[r][wire::signal_slot(wire::signal_kind::data, self, world)] == 1);
      CHECK(std::accumulate(m.counters[r].begin(), m.counters[r].end(), std::uint64_t{0}) == 1);
    }
  }
}

TEST_CASE("normal route: unstaged x leaves send_tokens in runs, one put per run") {
  const int world = 3, self = 1, hidden = 128, k = 2, tokens = 8;
  const wire::capacity c = make_capacity(world, false);
  world_model m(c, self);
  // send_pos[t][r]: rank 0 gets tokens 0-2 and 5, rank 2 tokens 2-7, this
  // rank tokens 1 and 6: runs {0-2, 5}, {2-7} and, stored in place, {1, 6}.
  std::vector<int> pos(static_cast<std::size_t>(tokens) * world, -1);
  const std::vector<std::vector<int>> to_rank = {{0, 1, 2, 5}, {1, 6}, {2, 3, 4, 5, 6, 7}};
  std::vector<int> counts = count_matrix(world);
  for (int r = 0; r < world; ++r) {
    int n = 0;
    for (int t : to_rank[r]) pos[static_cast<std::size_t>(t) * world + r] = n++;
    counts[self * world + r] = n;
  }
  const row_shape rs{hidden * 2u, 0, k, 0};
  fill(m.buf[self].data() + m.pl.send_tokens, tokens * rs.x, 9);
  fill(m.buf[self].data() + m.pl.send_topk_idx, m.pl.send_src_idx - m.pl.send_topk_idx, 3);
  std::vector<bytes> want = m.buf;
  for (int r = 0; r < world; ++r) {
    if (r == self) continue;
    const std::size_t to = recv_offset(counts.data(), world, self, r);
    for (int t : to_rank[r])
      m.expect(want, r, m.pl.recv_x + (to + pos[static_cast<std::size_t>(t) * world + r]) * rs.x,
               m.pl.send_tokens + static_cast<std::size_t>(t) * rs.x, rs.x);
    const std::size_t first = return_offset(counts.data(), world, self, r);
    const std::size_t n = counts[self * world + r];
    const std::size_t idx = k * sizeof(std::int64_t), w = k * sizeof(float);
    m.expect(want, r, m.pl.recv_topk_idx + to * idx, m.pl.send_topk_idx + first * idx, n * idx);
    m.expect(want, r, m.pl.recv_weights + to * w, m.pl.send_weights + first * w, n * w);
    m.expect(want, r, m.pl.recv_src_idx + to * 4, m.pl.send_src_idx + first * 4, n * 4);
  }
  const normal_push::x_source xs{pos.data(), tokens};
  CHECK(normal_push::rows(m.ch(), m.pl, world, self, counts.data(), rs, true, xs) ==
        proxy::channel_status::ok);
  CHECK(m.errors.empty());
  for (int r = 0; r < world; ++r) CHECK_MESSAGE(m.buf[r] == want[r], "rank ", r);
  // Rank 0: two runs, then idx, weights, src; a bare signal to this rank;
  // rank 2: one run, then the same three.
  CHECK(m.pushes == (2 + 3) + 1 + (1 + 3));
}
TEST_CASE("normal route: a rejected dispatch or combine only signals (the agreement to reject)") {
  const int world = 3, self = 1;
  const wire::capacity c = make_capacity(world, false);
  const std::vector<int> counts = count_matrix(world);
  for (const bool combine : {false, true}) {
    world_model m(c, self);
    fill(m.buf[self].data() + m.pl.send_notify, m.pl.total - m.pl.send_notify, 9);
    const std::vector<bytes> before = m.buf;
    const row_shape rs{512, 0, 2, 512};
    const auto status =
        combine
            ? normal_push::combine_rows(m.ch(), m.pl, world, self, counts.data(), rs, true, false)
            : normal_push::rows(m.ch(), m.pl, world, self, counts.data(), rs, false);
    CHECK(status == proxy::channel_status::ok);
    const auto kind = combine ? wire::signal_kind::combine_data : wire::signal_kind::data;
    for (int r = 0; r < world; ++r) {
      CHECK(m.buf[r] == before[r]);
      CHECK(m.counters[r][wire::signal_slot(kind, self, world)] == 1);
    }
    CHECK(m.pushes == world);
  }
}

TEST_CASE("normal route: notify slots and combine statuses reach their slot at every peer") {
  const int world = 3, self = 0;
  const wire::capacity c = make_capacity(world, false);
  world_model m(c, self);
  const std::size_t notify_bytes = sizeof(wire::notify_header) + 4 * (world + 2);
  for (int p = 0; p < world; ++p)
    fill(m.buf[self].data() + m.pl.send_notify + p * m.pl.notify_slot_bytes, notify_bytes, 20 + p);
  fill(m.buf[self].data() + m.pl.send_combine_status, sizeof(wire::combine_header), 40);
  std::vector<bytes> want = m.buf;
  for (int p = 0; p < world; ++p) {
    std::memcpy(want[p].data() + m.pl.notify + self * m.pl.notify_slot_bytes,
                m.buf[self].data() + m.pl.send_notify + p * m.pl.notify_slot_bytes, notify_bytes);
    std::memcpy(want[p].data() + m.pl.combine_status + self * m.pl.combine_status_slot_bytes,
                m.buf[self].data() + m.pl.send_combine_status, sizeof(wire::combine_header));
  }
  CHECK(normal_push::notify(m.ch(), m.pl, world, self, notify_bytes) == proxy::channel_status::ok);
  CHECK(normal_push::combine_status(m.ch(), m.pl, world, self, sizeof(wire::combine_header)) ==
        proxy::channel_status::ok);
  for (int p = 0; p < world; ++p) {
    CHECK(m.buf[p] == want[p]);
    CHECK(m.counters[p][wire::signal_slot(wire::signal_kind::notify, self, world)] == 1);
    CHECK(m.counters[p][wire::signal_slot(wire::signal_kind::combine_ready, self, world)] == 1);
  }
}

TEST_CASE("normal route: combine rows go back to where their sources reduce them") {
  for (const bool weights : {false, true}) {
    CAPTURE(weights);
    const int world = 4, self = 3, hidden = 256, k = 4;
    const wire::capacity c = make_capacity(world, false);
    world_model m(c, self);
    const std::vector<int> counts = count_matrix(world);
    const row_shape rs{0, 0, k, static_cast<std::size_t>(hidden) * 2};
    fill(m.buf[self].data() + m.pl.send_combine_x, m.pl.send_tokens - m.pl.send_combine_x, 77);
    std::vector<bytes> want = m.buf;
    for (int s = 0; s < world; ++s) {
      const std::size_t n = counts[s * world + self];
      if (s == self || n == 0) continue;
      const std::size_t from = recv_offset(counts.data(), world, s, self);
      const std::size_t to = return_offset(counts.data(), world, s, self);
      m.expect(want, s, m.pl.combine_x + to * rs.out, m.pl.send_combine_x + from * rs.out,
               n * rs.out);
      if (weights)
        m.expect(want, s, m.pl.combine_weights + to * k * 4,
                 m.pl.send_combine_weights + from * k * 4, n * k * 4);
    }
    CHECK(normal_push::combine_rows(m.ch(), m.pl, world, self, counts.data(), rs, weights, true) ==
          proxy::channel_status::ok);
    CHECK(m.errors.empty());
    for (int s = 0; s < world; ++s) {
      CHECK(m.buf[s] == want[s]);
      CHECK(m.counters[s][wire::signal_slot(wire::signal_kind::combine_data, self, world)] == 1);
    }
  }
}

TEST_CASE("normal route: a failed push stops the round") {
  const int world = 3;
  world_model m(make_capacity(world, false), 0);
  m.fail_at = 2;
  CHECK(normal_push::notify(m.ch(), m.pl, world, 0, 64) == proxy::channel_status::proxy_failed);
  CHECK(m.pushes == 2);
  CHECK(m.counters[2][wire::signal_slot(wire::signal_kind::notify, 0, world)] == 0);
}
