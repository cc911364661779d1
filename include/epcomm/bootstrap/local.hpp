// The embedded default: fork N ranks on this host. The launcher maps one
// anonymous shared page area before forking; ranks all-gather through it. The
// launcher reaps every rank, marks the dead ones there (so survivors fail
// fast), and kills what is still running at its deadline.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/spin_wait.hpp"

namespace epcomm {

struct local_launch_options {
  std::chrono::milliseconds timeout{120'000};  // after this every rank still running is killed
  int ranks_per_node = 0;                      // 0: all ranks form one node
  std::size_t max_gather_bytes = 1 << 16;      // largest all_gather block per rank
};

// Exit code the launcher reports for a rank it had to kill at its deadline.
inline constexpr int launch_timeout_exit = 124;

namespace detail {

// Layout of the shared area: a header per rank, then two gather slots per rank
// (alternating by round parity, so round k+1 never overwrites round k before
// every rank has read it: no rank enters k+2 before all have finished k).
struct alignas(64) local_rank_state {
  std::uint64_t round;     // all_gather rounds this rank has published
  std::uint64_t bytes[2];  // size of its block, by round parity like the slots
  std::uint32_t alive;     // cleared by the launcher when the rank has exited
};

struct local_area {
  void* base = nullptr;
  std::size_t length = 0;
  int world = 0;
  std::size_t slot_bytes = 0;

  local_rank_state* state(int r) const { return static_cast<local_rank_state*>(base) + r; }
  std::byte* slot(int r, std::uint64_t round) const {
    auto* data = static_cast<std::byte*>(base) + sizeof(local_rank_state) * world;
    return data + (static_cast<std::size_t>(r) * 2 + (round & 1)) * slot_bytes;
  }
};

}  // namespace detail

class local_bootstrap {
 public:
  local_bootstrap(detail::local_area area, int rank, int ranks_per_node, std::string job_tag)
      : area_(area),
        members_(area.world),
        rank_(rank),
        ranks_per_node_(ranks_per_node),
        job_tag_(std::move(job_tag)) {
    for (int r = 0; r < area.world; ++r) members_[r] = r;
  }

  int rank() const { return rank_; }
  int world_size() const { return static_cast<int>(members_.size()); }
  int local_rank() const { return rank_ % ranks_per_node_; }
  int local_world_size() const { return ranks_per_node_; }
  // Unique per launch: transports name their OS resources with it so the
  // launcher can remove whatever a killed rank left behind.
  const std::string& job_tag() const { return job_tag_; }

  // The bootstrap of a new group made of this group's ranks minus `lost`,
  // renumbered in order: how survivors go on after a failure. Every survivor
  // calls it with the same list; this object must not be used afterwards.
  local_bootstrap regroup(std::span<const int> lost) const {
    local_bootstrap next = *this;
    next.members_.clear();
    int node_size = 0;
    std::vector<int> per_node(world_size() / ranks_per_node_, 0);
    for (int r = 0; r < world_size(); ++r) {
      if (std::find(lost.begin(), lost.end(), r) != lost.end()) continue;
      if (r == rank_) next.rank_ = static_cast<int>(next.members_.size());
      next.members_.push_back(members_[r]);
      node_size = ++per_node[r / ranks_per_node_];
    }
    if (std::find(lost.begin(), lost.end(), rank_) != lost.end() || next.members_.empty())
      throw error(rank_, "bootstrap regroup", no_peer, "this rank is in the lost list");
    // Virtual nodes must stay equal in size for the survivors to form nodes.
    for (int n : per_node)
      if (n != node_size && n != 0)
        throw error(rank_, "bootstrap regroup", no_peer,
                    "survivors are spread unevenly over nodes; regroup needs equal nodes");
    next.ranks_per_node_ = node_size;
    next.job_tag_ = job_tag_ + "-g" + std::to_string(++next.generation_);
    return next;
  }

