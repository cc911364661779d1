// The CPU execution layer that runs CUDA kernel sources under g++: indices,
// block barriers, warp collectives, atomics, concurrency between blocks, and
// the faults it reports for what CUDA leaves undefined.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/cpu_cuda/device_api.hpp"

namespace {

namespace cc = epcomm::test::cpu_cuda;

constexpr std::uint64_t seeds[] = {1, 2, 3, 17, 12345};
constexpr unsigned full = 0xffffffffu;

cc::launch_options with_seed(std::uint64_t seed) {
  cc::launch_options options;
  options.seed = seed;
  return options;
}

// What launch throws, or "" when it returns.
std::string fault_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const cc::device_fault& fault) {
    return fault.what();
  }
  return "";
}

// Runs f(lane, warp) on each thread of a one-block grid; what each returned.
template <class F>
std::vector<long long> per_thread(unsigned threads, std::uint64_t seed, F f) {
  std::vector<long long> out(threads, -999);
  cc::launch(dim3(1), dim3(threads), with_seed(seed), [&] {
    const unsigned tid = threadIdx.x;
    out[tid] = f(static_cast<int>(tid % 32), static_cast<int>(tid / 32));
  });
  return out;
}

template <class F>
std::vector<long long> reference(unsigned threads, F f) {
  std::vector<long long> out(threads);
  for (unsigned tid = 0; tid < threads; ++tid) {
    out[tid] = f(static_cast<int>(tid % 32), static_cast<int>(tid / 32));
  }
  return out;
}

int value(int lane, int warp) { return lane * 7 + warp * 1000 + 3; }

TEST_CASE("every (block, thread) of a grid runs once and sees its indices") {
  const dim3 shapes[][2] = {{dim3(1), dim3(1)},
                            {dim3(3, 2, 1), dim3(7, 3, 2)},
                            {dim3(2, 2, 2), dim3(64)},
                            {dim3(5), dim3(33)},
                            {dim3(1, 1, 3), dim3(2, 2, 8)}};
  for (const auto& [grid, block] : shapes) {
    for (const std::uint64_t seed : {1, 2}) {
      CAPTURE(cc::to_string(grid));
      CAPTURE(cc::to_string(block));
      std::vector<int> runs(grid.volume() * block.volume());
      std::atomic<int> wrong_dims{0};
      cc::launch(grid, block, with_seed(seed), [&] {
        const bool dims_ok = blockDim.x == block.x && blockDim.y == block.y &&
                             blockDim.z == block.z && gridDim.x == grid.x && gridDim.y == grid.y &&
                             gridDim.z == grid.z && warpSize == 32;
        if (!dims_ok) wrong_dims.fetch_add(1);
        const unsigned b = blockIdx.x + grid.x * (blockIdx.y + grid.y * blockIdx.z);
        const unsigned t = threadIdx.x + block.x * (threadIdx.y + block.y * threadIdx.z);
        atomicAdd(&runs[b * block.volume() + t], 1);
      });
      CHECK(wrong_dims.load() == 0);
      CHECK(runs == std::vector<int>(runs.size(), 1));
    }
  }
}

// Each thread stores its value in two steps with a switch between them, so a
// reader that does not wait for every writer sees a half-written array.
int block_sum(std::uint64_t seed, bool with_barrier) {
  constexpr unsigned threads = 64;
  int total = -1;
  cc::launch(dim3(1), dim3(threads), with_seed(seed), [&] {
    __shared__ int values[threads];
    const unsigned tid = threadIdx.x;
    values[tid] = 0;
    cc::yield();
    values[tid] = static_cast<int>(tid) + 1;
    if (with_barrier) __syncthreads();
    if (tid == 0) {
      int sum = 0;
      for (const int v : values) sum += v;
      total = sum;
    }
  });
  return total;
}

TEST_CASE("__syncthreads orders a shared-memory reduction; without it a seed sees it wrong") {
  constexpr int expected = 64 * 65 / 2;
  std::set<int> without;
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    CHECK(block_sum(seed, true) == expected);
    without.insert(block_sum(seed, false));
  }
  // Each seed interleaves the threads differently, so the torn sums differ.
  CHECK(without.size() > 1);
  CHECK(without.count(expected) < without.size());
}

TEST_CASE("__syncthreads_and, _or and _count reduce the block's predicates") {
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    const auto out = per_thread(96, seed, [](int lane, int warp) {
      const int tid = warp * 32 + lane;
      const int all_small = __syncthreads_and(tid < 96);
      const int all_even = __syncthreads_and(tid % 2 == 0);
      const int any_is_50 = __syncthreads_or(tid == 50);
      const int any_over = __syncthreads_or(tid > 200);
      const int thirds = __syncthreads_count(tid % 3 == 0);
      return all_small + 10 * all_even + 100 * any_is_50 + 1000 * any_over + 10000 * thirds;
    });
    CHECK(out == std::vector<long long>(96, 1 + 100 + 10000 * 32));
  }
}

