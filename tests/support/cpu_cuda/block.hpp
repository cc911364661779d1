// One thread block run on the calling OS thread (an "SM"): every CUDA thread
// is a fiber, and the fibers run round-robin, each round in an order drawn
// from the seed, so a kernel that leans on one interleaving (a missing
// __syncthreads) sees others. A fiber runs until it reaches a block barrier, a
// warp collective or cpu_cuda::yield(); the barriers and collectives are
// rendezvous that release their threads once every thread they name arrived.
//
// What CUDA leaves undefined is a fault naming block, warp, lane or thread: a
// thread that exits while others wait at a barrier (or reaches one after
// another exited), a lane the mask names that exits, waits at a barrier or
// makes another collective call. A block stops at its first fault, when the
// grid stops, or at the deadline; its unfinished fibers are dropped without
// unwinding (device code holds nothing that needs a destructor), and their
// stacks are reused by the next block.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/cpu_cuda/device_fault.hpp"
#include "support/cpu_cuda/dim3.hpp"
#include "support/cpu_cuda/fiber.hpp"
#include "support/cpu_cuda/warp_collective.hpp"

namespace epcomm::test::cpu_cuda {

enum class barrier_kind { sync, all, any, count };

inline const char* name(barrier_kind b) {
  static constexpr auto names = names_for<barrier_kind, barrier_kind::count>(
      "__syncthreads", "__syncthreads_and", "__syncthreads_or", "__syncthreads_count");
  return names(b);
}

class block;

struct device_thread {
  enum class state { runnable, at_barrier, in_collective, exited };

  block* owner = nullptr;
  dim3 thread_idx;
  unsigned linear = 0;
  state now = state::runnable;
  int predicate = 0;  // its operand at a barrier
  lane_call call;     // its call while in a collective
  std::uint64_t result = 0;
  fiber* stack = nullptr;
};

// The fiber running on this OS thread; fibers never migrate, so threadIdx and
// friends read it without synchronization.
inline thread_local device_thread* running_thread = nullptr;

inline device_thread& current() {
  if (running_thread == nullptr)
    throw device_fault("a device function was called outside a kernel");
  return *running_thread;
}

// When a block must give up: the grid stopped (another block faulted), or the
// launch deadline passed.
struct block_limits {
  const std::atomic<bool>* grid_stopped = nullptr;
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds deadline_after{0};
};

class block {
 public:
  block(dim3 block_idx, dim3 grid_dim, dim3 block_dim, const std::function<void()>& kernel,
        std::vector<std::unique_ptr<fiber>>& stacks, std::uint64_t seed, block_limits limits)
      : block_idx_(block_idx),
        grid_dim_(grid_dim),
        block_dim_(block_dim),
        kernel_(&kernel),
        schedule_(seed),
        limits_(limits),
        threads_(block_dim.volume()) {
    for (unsigned i = 0; i < threads_.size(); ++i) {
      device_thread& t = threads_[i];
      t.owner = this;
      t.thread_idx = dim3::from_linear(i, block_dim);
      t.linear = i;
      t.stack = stacks[i].get();
      t.stack->reset(&fiber_main);
    }
  }
  block(const block&) = delete;
  block& operator=(const block&) = delete;

  dim3 block_idx() const { return block_idx_; }
  dim3 grid_dim() const { return grid_dim_; }
  dim3 block_dim() const { return block_dim_; }

  // Runs every thread to its end; returns the fault that stopped the block, or
  // "" (also when it stopped because the grid did).
  std::string run() {
    std::vector<unsigned> order;
    while (live_ > 0) {
      order.clear();
      for (const device_thread& t : threads_) {
        if (t.now == device_thread::state::runnable) order.push_back(t.linear);
      }
      if (order.empty())
        return where() + ": every live thread waits and none can arrive" + census();
      std::shuffle(order.begin(), order.end(), schedule_);
      for (const unsigned i : order) {
        if (threads_[i].now != device_thread::state::runnable) continue;
        switch_to(threads_[i]);
        if (!fault_.empty()) return fault_;
        if (limits_.grid_stopped->load(std::memory_order_relaxed)) return "";
        if (std::chrono::steady_clock::now() > limits_.deadline) {
          return where() + ": still running at the launch deadline (" +
                 std::to_string(limits_.deadline_after.count()) +
                 " ms); device code that waits must call cpu_cuda::yield()" + census();
        }
      }
    }
    return "";
  }

