// One rank of test_env_bootstrap, which starts one of these per rank with the launcher's
// variables set and reads what it prints:
//
//   epcomm_env_rank <scenario> <rendezvous timeout ms> [rank]
//
// connect             rendezvous only.
// late <ms>           rendezvous only, after sleeping <ms> (so that others reach rank 0 first).
// gather              all_gather of 0 B, 1 B, 4 KiB and 1 MiB, 20 times, checking the order;
//                     then a barrier that must wait for the last rank, which enters it late.
// exit <rank>         after a barrier, <rank> exits abruptly; the others all_gather.
// mismatch <rank>     all_gather where <rank> passes 5 bytes and the others 4.
//
// Prints "ok" (exit 0); "error peer=<peer> ms=<time spent in the failing step>" and the message
// when an epcomm::error escapes (exit 1); "exited" from the rank that exits early (exit 0);
// anything else, such as wrong data, prints "failed: <why>" (exit 2).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "epcomm/bootstrap/env.hpp"

namespace {

using namespace std::chrono_literals;
using epcomm::steady;

// When the step in progress began, for the time an error report gives.
steady::time_point step_start = steady::now();

void begin_step() { step_start = steady::now(); }

// Operations get far more time than they need: the failure cases must fail on their own account,
// well before this.
epcomm::deadline op_deadline() { return epcomm::deadline::after(20s); }

std::vector<std::byte> pattern(int rank, int iter, std::size_t size) {
  std::vector<std::byte> v(size);
  for (std::size_t i = 0; i < size; ++i) {
    v[i] = static_cast<std::byte>(i * 131 + static_cast<std::size_t>(rank * 17 + iter * 7) + size);
  }
  return v;
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s != nullptr ? std::atoi(s) : fallback;
}

void gather(epcomm::env_bootstrap& b) {
  const int world = b.world_size();
  expect(b.rank() == env_int("RANK", -1) && world == env_int("WORLD_SIZE", -1), "rank/world_size");
  expect(b.local_rank() == env_int("LOCAL_RANK", b.rank()), "local_rank");
  expect(b.local_world_size() == env_int("LOCAL_WORLD_SIZE", world), "local_world_size");
  for (int iter = 0; iter < 20; ++iter) {
    for (const std::size_t size :
         {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20}) {
      const std::vector<std::byte> all = b.all_gather(pattern(b.rank(), iter, size), op_deadline());
      expect(all.size() == size * static_cast<std::size_t>(world), "result size");
      for (int r = 0; r < world; ++r) {
        const std::vector<std::byte> want = pattern(r, iter, size);
        const auto at =
            all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * size);
        expect(std::equal(want.begin(), want.end(), at),
               "block " + std::to_string(r) + " of " + std::to_string(size) + " bytes, iteration " +
                   std::to_string(iter));
      }
    }
    b.barrier(op_deadline());
  }
  const int last = world - 1;
  if (b.rank() == last) std::this_thread::sleep_for(300ms);
  const steady::time_point start = steady::now();
  b.barrier(op_deadline());
  expect(b.rank() == last || steady::now() - start >= 250ms,
         "barrier returned before rank " + std::to_string(last) + " entered it");
}

void exit_early(epcomm::env_bootstrap& b, int victim) {
  b.barrier(op_deadline());
  if (b.rank() == victim) {
    std::printf("exited\n");
    std::fflush(stdout);
    std::_Exit(0);  // Like a crash: no destructors, the kernel closes the sockets.
  }
  begin_step();
  b.all_gather(pattern(b.rank(), 0, 4), op_deadline());
  throw std::runtime_error("all_gather succeeded without rank " + std::to_string(victim));
}

void mismatch(epcomm::env_bootstrap& b, int odd) {
  begin_step();
  b.all_gather(pattern(b.rank(), 0, b.rank() == odd ? 5 : 4), op_deadline());
  throw std::runtime_error("all_gather succeeded with mismatched sizes");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::printf("failed: usage: %s <scenario> <timeout ms> [rank]\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  const int arg = argc > 3 ? std::atoi(argv[3]) : -1;
  try {
    if (scenario == "late") std::this_thread::sleep_for(std::chrono::milliseconds(arg));
    begin_step();
    epcomm::env_bootstrap b =
        epcomm::env_bootstrap::from_environment(std::chrono::milliseconds(std::atoi(argv[2])));
    if (scenario == "gather") {
      gather(b);
    } else if (scenario == "exit") {
      exit_early(b, arg);
    } else if (scenario == "mismatch") {
      mismatch(b, arg);
    } else if (scenario != "connect" && scenario != "late") {
      throw std::runtime_error("unknown scenario " + scenario);
    }
    std::printf("ok\n");
    return 0;
  } catch (const epcomm::error& e) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - step_start);
    std::printf("error peer=%d ms=%lld\n%s\n", e.peer(), static_cast<long long>(ms.count()),
                e.what());
    return 1;
  } catch (const std::exception& e) {
    std::printf("failed: %s\n", e.what());
    return 2;
  }
}
