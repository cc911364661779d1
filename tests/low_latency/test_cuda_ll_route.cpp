// The low-latency kernels' pushes over an RMA transport
// (low_latency/route.hpp), replayed on the host against a channel that
// applies each descriptor to simulated rank buffers at once. What every peer
// ends up with is compared with buffers built independently from the wire
// layout (low_latency/wire.hpp): the records, count words, reject records
// and combine rows land where the peer-mapped path would have stored them,
// nothing else changes, every signal counts once, and a region's bytes are
// in place when its signal is added (the transport delivers put_signal only
// after every earlier write to that peer). The offsets themselves are the
// host engine's (low_latency/rma.hpp), exercised over libfabric and UCX by
// test_low_latency_{libfabric,ucx}.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "epcomm/low_latency/route.hpp"
#include "epcomm/low_latency/wire.hpp"
#include "support/simulated_rma.hpp"

using namespace epcomm;
namespace ll = epcomm::wire::ll;

namespace {

using bytes = std::vector<std::byte>;

// Every rank's buffer and counters, and the channel of rank `self`
// (support/simulated_rma.hpp). A failed push reports ring_full.
struct world_model : test::simulated_rma {
  ll::shape s;
  ll::plan pl;

  world_model(const ll::shape& shape, int rank)
      : simulated_rma(shape.world_size, rank, ll::plan_buffer(shape, true).total,
                      ll::signal_slots(shape)),
        s(shape),
        pl(ll::plan_buffer(shape, true)) {}

  std::byte* at(int r, int parity, std::size_t offset) {
    return buf[r].data() + ll::parity_base(pl, parity) + offset;
  }
};

void fill(std::byte* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>((seed * 131u + i * 7u) & 0xffu);
}

ll::shape make_shape(int wire_bytes) { return {3, 6, 256, 4, 8, wire_bytes, wire_bytes == 1}; }

// The records announced by count word e of `m.self`: at signal time, the
// peer's region (e's local index, self) must hold them.
std::string records_in_place(const world_model& m, int peer, std::size_t slot) {
  const int el = m.s.local_experts();
  for (int le = 0; le < el; ++le)
    for (int parity = 0; parity < ll::parities; ++parity) {
      if (slot != ll::dispatch_signal(m.s, parity, le, m.self)) continue;
      const std::size_t base = ll::parity_base(m.pl, parity);
      ll::count_word w;
      std::memcpy(&w,
                  m.buf[peer].data() + base + m.pl.dispatch_counts +
                      (static_cast<std::size_t>(le) * m.s.world_size + m.self) * sizeof w,
                  sizeof w);
      if (w.status != ll::state::ok || peer == m.self) return {};
      const int e = peer * el + le;
      const std::size_t rb = ll::record_bytes(m.s);
      const std::byte* staged = m.buf[m.self].data() + base + m.pl.send_records +
                                static_cast<std::size_t>(e) * m.s.max_tokens_per_rank * rb;
      const std::byte* landed = m.buf[peer].data() + base + m.pl.dispatch_recv +
                                ll::record_offset(m.s, m.pl, le, m.self, 0);
      if (std::memcmp(staged, landed, static_cast<std::size_t>(w.count) * rb) != 0)
        return "signal of expert " + std::to_string(e) + " before its records landed";
    }
  return {};
}

}  // namespace