TEST_CASE("warp shuffles match CUDA, with widths and partial masks") {
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            return __shfl_sync(full, value(lane, warp), (lane + 5) % 32);
          }) == reference(64, [](int lane, int warp) { return value((lane + 5) % 32, warp); }));
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            return __shfl_sync(full, value(lane, warp), 35, 8);  // 35 wraps to 3 of each 8
          }) == reference(64, [](int lane, int warp) { return value(lane / 8 * 8 + 3, warp); }));
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            return __shfl_up_sync(full, value(lane, warp), 3, 16);
          }) == reference(64, [](int lane, int warp) {
            return value(lane % 16 >= 3 ? lane - 3 : lane, warp);
          }));
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            return __shfl_down_sync(full, value(lane, warp), 5);
          }) == reference(64, [](int lane, int warp) {
            return value(lane + 5 < 32 ? lane + 5 : lane, warp);
          }));
    // A butterfly sum leaves the warp's total in every lane.
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            int v = value(lane, warp);
            for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(full, v, m);
            return v;
          }) == reference(64, [](int, int warp) {
            int sum = 0;
            for (int l = 0; l < 32; ++l) sum += value(l, warp);
            return sum;
          }));
    // Even and odd lanes shuffle as two disjoint groups at once.
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            const unsigned mask = lane % 2 == 0 ? 0x55555555u : 0xaaaaaaaau;
            return __shfl_xor_sync(mask, value(lane, warp), 2);
          }) == reference(64, [](int lane, int warp) { return value(lane ^ 2, warp); }));
    // Only the low half of each warp takes part; the others skip it.
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            return lane < 16 ? __shfl_down_sync(0x0000ffffu, value(lane, warp), 4, 16) : -1;
          }) == reference(64, [](int lane, int warp) {
            return lane < 16 ? value(lane + 4 < 16 ? lane + 4 : lane, warp) : -1;
          }));
    CHECK(per_thread(32, seed, [](int lane, int) {
            const double moved = __shfl_sync(full, lane * 0.5, 31 - lane);
            const unsigned long long wide = __shfl_xor_sync(full, (1ull << 40) + lane, 7);
            return static_cast<long long>(moved * 2) * 100000 +
                   static_cast<long long>(wide - (1ull << 40));
          }) == reference(32, [](int lane, int) { return (31 - lane) * 100000LL + (lane ^ 7); }));
  }
}

TEST_CASE("warp votes, match, reduce, __syncwarp and __activemask match CUDA") {
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            return static_cast<long long>(__ballot_sync(full, (lane + warp) % 3 == 0));
          }) == reference(64, [](int, int warp) {
            long long bits = 0;
            for (int l = 0; l < 32; ++l) bits |= (l + warp) % 3 == 0 ? 1LL << l : 0;
            return bits;
          }));
    CHECK(per_thread(64, seed, [](int lane, int) {
            return lane < 16 ? static_cast<long long>(__ballot_sync(0xffffu, lane % 2)) : -1;
          }) == reference(64, [](int lane, int) { return lane < 16 ? 0xaaaaLL : -1; }));
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            return __any_sync(full, lane == 17 && warp == 1) + 10 * __any_sync(full, lane > 40) +
                   100 * __all_sync(full, lane < 32) + 1000 * __all_sync(full, lane != 4);
          }) == reference(64, [](int, int warp) { return (warp == 1 ? 1 : 0) + 100; }));
    CHECK(per_thread(64, seed, [](int lane, int) {
            return static_cast<long long>(__match_any_sync(full, lane % 4));
          }) == reference(64, [](int lane, int) { return 0x11111111LL << (lane % 4); }));
    CHECK(per_thread(32, seed, [](int lane, int) {
            return static_cast<long long>(__match_any_sync(full, lane < 8 ? 1ull << 40 : 5ull));
          }) == reference(32, [](int lane, int) { return lane < 8 ? 0xffLL : 0xffffff00LL; }));
    CHECK(per_thread(64, seed, [](int lane, int warp) {
            return __reduce_add_sync(full, lane - 20) * 10 +
                   static_cast<long long>(__reduce_add_sync(full, static_cast<unsigned>(warp)));
          }) == reference(64, [](int, int warp) { return (496 - 640) * 10 + warp * 32; }));
    // A 40-thread block: the second warp has 8 lanes, and a full mask names them.
    CHECK(per_thread(40, seed, [](int, int) {
            __syncwarp();
            return static_cast<long long>(__activemask()) * 100 + __reduce_add_sync(full, 1);
          }) == reference(40, [](int, int warp) {
            return warp == 0 ? 0xffffffffLL * 100 + 32 : 0xffLL * 100 + 8;
          }));
  }
}

