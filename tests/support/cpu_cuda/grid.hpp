// launch(): runs a kernel's grid on the CPU. Blocks run concurrently on
// options.sms OS threads ("SMs"); each SM takes the next block of a
// seed-shuffled order and runs it to completion before taking another, so
// __shared__ (thread_local) belongs to the one block an SM runs, and
// blocks that wait on each other progress as long as there are SMs for them.
//
// The first fault of any block stops the grid: no SM takes another block, and
// the running ones drop their fibers at their next switch. launch() then throws
// the fault as device_fault. Past options.deadline every block faults at its
// next switch; a kernel that spins without ever switching (no barrier,
// collective or cpu_cuda::yield()) cannot be stopped, so launch() aborts the
// process when a second deadline passed instead of hanging.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "support/cpu_cuda/block.hpp"
#include "support/cpu_cuda/device_fault.hpp"
#include "support/cpu_cuda/dim3.hpp"
#include "support/cpu_cuda/fiber.hpp"

namespace epcomm::test::cpu_cuda {

struct launch_options {
  std::uint64_t seed = 0;  // draws the block order and every block's thread schedule
  unsigned sms = 2;        // OS threads running blocks at once
  std::chrono::milliseconds deadline{10'000};
  std::size_t stack_bytes = 256 * 1024;  // per CUDA thread
};

inline constexpr unsigned max_threads_per_block = 1024;

namespace detail {

class grid_run {
 public:
  grid_run(dim3 grid, dim3 block, const launch_options& options,
           const std::function<void()>& kernel)
      : grid_(grid), block_(block), options_(options), kernel_(kernel), order_(grid.volume()) {
    std::iota(order_.begin(), order_.end(), 0u);
    std::shuffle(order_.begin(), order_.end(), std::mt19937_64(options.seed));
    limits_.grid_stopped = &stopped_;
    limits_.deadline = std::chrono::steady_clock::now() + options.deadline;
    limits_.deadline_after = options.deadline;
  }

  void run() {
    const unsigned sms = std::min<unsigned>(options_.sms, grid_.volume());
    std::vector<std::thread> threads;
    for (unsigned sm = 0; sm < sms; ++sm) threads.emplace_back([this] { sm_main(); });
    {
      std::unique_lock lock(mutex_);
      if (!all_done_.wait_until(lock, limits_.deadline + options_.deadline,
                                [&] { return sms_done_ == sms; })) {
        std::fprintf(stderr,
                     "cpu_cuda: a kernel still runs twice its %lld ms deadline after launch: some "
                     "thread spins without a barrier, collective or cpu_cuda::yield(); aborting\n",
                     static_cast<long long>(options_.deadline.count()));
        std::abort();
      }
    }
    for (std::thread& t : threads) t.join();
    if (!fault_.empty()) throw device_fault(fault_);
  }

 private:
  void sm_main() {
    try {
      std::vector<std::unique_ptr<fiber>> stacks;
      for (unsigned i = 0; i < block_.volume(); ++i) {
        stacks.push_back(std::make_unique<fiber>(options_.stack_bytes));
      }
      while (!stopped_.load(std::memory_order_relaxed)) {
        const std::size_t next = next_.fetch_add(1);
        if (next >= order_.size()) break;
        const unsigned b = order_[next];
        block running(dim3::from_linear(b, grid_), grid_, block_, kernel_, stacks,
                      options_.seed ^ (0x9e3779b97f4a7c15ull * (b + 1)), limits_);
        if (std::string fault = running.run(); !fault.empty()) stop(std::move(fault));
      }
    } catch (const std::exception& e) {
      stop(std::string("an SM thread failed: ") + e.what());
    }
    std::lock_guard lock(mutex_);
    ++sms_done_;
    all_done_.notify_one();
  }

  void stop(std::string fault) {
    std::lock_guard lock(mutex_);
    if (fault_.empty()) fault_ = std::move(fault);
    stopped_.store(true);
  }

  dim3 grid_, block_;
  const launch_options& options_;
  const std::function<void()>& kernel_;
  std::vector<unsigned> order_;  // blocks, linear, in the order SMs take them
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> stopped_{false};
  block_limits limits_;
  std::mutex mutex_;
  std::condition_variable all_done_;
  unsigned sms_done_ = 0;
  std::string fault_;
};

}  // namespace detail

// Runs kernel(args...) once per CUDA thread of the grid, as
// kernel<<<grid, block>>>(args...) would; the arguments are copied once, as
// CUDA copies kernel parameters. Throws device_fault for what the kernel did
// wrong, std::invalid_argument for a launch CUDA would refuse.
template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block, const launch_options& options, Kernel&& kernel, Args&&... args) {
  if (grid.volume() == 0 || block.volume() == 0 || block.volume() > max_threads_per_block) {
    throw std::invalid_argument("cpu_cuda: launch of grid " + to_string(grid) + " block " +
                                to_string(block) + ": CUDA needs 1 to " +
                                std::to_string(max_threads_per_block) + " threads per block");
  }
  if (options.sms == 0) throw std::invalid_argument("cpu_cuda: launch with no SMs");
  const std::tuple<std::decay_t<Args>...> parameters(std::forward<Args>(args)...);
  const std::function<void()> body = [&] {
    std::apply([&](const auto&... p) { std::invoke(kernel, p...); }, parameters);
  };
  detail::grid_run(grid, block, options, body).run();
}

}  // namespace epcomm::test::cpu_cuda