  std::vector<std::byte> all_gather(std::span<const std::byte> mine, deadline dl) {
    if (mine.size() > area_.slot_bytes)
      throw error(rank_, "bootstrap all_gather", no_peer,
                  "block of " + std::to_string(mine.size()) + " bytes exceeds the launcher's " +
                      std::to_string(area_.slot_bytes) +
                      " (local_launch_options::max_gather_bytes)");
    const std::uint64_t round = ++round_;
    const int self = members_[rank_];
    auto* me = area_.state(self);
    if (!mine.empty()) std::memcpy(area_.slot(self, round), mine.data(), mine.size());
    std::atomic_ref<std::uint64_t>(me->bytes[round & 1])
        .store(mine.size(), std::memory_order_relaxed);
    std::atomic_ref<std::uint64_t>(me->round).store(round, std::memory_order_release);

    std::vector<std::byte> out(mine.size() * members_.size());
    for (int r = 0; r < world_size(); ++r) {
      auto* st = area_.state(members_[r]);
      auto published = [&] {
        return std::atomic_ref<std::uint64_t>(st->round).load(std::memory_order_acquire) >= round;
      };
      auto alive = [&] {
        if (std::atomic_ref<std::uint32_t>(st->alive).load(std::memory_order_acquire) == 0)
          throw error(rank_, "bootstrap all_gather", r,
                      "rank exited before joining round " + std::to_string(round));
      };
      if (!detail::spin_wait(published, dl, alive))
        throw error(rank_, "bootstrap all_gather", r,
                    "deadline expired waiting for round " + std::to_string(round));
      const auto bytes =
          std::atomic_ref<std::uint64_t>(st->bytes[round & 1]).load(std::memory_order_relaxed);
      if (bytes != mine.size())
        throw error(rank_, "bootstrap all_gather", r,
                    "block sizes disagree: " + std::to_string(bytes) + " bytes from the peer, " +
                        std::to_string(mine.size()) + " here");
      if (!mine.empty())
        std::memcpy(out.data() + r * mine.size(), area_.slot(members_[r], round), bytes);
    }
    return out;
  }

  void barrier(deadline dl) { all_gather({}, dl); }

 private:
  detail::local_area area_;
  std::vector<int> members_;  // launcher rank of each rank of this group
  int rank_;
  int ranks_per_node_;
  std::string job_tag_;
  std::uint64_t round_ = 0;
  int generation_ = 0;  // how many regroups led to this group
};

static_assert(bootstrap<local_bootstrap>);

// Removes /dev/shm entries whose name starts with "epcomm-<tag>-": what ranks
// killed between creating and unlinking a segment leave behind.
inline void remove_job_segments(const std::string& tag) {
  std::error_code ec;
  const std::string prefix = "epcomm-" + tag + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(prefix)) shm_unlink(("/" + name).c_str());
  }
}

// Runs fn(bootstrap) in `world` forked ranks and returns each rank's exit
// status: fn's return value, 1 for an escaped exception (printed to stderr),
// 128+N for death by signal N, launch_timeout_exit when killed at the deadline.
inline std::vector<int> launch_local(int world, const std::function<int(local_bootstrap&)>& fn,
                                     local_launch_options opt = {}) {
  if (world < 1) throw error(0, "launch_local", no_peer, "world must be >= 1");
  const int per_node = opt.ranks_per_node == 0 ? world : opt.ranks_per_node;
  if (per_node < 1 || world % per_node != 0)
    throw error(0, "launch_local", no_peer, "ranks_per_node must divide world");

  detail::local_area area;
  area.world = world;
  area.slot_bytes = (opt.max_gather_bytes + 63) / 64 * 64;
  area.length = sizeof(detail::local_rank_state) * world + area.slot_bytes * 2 * world;
  area.base = mmap(nullptr, area.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (area.base == MAP_FAILED)
    throw error(0, "launch_local", no_peer, std::string("mmap: ") + std::strerror(errno));
  const std::string tag = std::to_string(getpid()) + "x" + std::to_string(std::random_device{}());

  std::fflush(nullptr);  // children must not flush the parent's buffered output again
  std::vector<pid_t> pids(world, -1);
  for (int r = 0; r < world; ++r) area.state(r)->alive = 1;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        local_bootstrap boot(area, r, per_node, tag);
        code = fn(boot);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      } catch (...) {
        std::fprintf(stderr, "rank %d: unknown exception\n", r);
      }
      std::fflush(nullptr);
      _exit(code);
    }
    if (pid < 0) {
      for (int q = 0; q < r; ++q) kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) waitpid(pids[q], nullptr, 0);
      munmap(area.base, area.length);
      throw error(0, "launch_local", no_peer, std::string("fork: ") + std::strerror(errno));
    }
    pids[r] = pid;
  }

  std::vector<int> codes(world, -1);
  int running = world;
  const auto until = steady::now() + opt.timeout;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < world; ++r) {
        if (pids[r] != pid) continue;
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        std::atomic_ref<std::uint32_t>(area.state(r)->alive).store(0, std::memory_order_release);
        --running;
      }
      continue;
    }
    if (steady::now() >= until) {
      for (int r = 0; r < world; ++r) {
        if (codes[r] != -1) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        codes[r] = launch_timeout_exit;
        std::fprintf(stderr, "launch_local: rank %d killed at the %lld ms deadline\n", r,
                     static_cast<long long>(opt.timeout.count()));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  munmap(area.base, area.length);
  remove_job_segments(tag);
  return codes;
}

}  // namespace epcomm