  // --- Called by device code on its own fiber. ---

  void yield(device_thread& t) { t.stack->suspend(); }

  int barrier(device_thread& t, barrier_kind kind, int predicate) {
    if (exited_ != nullptr) {
      record(where(t) + " reached " + name(kind) + " after " + where(*exited_) +
             " exited (CUDA: undefined)");
      park(t);
    }
    if (arrived_ > 0 && kind != barrier_kind_) {
      record(where(t) + " reached " + name(kind) + " while " + std::to_string(arrived_) +
             " threads wait at " + name(barrier_kind_));
      park(t);
    }
    barrier_kind_ = kind;
    t.now = device_thread::state::at_barrier;
    t.predicate = predicate;
    ++arrived_;
    check_warp(t.linear / warp_size);
    if (arrived_ == threads_.size()) release_barrier();
    t.stack->suspend();
    return static_cast<int>(t.result);
  }

  std::uint64_t warp_collective(device_thread& t, const lane_call& call) {
    const unsigned lane = t.linear % warp_size;
    if ((call.mask >> lane & 1u) == 0) {
      record(where_lane(t) + " calls " + describe(call) + ", whose mask does not name itself");
      park(t);
    }
    t.call = call;
    t.now = device_thread::state::in_collective;
    check_warp(t.linear / warp_size);
    t.stack->suspend();
    return t.result;
  }

  // The lanes of t's warp that have not exited (CUDA: converged lanes; here
  // every live lane, as no lane runs ahead of a rendezvous).
  unsigned active_lanes(const device_thread& t) const {
    const unsigned warp = t.linear / warp_size;
    unsigned mask = 0;
    for (unsigned lane = 0; lane < warp_size; ++lane) {
      const unsigned i = warp * warp_size + lane;
      if (i < threads_.size() && threads_[i].now != device_thread::state::exited)
        mask |= 1u << lane;
    }
    return mask;
  }

 private:
  static void fiber_main() {
    device_thread& t = *running_thread;
    t.stack->entered();
    t.owner->run_thread(t);
    t.stack->finish();
  }

  void run_thread(device_thread& t) {
    std::string error;
    try {
      (*kernel_)();
    } catch (const std::exception& e) {
      error = where(t) + " threw: " + e.what();
    } catch (...) {
      error = where(t) + " threw a non-standard exception";
    }
    t.now = device_thread::state::exited;
    --live_;
    if (!error.empty()) record(error);
    if (exited_ == nullptr) exited_ = &t;
    if (arrived_ > 0) {
      record(where(t) + " exited while " + std::to_string(arrived_) + " threads wait at " +
             name(barrier_kind_) + " (CUDA: undefined)");
    }
    check_warp(t.linear / warp_size);
  }

  void switch_to(device_thread& t) {
    running_thread = &t;
    t.stack->resume();
    running_thread = nullptr;
  }

  // After a fault t caused: leaves its fiber for good, as run() stops the
  // block at once. Called once the message's temporaries are gone, since the
  // fiber's frames are dropped without unwinding.
  [[noreturn]] void park(device_thread& t) {
    for (;;) t.stack->suspend();
  }

  void record(const std::string& fault) {
    if (fault_.empty()) fault_ = fault;
  }

  void release_barrier() {
    int all = 1, any = 0, count = 0;
    for (const device_thread& t : threads_) {
      all &= t.predicate != 0;
      any |= t.predicate != 0;
      count += t.predicate != 0;
    }
    const int result = barrier_kind_ == barrier_kind::all     ? all
                       : barrier_kind_ == barrier_kind::any   ? any
                       : barrier_kind_ == barrier_kind::count ? count
                                                              : 0;
    for (device_thread& t : threads_) {
      t.now = device_thread::state::runnable;
      t.result = static_cast<std::uint64_t>(result);
    }
    arrived_ = 0;
  }

