// The GPU-fed proxy's producer side, end to end over the real RMA transports:
// each rank's producer thread holds only what a kernel would hold (a
// proxy::channel: a ring in memory the rank owns and a pointer to the
// transport's signal counters) and moves data to every rank through the
// proxy engine; receivers learn of it by polling the counters, as a kernel
// does through their mapping. CTest runs it on loopback (libfabric
// tcp;ofi_rxm, UCX tcp).
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/proxy/engine.hpp"
#include "support/exit_codes.hpp"

#if defined(EPCOMM_TEST_LIBFABRIC)
#include "epcomm/libfabric/transport.hpp"
#endif
#if defined(EPCOMM_TEST_UCX)
#include "epcomm/ucx/transport.hpp"
#endif

using namespace epcomm;
using namespace std::chrono_literals;

namespace {

struct aligned_delete {
  void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{64}); }
};

std::byte pattern(int round, int src, int dst, std::size_t i) {
  return static_cast<std::byte>((round * 89 + src * 131 + dst * 31 + i * 7 + (i >> 9)) & 0xff);
}

// Buffer layout: world receive regions (slot s: from source s), then world
// send regions (slot p: bound for peer p), `region` bytes each. Signal slot s
// counts what source s sent. `batched`: each round's pushes go through one
// channel_writer, as a kernel's push loop does.
template <class Transport>
int exchange_through_channel(local_bootstrap& boot, std::uint64_t ring_capacity, bool batched) {
  const int rank = boot.rank(), world = boot.world_size();
  constexpr std::size_t region = 40'000 + 8;  // not a multiple of anything
  const deadline dl = deadline::after(60s);
  Transport t(boot, 2 * region * world, world, dl);
  const std::size_t ring_bytes = proxy::ring_bytes(ring_capacity);
  const std::unique_ptr<std::byte, aligned_delete> memory(
      static_cast<std::byte*>(::operator new (ring_bytes, std::align_val_t{64})));
  std::memset(memory.get(), 0, ring_bytes);
  const proxy::ring_view ring = proxy::ring_view::over(memory.get(), ring_capacity);
  proxy::engine<Transport> engine(t, std::span(&ring, 1));
  const proxy::channel ch{ring, t.signal_counters().data(),
                          static_cast<std::uint64_t>(std::chrono::nanoseconds(30s).count())};
  auto buf = t.local_buffer();
  auto send_off = [&](int p) { return (static_cast<std::size_t>(world) + p) * region; };
  auto recv_off = [&](int s) { return static_cast<std::size_t>(s) * region; };

  for (int round = 1; round <= 3; ++round) {
    for (int p = 0; p < world; ++p)
      for (std::size_t i = 0; i < region; ++i) buf[send_off(p) + i] = pattern(round, rank, p, i);
    // Rounds alternate the two ways of saying "landed": one put_signal, or
    // a put in two halves, a signal, and a flush.
    auto push_to = [&](auto& pusher, int p) {
      if (round % 2 == 1) return pusher.put_signal(p, send_off(p), recv_off(rank), region, rank, 1);
      const std::size_t half = region / 2;
      proxy::channel_status s = pusher.put(p, send_off(p), recv_off(rank), half);
      if (s == proxy::channel_status::ok)
        s = pusher.put(p, send_off(p) + half, recv_off(rank) + half, region - half);
      if (s == proxy::channel_status::ok) s = pusher.signal(p, rank, 1);
      if (s == proxy::channel_status::ok) s = pusher.flush(p);
      return s;
    };
    proxy::channel_writer writer = ch.writer();
    for (int p = 0; p < world; ++p) {
      const proxy::channel_status s = batched ? push_to(writer, p) : push_to(ch, p);
      if (s != proxy::channel_status::ok)
        return test::fail_rank(rank,
                               std::string("push to ") + std::to_string(p) + ": " + to_string(s));
    }
    for (int src = 0; src < world; ++src) {
      std::uint64_t seen = 0;
      const auto s =
          ch.wait(static_cast<std::size_t>(src), static_cast<std::uint64_t>(round), &seen);
      if (s != proxy::channel_status::ok)
        return test::fail_rank(rank, "round " + std::to_string(round) + ", signal of " +
                                         std::to_string(src) + ": " + to_string(s) + ", saw " +
                                         std::to_string(seen));
      for (std::size_t i = 0; i < region; ++i)
        if (buf[recv_off(src) + i] != pattern(round, src, rank, i))
          return test::fail_rank(rank, "round " + std::to_string(round) + ": byte " +
                                           std::to_string(i) + " from " + std::to_string(src) +
                                           " wrong");
    }
    // The send regions are rewritten next round: every put must be done.
    if (const auto s = ch.quiet(); s != proxy::channel_status::ok)
      return test::fail_rank(rank, std::string("quiet: ") + to_string(s));
    // And no peer may still be reading this round's receive regions.
    t.barrier(dl);
  }
  if (engine.failed()) return test::fail_rank(rank, "the proxy failed");
  return 0;
}

// Rings of 2 descriptors (the producer waits on the proxy all the time) and
// of 64, each pushed to descriptor by descriptor and through a writer.
template <class Transport>
void check_exchange(const char* what) {
  for (std::uint64_t capacity : {2u, 64u})
    for (bool batched : {false, true}) {
      CAPTURE(capacity);
      CAPTURE(batched);
      const auto codes = launch_local(3, [&](local_bootstrap& boot) {
        return exchange_through_channel<Transport>(boot, capacity, batched);
      });
      CHECK(test::all_ok(codes, what));
    }
}

}  // namespace

#if defined(EPCOMM_TEST_LIBFABRIC)
TEST_CASE("libfabric: a channel's puts and signals reach every rank through the proxy") {
  check_exchange<libfabric::transport>("libfabric channel");
}
#endif

#if defined(EPCOMM_TEST_UCX)
TEST_CASE("ucx: a channel's puts and signals reach every rank through the proxy") {
  check_exchange<ucx::transport>("ucx channel");
}
#endif