TEST_CASE("low-latency route: a dispatch's puts land as the peer-mapped stores would") {
  for (const int wire_bytes : {2, 1})
    for (const int parity : {0, 1}) {
      CAPTURE(wire_bytes);
      CAPTURE(parity);
      const int self = 1;
      world_model m(make_shape(wire_bytes), self);
      const ll::shape& s = m.s;
      const std::size_t rb = ll::record_bytes(s);
      const int el = s.local_experts();
      const std::uint64_t epoch = 5;
      const std::uint8_t wire_id =
          wire_bytes == 1 ? token_traits<fp8_e4m3>::id : token_traits<bf16>::id;
      // Expert e gets (e * 3) % 9 records (at most max_tokens_per_rank = 8).
      std::vector<int> counts(s.num_experts);
      for (int e = 0; e < s.num_experts; ++e) counts[e] = (e * 3) % 9;
      for (int e = 0; e < s.num_experts; ++e) {
        fill(m.at(self, parity, m.pl.send_records) +
                 static_cast<std::size_t>(e) * s.max_tokens_per_rank * rb,
             s.max_tokens_per_rank * rb, 10 + e);
        const ll::count_word w{epoch, counts[e], ll::state::ok, wire_id};
        std::memcpy(m.at(self, parity, m.pl.send_dispatch_counts) + e * sizeof w, &w, sizeof w);
      }
      std::vector<bytes> expected = m.buf;
      for (int e = 0; e < s.num_experts; ++e) {
        const int dst = e / el, le = e % el;
        const std::size_t base = ll::parity_base(m.pl, parity);
        const ll::count_word w{epoch, counts[e], ll::state::ok, wire_id};
        std::memcpy(expected[dst].data() + base + m.pl.dispatch_counts +
                        (static_cast<std::size_t>(le) * s.world_size + self) * sizeof w,
                    &w, sizeof w);
        if (dst == self) continue;  // the kernel stores records for itself directly
        std::memcpy(expected[dst].data() + base + m.pl.dispatch_recv +
                        ll::record_offset(s, m.pl, le, self, 0),
                    m.at(self, parity, m.pl.send_records) +
                        static_cast<std::size_t>(e) * s.max_tokens_per_rank * rb,
                    static_cast<std::size_t>(counts[e]) * rb);
      }
      m.on_signal = [&m](int peer, std::size_t slot, std::uint64_t) {
        return records_in_place(m, peer, slot);
      };
      const auto status =
          cuda::ll_push::dispatch(m.ch(), s, m.pl, parity, self, counts.data(), false);
      CHECK(status == proxy::channel_status::ok);
      CHECK(m.errors.empty());
      for (int r = 0; r < s.world_size; ++r) {
        CHECK_MESSAGE(m.buf[r] == expected[r], "rank ", r, "'s buffer");
        for (std::size_t slot = 0; slot < m.counters[r].size(); ++slot) {
          bool announced = false;
          for (int le = 0; le < el; ++le)
            announced = announced || slot == ll::dispatch_signal(s, parity, le, self);
          CHECK(m.counters[r][slot] == (announced ? 1u : 0u));
        }
      }
      // Empty regions move no records: one put_signal per expert, one put
      // per non-empty region of another rank.
      int puts = 0;
      for (int e = 0; e < s.num_experts; ++e) puts += e / el != self && counts[e] > 0;
      CHECK(m.pushes == s.num_experts + puts);
    }
}

TEST_CASE("low-latency route: a rejected dispatch sends its reject record, then the words") {
  const int self = 2;
  world_model m(make_shape(2), self);
  const ll::shape& s = m.s;
  const int parity = 1;
  ll::reject_record rec{};
  rec.epoch = 3;
  std::strcpy(rec.cause, "expert 99 is out of range");
  std::memcpy(m.at(self, parity, m.pl.send_rejects), &rec, sizeof rec);
  const ll::count_word w{3, 0, ll::state::rejected, token_traits<bf16>::id};
  for (int e = 0; e < s.num_experts; ++e)
    std::memcpy(m.at(self, parity, m.pl.send_dispatch_counts) + e * sizeof w, &w, sizeof w);
  // Stale bytes in the staged records must not move.
  fill(m.at(self, parity, m.pl.send_records), 4 * ll::record_bytes(s), 7);
  std::vector<bytes> expected = m.buf;
  for (int r = 0; r < s.world_size; ++r) {
    for (int le = 0; le < s.local_experts(); ++le)
      std::memcpy(expected[r].data() + ll::parity_base(m.pl, parity) + m.pl.dispatch_counts +
                      (static_cast<std::size_t>(le) * s.world_size + self) * sizeof w,
                  &w, sizeof w);
    if (r != self)  // the kernel stores its own reject record directly
      std::memcpy(expected[r].data() + ll::parity_base(m.pl, parity) + m.pl.rejects +
                      (0 * s.world_size + self) * sizeof rec,
                  &rec, sizeof rec);
  }
  // A peer reads the reject record once a "rejected" word's signal came.
  m.on_signal = [&m](int peer, std::size_t, std::uint64_t) -> std::string {
    if (peer == m.self) return {};
    ll::reject_record got;
    std::memcpy(&got,
                m.buf[peer].data() + ll::parity_base(m.pl, 1) + m.pl.rejects + m.self * sizeof got,
                sizeof got);
    return got.epoch == 3 ? "" : "a rejected word signalled before the reject record";
  };
  const auto status = cuda::ll_push::dispatch(m.ch(), s, m.pl, parity, self, nullptr, true);
  CHECK(status == proxy::channel_status::ok);
  CHECK(m.errors.empty());
  for (int r = 0; r < s.world_size; ++r) CHECK(m.buf[r] == expected[r]);
}