  // After any lane of the warp changed state: every pending collective whose
  // lanes all arrived completes; one whose lane did something else faults.
  void check_warp(unsigned warp) {
    const unsigned first = warp * warp_size;
    const unsigned lanes =
        std::min<unsigned>(warp_size, static_cast<unsigned>(threads_.size()) - first);
    const unsigned present = lanes == warp_size ? ~0u : (1u << lanes) - 1u;
    for (unsigned waiter = 0; waiter < lanes; ++waiter) {
      const device_thread& w = threads_[first + waiter];
      if (w.now != device_thread::state::in_collective) continue;
      // Lanes past the end of a partial warp do not exist: a full mask there
      // names only the lanes that do, as on the hardware.
      const unsigned group = w.call.mask & present;
      bool complete = true;
      for (unsigned lane = 0; lane < lanes; ++lane) {
        if ((group >> lane & 1u) == 0) continue;
        const device_thread& other = threads_[first + lane];
        // Built only for a fault: this runs after every lane's every step.
        const auto waits = [&] {
          return where_warp(warp) + ": lane " + std::to_string(waiter) + " waits in " +
                 describe(w.call) + " but lane " + std::to_string(lane);
        };
        switch (other.now) {
          case device_thread::state::exited:
            return record(waits() + " exited");
          case device_thread::state::at_barrier:
            return record(waits() + " waits at " + name(barrier_kind_));
          case device_thread::state::in_collective:
            if (!other.call.same_collective(w.call)) {
              return record(waits() + " calls " + describe(other.call));
            }
            break;
          case device_thread::state::runnable:
            complete = false;
            break;
        }
      }
      if (complete) release_collective(warp, group);
    }
  }

  void release_collective(unsigned warp, unsigned group) {
    std::array<lane_call, warp_size> calls{};
    std::array<std::uint64_t, warp_size> results{};
    const unsigned first = warp * warp_size;
    for (unsigned lane = 0; lane < warp_size; ++lane) {
      if (group >> lane & 1u) calls[lane] = threads_[first + lane].call;
    }
    if (const std::string error = resolve(calls, group, results); !error.empty()) {
      return record(where_warp(warp) + ": " + error);
    }
    for (unsigned lane = 0; lane < warp_size; ++lane) {
      if ((group >> lane & 1u) == 0) continue;
      threads_[first + lane].result = results[lane];
      threads_[first + lane].now = device_thread::state::runnable;
    }
  }

  std::string where() const { return "block " + to_string(block_idx_); }
  std::string where(const device_thread& t) const {
    return where() + " thread " + to_string(t.thread_idx);
  }
  std::string where_warp(unsigned warp) const { return where() + " warp " + std::to_string(warp); }
  std::string where_lane(const device_thread& t) const {
    return where_warp(t.linear / warp_size) + " lane " + std::to_string(t.linear % warp_size) +
           " (thread " + to_string(t.thread_idx) + ")";
  }

  // How many threads are where, for a fault that is about the whole block.
  std::string census() const {
    using state = device_thread::state;
    std::array<unsigned, static_cast<std::size_t>(state::exited) + 1> in{};  // threads per state
    for (const device_thread& t : threads_) ++in[static_cast<std::size_t>(t.now)];
    auto n = [&](state s) { return std::to_string(in[static_cast<std::size_t>(s)]); };
    return " [" + n(state::runnable) + " running, " + n(state::at_barrier) + " at a barrier, " +
           n(state::in_collective) + " in a warp collective, " + n(state::exited) + " exited]";
  }

  dim3 block_idx_, grid_dim_, block_dim_;
  const std::function<void()>* kernel_;
  std::mt19937_64 schedule_;
  block_limits limits_;
  std::vector<device_thread> threads_;
  std::size_t live_ = threads_.size();
  std::size_t arrived_ = 0;  // threads at the block barrier
  barrier_kind barrier_kind_ = barrier_kind::sync;
  const device_thread* exited_ = nullptr;  // the first thread that exited
  std::string fault_;
};

}  // namespace epcomm::test::cpu_cuda