TEST_CASE("atomics and intrinsics") {
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    int sum = 0, low = 1 << 30, high = -1, winner = -1;
    unsigned long long wide = 0;
    unsigned swaps = 0;
    float weight = 0;
    cc::launch(dim3(4), dim3(64), with_seed(seed), [&] {
      const int id = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
      atomicAdd(&sum, id);
      atomicMin(&low, id);
      atomicMax(&high, id);
      atomicAdd(&wide, 1ull << 33);
      atomicAdd(&weight, 0.5f);
      atomicCAS(&winner, -1, id);
      atomicExch(&swaps, 1u);
      __threadfence();
    });
    CHECK(sum == 255 * 256 / 2);
    CHECK(low == 0);
    CHECK(high == 255);
    CHECK(wide == 256ull << 33);
    CHECK(weight == 128.0f);
    CHECK(winner >= 0);
    CHECK(winner < 256);
    CHECK(swaps == 1u);
  }
  CHECK(__popc(0xf0f0u) == 8);
  CHECK(__popcll(~0ull) == 64);
  CHECK(__ffs(0) == 0);
  CHECK(__ffs(8) == 4);
  CHECK(__ffs(-2147483647 - 1) == 32);
  const int x = 41;
  CHECK(__ldg(&x) == 41);
  CHECK(__fadd_rn(1.5f, 2.0f) == 3.5f);
  CHECK(__fmul_rn(1.5f, 2.0f) == 3.0f);
  CHECK(__fdiv_rn(3.0f, 2.0f) == 1.5f);
  const std::uint64_t before = cc::globaltimer_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  CHECK(cc::globaltimer_ns() - before >= 2'000'000u);
}

TEST_CASE("a lane that skips a warp collective is a fault naming it") {
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    const std::string skipped = fault_of([&] {
      per_thread(64, seed, [](int lane, int warp) {
        return lane == 7 && warp == 1 ? 0 : __shfl_sync(full, lane, 0);
      });
    });
    CHECK(skipped.find("warp 1:") != std::string::npos);
    CHECK(skipped.find("lane 7 exited") != std::string::npos);
    CHECK(skipped.find("__shfl_sync(mask 0xffffffff)") != std::string::npos);

    const std::string other_call = fault_of([&] {
      per_thread(32, seed, [](int lane, int) {
        return lane == 3 ? __ballot_sync(full, 1) : __shfl_sync(full, 1u, 0);
      });
    });
    CHECK(other_call.find("lane 3") != std::string::npos);
    CHECK(other_call.find("__ballot_sync") != std::string::npos);
    CHECK(other_call.find("__shfl_sync") != std::string::npos);

    const std::string at_barrier = fault_of([&] {
      per_thread(32, seed, [](int lane, int) {
        if (lane == 5) {
          __syncthreads();
          return 0;
        }
        return __any_sync(full, 1);
      });
    });
    CHECK(at_barrier.find("lane 5 waits at __syncthreads") != std::string::npos);
    CHECK(at_barrier.find("__any_sync") != std::string::npos);
  }
  CHECK(fault_of([] {
          per_thread(32, 1, [](int lane, int) { return lane == 1 ? __shfl_sync(1u, lane, 0) : 0; });
        })
            .find("lane 1 (thread (1,0,0)) calls __shfl_sync(mask 0x1), whose mask does not name "
                  "itself") != std::string::npos);
  CHECK(fault_of([] {
          per_thread(32, 1, [](int lane, int) { return __shfl_sync(full, lane, 0, 6); });
        }).find("width 6") != std::string::npos);
  // Lanes 0-15 take part, but lane 2 reads lane 20, which does not.
  CHECK(fault_of([] {
          per_thread(32, 1, [](int lane, int) {
            return lane < 16 ? __shfl_sync(0xffffu, lane, lane == 2 ? 20 : 0) : 0;
          });
        }).find("lane 2 reads lane 20") != std::string::npos);
}

