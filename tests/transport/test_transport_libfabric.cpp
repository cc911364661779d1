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

TEST_CASE(
    "EPCOMM_FI_DOMAIN picks the device, and one not offered is an error naming those offered") {
  INFO("provider:", test::provider_environment());
  // The device every rank takes unasked, then the same device asked for by name.
  const auto chosen = launch_local(2, [](local_bootstrap& boot) {
    libfabric::transport t(boot, 4096, 1, deadline::after(std::chrono::seconds(30)));
    return t.domain().empty() ? test::fail_rank(boot.rank(), "no domain name") : 0;
  });
  REQUIRE(test::all_ok(chosen, "default device"));
  const auto codes = launch_local(2, [](local_bootstrap& boot) {
    std::string usual;
    {
      libfabric::transport t(boot, 4096, 1, deadline::after(std::chrono::seconds(30)));
      usual = t.domain();
    }
    ::setenv("EPCOMM_FI_DOMAIN", usual.c_str(), 1);
    {
      libfabric::transport t(boot, 4096, 1, deadline::after(std::chrono::seconds(30)));
      if (t.domain() != usual) return test::fail_rank(boot.rank(), "override not taken");
    }
    ::setenv("EPCOMM_FI_DOMAIN", ("no-such-device," + usual).c_str(), 1);
    try {
      // Local rank 0 asks for the missing device and fails before any exchange;
      // rank 1 takes the usual one and must not wait for rank 0 past its deadline.
      libfabric::transport t(boot, 4096, 1, deadline::after(std::chrono::seconds(3)));
      if (boot.rank() == 0) return test::fail_rank(0, "a device not offered was accepted");
    } catch (const error& e) {
      const std::string what = e.what();
      if (boot.rank() == 0 && (what.find("EPCOMM_FI_DOMAIN names 'no-such-device' for local "
                                         "rank 0") == std::string::npos ||
                               what.find("offered: " + usual) == std::string::npos))
        return test::fail_rank(0, what);
    }
    return 0;
  });
  CHECK(test::all_ok(codes, "EPCOMM_FI_DOMAIN"));
}