TEST_CASE("low-latency route: combine rows and count words") {
  const int self = 0;
  world_model m(make_shape(2), self);
  const ll::shape& s = m.s;
  const int parity = 1;
  const std::size_t row_bytes = static_cast<std::size_t>(s.hidden) * 2;
  // Local expert 0 received 5 rows, local expert 1 received 3, from every
  // rank in turn, each naming a distinct (token, slot) of its source.
  const int received[2] = {5, 3};
  auto* recv_count = reinterpret_cast<std::int32_t*>(m.at(self, parity, m.pl.recv_count));
  auto* recv_src = reinterpret_cast<ll::source*>(m.at(self, parity, m.pl.recv_src));
  std::vector<int> rows_to(s.world_size, 0);
  int n = 0;
  for (int le = 0; le < 2; ++le) {
    recv_count[le] = received[le];
    for (int i = 0; i < received[le]; ++i, ++n) {
      const int src = n % s.world_size;
      recv_src[static_cast<std::size_t>(le) * s.rows_per_expert() + i] = {src, n / 2, n % 2 + 2};
      ++rows_to[src];
    }
  }
  fill(m.at(self, parity, m.pl.combine_send), m.pl.recv_x - m.pl.combine_send, 3);
  for (int r = 0; r < s.world_size; ++r) {
    const ll::count_word w{9, rows_to[r], ll::state::ok, token_traits<bf16>::id};
    std::memcpy(m.at(self, parity, m.pl.send_combine_counts) + r * sizeof w, &w, sizeof w);
  }
  std::vector<bytes> expected = m.buf;
  const std::size_t base = ll::parity_base(m.pl, parity);
  for (int le = 0; le < 2; ++le)
    for (int i = 0; i < received[le]; ++i) {
      const std::size_t row = static_cast<std::size_t>(le) * s.rows_per_expert() + i;
      const ll::source from = recv_src[row];
      if (from.rank == self) continue;  // stored directly by the kernel
      std::memcpy(
          expected[from.rank].data() + base + m.pl.combine_recv +
              (static_cast<std::size_t>(from.token) * s.max_topk + from.topk_slot) * row_bytes,
          m.at(self, parity, m.pl.combine_send) + row * row_bytes, row_bytes);
    }
  for (int r = 0; r < s.world_size; ++r) {
    const ll::count_word w{9, rows_to[r], ll::state::ok, token_traits<bf16>::id};
    std::memcpy(expected[r].data() + base + m.pl.combine_counts + self * sizeof w, &w, sizeof w);
  }
  auto ch = m.ch();
  CHECK(cuda::ll_push::combine_rows(ch, s, m.pl, parity, self, recv_count, recv_src) ==
        proxy::channel_status::ok);
  CHECK(cuda::ll_push::combine_counts(ch, s, m.pl, parity, self, false) ==
        proxy::channel_status::ok);
  CHECK(m.errors.empty());
  for (int r = 0; r < s.world_size; ++r) {
    CHECK(m.buf[r] == expected[r]);
    CHECK(m.counters[r][ll::combine_signal(s, parity, self)] == 1);
  }
  CHECK(m.pushes == (n - rows_to[self]) + s.world_size);
}

TEST_CASE("low-latency route: release signals every source once; a failed push stops the rest") {
  world_model m(make_shape(2), 1);
  CHECK(cuda::ll_push::release(m.ch(), m.s, 0, 1) == proxy::channel_status::ok);
  for (int r = 0; r < m.s.world_size; ++r)
    CHECK(m.counters[r][ll::released_signal(m.s, 0, 1)] == 1);

  world_model f(make_shape(2), 1);
  const std::vector<int> counts(f.s.num_experts, 2);
  f.fail_at = 3;
  CHECK(cuda::ll_push::dispatch(f.ch(), f.s, f.pl, 0, 1, counts.data(), false) ==
        proxy::channel_status::ring_full);
  CHECK(f.pushes == 3);
  f.fail_at = f.pushes + 1;
  CHECK(cuda::ll_push::release(f.ch(), f.s, 0, 1) == proxy::channel_status::ring_full);
  CHECK(f.pushes == 4);
}