TEST_CASE("a thread that exits while others wait at __syncthreads is a fault naming it") {
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    const std::string fault = fault_of([&] {
      cc::launch(dim3(2), dim3(8, 2), with_seed(seed), [] {
        if (blockIdx.x == 1 && threadIdx.x == 3 && threadIdx.y == 1) return;
        __syncthreads();
      });
    });
    CHECK(fault.find("block (1,0,0)") != std::string::npos);
    CHECK(fault.find("thread (3,1,0)") != std::string::npos);
    CHECK(fault.find("__syncthreads") != std::string::npos);
  }
  // Thread 0 calls another barrier than the rest: which arrives first varies.
  const std::string mixed = fault_of([] {
    cc::launch(dim3(1), dim3(4), {}, [] {
      if (threadIdx.x == 0) {
        __syncthreads_count(1);
      } else {
        __syncthreads();
      }
    });
  });
  CHECK(mixed.find("__syncthreads_count") != std::string::npos);
  CHECK(mixed.find(" threads wait at __syncthreads") != std::string::npos);
}

TEST_CASE("a kernel's exception stops the grid and names its thread") {
  CHECK(fault_of([] {
          cc::launch(dim3(3), dim3(4), {}, [] {
            if (blockIdx.x == 2 && threadIdx.x == 1) throw std::runtime_error("bad input");
          });
        }) == "cpu_cuda: block (2,0,0) thread (1,0,0) threw: bad input");
}

// Two blocks that each wait for the other's flag finish only if they run at
// the same time on different OS threads.
TEST_CASE("blocks run concurrently on at least two OS threads") {
  for (const std::uint64_t seed : seeds) {
    CAPTURE(seed);
    unsigned flags[2] = {0, 0};
    std::mutex mutex;
    std::set<std::thread::id> sms;
    cc::launch(dim3(2), dim3(32), with_seed(seed), [&] {
      if (threadIdx.x == 0) {
        const std::lock_guard lock(mutex);
        sms.insert(std::this_thread::get_id());
      }
      const unsigned self = blockIdx.x;
      atomicExch(&flags[self], 1u);
      while (atomicAdd(&flags[1 - self], 0u) == 0) cc::yield();
    });
    CHECK(sms.size() == 2);
  }
}

TEST_CASE("blocks are taken in an order that varies with the seed") {
  std::set<std::vector<unsigned>> orders;
  for (const std::uint64_t seed : seeds) {
    std::vector<unsigned> order;
    cc::launch_options options = with_seed(seed);
    options.sms = 1;
    cc::launch(dim3(8), dim3(1), options, [&] { order.push_back(blockIdx.x); });
    orders.insert(order);
  }
  CHECK(orders.size() > 1);
}

TEST_CASE("a block that waits forever fails at the deadline instead of hanging") {
  cc::launch_options options;
  options.deadline = std::chrono::milliseconds(300);
  unsigned never = 0;
  const auto start = std::chrono::steady_clock::now();
  const std::string fault = fault_of([&] {
    cc::launch(dim3(3), dim3(64), options, [&] {
      if (blockIdx.x == 1) {
        while (atomicAdd(&never, 0u) == 0) cc::yield();
      }
    });
  });
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(fault.find("block (1,0,0): still running at the launch deadline (300 ms)") !=
        std::string::npos);
  CHECK(took >= std::chrono::milliseconds(300));
  CHECK(took < options.deadline + std::chrono::seconds(5));  // slack for a loaded CI machine

  // With one SM the second of two handshaking blocks never starts.
  options.sms = 1;
  unsigned flags[2] = {0, 0};
  CHECK(fault_of([&] {
          cc::launch(dim3(2), dim3(1), options, [&] {
            atomicExch(&flags[blockIdx.x], 1u);
            while (atomicAdd(&flags[1 - blockIdx.x], 0u) == 0) cc::yield();
          });
        }).find("still running at the launch deadline") != std::string::npos);
}

TEST_CASE("a fault in one block stops the blocks that wait on it") {
  cc::launch_options options;
  options.sms = 4;
  unsigned never = 0;
  const auto start = std::chrono::steady_clock::now();
  const std::string fault = fault_of([&] {
    cc::launch(dim3(4), dim3(32), options, [&] {
      if (blockIdx.x == 2) {
        if (threadIdx.x != 9) __syncwarp();
        return;
      }
      while (atomicAdd(&never, 0u) == 0) cc::yield();
    });
  });
  CHECK(fault.find("block (2,0,0) warp 0") != std::string::npos);
  CHECK(fault.find("lane 9 exited") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < options.deadline / 2);
}

TEST_CASE("launches CUDA would refuse are rejected") {
  CHECK_THROWS_AS(cc::launch(dim3(1), dim3(1025), {}, [] {}), std::invalid_argument);
  CHECK_THROWS_AS(cc::launch(dim3(0), dim3(32), {}, [] {}), std::invalid_argument);
}

}  // namespace
