// mpi_bootstrap between real MPI processes: CTest starts this under mpiexec with 3 ranks on one
// host. Every rank runs every test case, in the same order, so the collectives pair up.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "epcomm/bootstrap/mpi.hpp"

using namespace epcomm;
using namespace std::chrono_literals;

static_assert(bootstrap<mpi_bootstrap>);

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

deadline soon() { return deadline::after(60s); }

// Rank r's block in round `round`: `bytes` bytes that name both.
std::vector<std::byte> block(int r, int round, std::size_t bytes) {
  std::vector<std::byte> b(bytes);
  for (std::size_t i = 0; i < bytes; ++i)
    b[i] = static_cast<std::byte>((r * 131 + round * 17 + static_cast<int>(i) * 7) & 0xff);
  return b;
}

template <class T>
std::vector<T> gather_values(mpi_bootstrap& boot, const T& mine) {
  const auto bytes = boot.all_gather(std::as_bytes(std::span(&mine, 1)), soon());
  std::vector<T> all(static_cast<std::size_t>(boot.world_size()));
  std::memcpy(all.data(), bytes.data(), bytes.size());
  return all;
}

}  // namespace

TEST_CASE("identity matches the communicator, and one host is one node") {
  REQUIRE(world_size() >= 2);
  mpi_bootstrap boot;
  CHECK(boot.rank() == world_rank());
  CHECK(boot.world_size() == world_size());

  // Independently of MPI's notion of a node: the ranks that share this host name.
  std::array<char, 256> host{};
  REQUIRE(gethostname(host.data(), host.size() - 1) == 0);
  const auto hosts = gather_values(boot, host);
  int here = 0, below = 0;
  for (int r = 0; r < boot.world_size(); ++r) {
    if (hosts[static_cast<std::size_t>(r)] != host) continue;
    ++here;
    if (r < boot.rank()) ++below;
  }
  CHECK(boot.local_world_size() == here);
  CHECK(boot.local_rank() == below);
}

TEST_CASE("all_gather returns every rank's block in rank order, for any size") {
  mpi_bootstrap boot;
  int round = 0;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{5}, std::size_t{0}, std::size_t{4096},
                            std::size_t{1} << 20, std::size_t{3}}) {
    CAPTURE(bytes);
    ++round;
    const auto mine = block(boot.rank(), round, bytes);
    const auto all = boot.all_gather(mine, soon());
    REQUIRE(all.size() == bytes * static_cast<std::size_t>(boot.world_size()));
    for (int r = 0; r < boot.world_size(); ++r) {
      CAPTURE(r);
      const auto expected = block(r, round, bytes);
      if (bytes != 0)  // memcmp's pointers must be valid even for 0 bytes
        CHECK(std::memcmp(all.data() + static_cast<std::size_t>(r) * bytes, expected.data(),
                          bytes) == 0);
    }
  }
}

TEST_CASE("barrier returns only once every rank has entered it") {
  mpi_bootstrap boot;
  for (int round = 0; round < 3; ++round) {
    // Each round a different rank is late, so the barrier cannot pass by luck of ordering.
    const int late = round % boot.world_size();
    if (boot.rank() == late) std::this_thread::sleep_for(200ms);
    const auto entered = steady::now().time_since_epoch().count();
    boot.barrier(soon());
    const auto left = steady::now().time_since_epoch().count();
    // steady_clock is CLOCK_MONOTONIC: one clock for every process on this host.
    const auto entries = gather_values(boot, entered);
    const auto exits = gather_values(boot, left);
    for (int r = 0; r < boot.world_size(); ++r)
      for (int q = 0; q < boot.world_size(); ++q)
        CHECK(exits[static_cast<std::size_t>(r)] >= entries[static_cast<std::size_t>(q)]);
  }
}

TEST_CASE("blocks of different sizes are an error on every rank, naming the odd rank") {
  mpi_bootstrap boot;
  const int odd = boot.world_size() - 1;
  const std::vector<std::byte> mine(boot.rank() == odd ? 12 : 8, std::byte{1});
  try {
    boot.all_gather(mine, soon());
    FAIL("all_gather accepted blocks of different sizes");
  } catch (const error& e) {
    CHECK(e.rank() == boot.rank());
    CHECK(e.peer() == odd);
    CHECK(e.op() == "bootstrap all_gather");
    CHECK(e.cause().find("block sizes disagree") != std::string::npos);
  }
  // Every rank saw the same sizes and stopped before moving data: still usable.
  const auto all = boot.all_gather(block(boot.rank(), 99, 16), soon());
  CHECK(all.size() == 16 * static_cast<std::size_t>(boot.world_size()));
  boot.barrier(soon());
}

TEST_CASE("a rank that does not come makes the others fail at their deadline, not hang") {
  mpi_bootstrap boot;
  const int late = boot.world_size() - 1;
  if (boot.rank() == late) {
    std::this_thread::sleep_for(1500ms);
    // Completes with the operations the others abandoned at their deadline.
    boot.barrier(soon());
  } else {
    const auto start = steady::now();
    try {
      boot.barrier(deadline::after(300ms));
      FAIL("barrier returned although a rank never entered it");
    } catch (const error& e) {
      const auto waited = steady::now() - start;
      CHECK(waited >= 300ms);
      CHECK(waited < 1500ms);
      CHECK(e.op() == "bootstrap barrier");
      CHECK(e.cause().find("deadline expired") != std::string::npos);
    }
    try {
      boot.all_gather(block(boot.rank(), 1, 4), soon());
      FAIL("a bootstrap with an abandoned collective accepted another call");
    } catch (const error& e) {
      CHECK(e.cause().find("unusable after an earlier failure") != std::string::npos);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank is alive here; realign them for the next case
}

TEST_CASE("a sub-communicator is a world of its own") {
  // Ranks {0, 1} and {2, ...}: each group gathers among itself only.
  MPI_Comm sub = MPI_COMM_NULL;
  const int color = world_rank() < 2 ? 0 : 1;
  REQUIRE(MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &sub) == MPI_SUCCESS);
  {
    mpi_bootstrap boot(sub);
    const int expected_size = color == 0 ? 2 : world_size() - 2;
    CHECK(boot.world_size() == expected_size);
    CHECK(boot.rank() == (color == 0 ? world_rank() : world_rank() - 2));
    CHECK(boot.local_world_size() == expected_size);  // one host
    const auto all = gather_values(boot, static_cast<std::int32_t>(world_rank()));
    for (int r = 0; r < boot.world_size(); ++r)
      CHECK(all[static_cast<std::size_t>(r)] == (color == 0 ? r : r + 2));
  }
  MPI_Comm_free(&sub);
}

TEST_CASE("communicators it cannot use are rejected with an error") {
  CHECK_THROWS_AS(mpi_bootstrap(MPI_COMM_NULL), error);

  // An inter-communicator between {0} and {1, ...}.
  MPI_Comm side = MPI_COMM_NULL, inter = MPI_COMM_NULL;
  const int color = world_rank() == 0 ? 0 : 1;
  REQUIRE(MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &side) == MPI_SUCCESS);
  const int remote_leader = color == 0 ? 1 : 0;
  REQUIRE(MPI_Intercomm_create(side, 0, MPI_COMM_WORLD, remote_leader, 7, &inter) == MPI_SUCCESS);
  try {
    mpi_bootstrap boot(inter);
    FAIL("an inter-communicator was accepted");
  } catch (const error& e) {
    CHECK(e.cause().find("inter-communicator") != std::string::npos);
  }
  MPI_Comm_free(&inter);
  MPI_Comm_free(&side);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context context(argc, argv);
  const int failed = context.run() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
