// The libfabric transport under the RMA contract suite and the normal-mode
// dispatch/combine suite. CTest runs this file once per provider, selected by
// FI_PROVIDER ("tcp;ofi_rxm", "shm") on loopback; the cases below test what is
// particular to libfabric.
#include "epcomm/libfabric/transport.hpp"
#include "support/dispatch_combine_suite.hpp"
#include "support/rma_transport_suite.hpp"

TYPE_TO_STRING(epcomm::libfabric::transport);
EPCOMM_RMA_TRANSPORT_SUITE(epcomm::libfabric::transport);
EPCOMM_DISPATCH_COMBINE_SUITE(epcomm::libfabric::transport);

using namespace epcomm;

TEST_CASE("remote CQ data carries slot and increment in 32 bits") {
  for (std::size_t slot : {std::size_t{0}, std::size_t{1}, libfabric::max_signal_slots - 1}) {
    for (std::uint64_t n : {std::uint64_t{0}, std::uint64_t{1}, libfabric::max_signal_increment}) {
      const std::uint64_t data = libfabric::encode_signal(slot, n);
      CHECK((data >> 32) == 0);
      CHECK(libfabric::signal_slot_of(data) == slot);
      CHECK(libfabric::signal_increment_of(data) == n);
    }
  }
}

TEST_CASE("writes above max_write are split, and large increments too") {
  INFO("provider:", test::provider_environment());
  constexpr std::size_t bytes = 100'003;
  const auto codes = launch_local(2, [&](local_bootstrap& boot) {
    const int rank = boot.rank(), peer = 1 - rank;
    const deadline dl = deadline::after(std::chrono::seconds(60));
    libfabric::options opt;
    opt.max_write = 4096;
    libfabric::transport t(boot, 2 * bytes, 1, dl, opt);
    if (t.max_write() != 4096) return test::fail_rank(rank, "max_write not applied");
    auto buf = t.local_buffer();
    for (std::size_t i = 0; i < bytes; ++i) buf[i] = test::pattern(rank, peer, i);
    // 25 writes, then a signal of 2 * 4095 + 10: three signal writes.
    const std::uint64_t n = 2 * libfabric::max_signal_increment + 10;
    t.put_signal(peer, 0, bytes, bytes, 0, n);
    t.wait(0, n, dl, {"split test", peer, "the split block"});
    for (std::size_t i = 0; i < bytes; ++i)
      if (buf[bytes + i] != test::pattern(peer, rank, i))
        return test::fail_rank(rank, "byte " + std::to_string(i) + " wrong");
    if (!test::complete_until(t, 1, dl)) return test::fail_rank(rank, "put_signal never completed");
    t.barrier(dl);
    return 0;
  });
  CHECK(test::all_ok(codes, "split writes"));
}

TEST_CASE("an unknown provider is an error that says what was asked for") {
  const auto codes = launch_local(1, [](local_bootstrap& boot) {
    libfabric::options opt;
    opt.provider = "no-such-provider";
    try {
      libfabric::transport t(boot, 4096, 1, deadline::after(std::chrono::seconds(10)), opt);
    } catch (const error& e) {
      return std::string(e.what()).find("no provider no-such-provider offers FI_EP_RDM") !=
                     std::string::npos
                 ? 0
                 : test::fail_rank(0, e.what());
    }
    return test::fail_rank(0, "transport built over a provider that does not exist");
  });
  CHECK(test::all_ok(codes, "unknown provider"));
}
