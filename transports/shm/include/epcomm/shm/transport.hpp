// Host shared-memory transport: the host analogue of CUDA IPC over NVLink.
// Each rank creates its symmetric buffer as a POSIX shared-memory segment,
// publishes the segment's name through the bootstrap, and maps every peer of
// its node; producers then store straight into peers' buffers. Signals are
// 64-bit counters at the head of each segment, bumped with release and read
// with acquire semantics.
//
// Segments are unlinked as soon as every rank of the node has mapped them, so
// nothing stays in /dev/shm even if a rank dies later; a failed bring-up
// unlinks every name it learned.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "epcomm/core/error.hpp"
#include "epcomm/core/spin_wait.hpp"
#include "epcomm/transport/concepts.hpp"
#include "epcomm/transport/peer_abort.hpp"

namespace epcomm::shm {

class transport {
 public:
  // Collective over `boot`: every rank passes the same `bytes` and
  // `signal_slots`. Only ranks of the same node (bootstrap's local group) are
  // mapped; the others are not peer-mapped.
  template <bootstrap B>
  transport(B& boot, std::size_t bytes, std::size_t signal_slots, deadline dl)
      : rank_(boot.rank()),
        world_(boot.world_size()),
        node_size_(boot.local_world_size()),
        user_slots_(signal_slots),
        data_offset_(signal_bytes(signal_slots + boot.world_size() + 1)),
        length_(data_offset_ + bytes),
        bytes_(bytes),
        peers_(world_, nullptr),
        pids_(world_, 0) {
    std::string tag;
    if constexpr (has_job_tag<B>)
      tag = boot.job_tag();
    else
      tag = std::to_string(getpid()) + "x" + std::to_string(std::random_device{}());
    const std::string name = "/epcomm-" + tag + "-r" + std::to_string(rank_);
    std::vector<std::string> names;
    try {
      map_own(name);
      const auto all = exchange(boot, name, dl, names);
      map_peers(all, names);
      boot.barrier(dl);  // every peer has mapped every segment: the names may go
    } catch (...) {
      for (const auto& n : names) shm_unlink(n.c_str());
      if (own_segment_created_) shm_unlink(name.c_str());
      release();
      throw;
    }
    shm_unlink(name.c_str());
  }

  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  ~transport() { release(); }

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  std::size_t size() const { return bytes_; }

  std::span<std::byte> local_buffer() { return {peers_[rank_] + data_offset_, bytes_}; }

  bool is_peer_mapped(int peer) const { return peers_[peer] != nullptr; }

  // True when `peer`'s process is gone: a peer of this node is asked with
  // kill(pid, 0), which only a process that no longer exists fails with
  // ESRCH. False for this rank, an invalid rank or one alive.
  bool peer_exited(int peer) const {
    return peer >= 0 && peer < world_ && peer != rank_ && kill(pids_[peer], 0) != 0 &&
           errno == ESRCH;
  }

  std::byte* peer_ptr(int peer, std::size_t offset) { return peers_[peer] + data_offset_ + offset; }

  void signal_add(int peer, std::size_t slot, std::uint64_t n) {
    counter(peer, slot).fetch_add(n, std::memory_order_release);
  }

  void wait(std::size_t slot, std::uint64_t expected, deadline dl, wait_site site) {
    auto c = counter(rank_, slot);
    auto ready = [&] { return c.load(std::memory_order_acquire) >= expected; };
    auto alive = [&] {
      if (peer_exited(site.peer))
        throw error(rank_, site.op, site.peer,
                    std::string("peer process exited while waiting for ") + site.what);
      check_aborts(site);
    };
    if (!detail::spin_wait(ready, dl, alive))
      throw error(rank_, site.op, site.peer,
                  std::string("deadline expired waiting for ") + site.what + ": expected " +
                      std::to_string(expected) + ", saw " +
                      std::to_string(c.load(std::memory_order_acquire)));
  }

  // Gives up on the group: this rank's waiters (any thread) and every peer
  // of the node waiting in this transport throw within about a millisecond
  // instead of running into their deadlines. `culprit` is the rank whose
  // failure caused it (no_peer: the caller's own decision), so that peers'
  // errors name the root cause, not the messenger. Safe from any thread and
  // after a failure; the mappings are released by the destructor, once no
  // thread can still be touching them.
  void abort(int culprit = no_peer) {
    std::uint64_t expected = 0;
    counter(rank_, abort_slot())
        .compare_exchange_strong(expected, encode_abort(culprit), std::memory_order_acq_rel);
  }

  bool aborted() const { return counter(rank_, abort_slot()).load(std::memory_order_acquire) != 0; }

  // A barrier over this node's ranks, on the transport's own signal slots.
  void barrier(deadline dl) {
    ++barrier_epoch_;
    const std::size_t base = user_slots_;
    for (int p = 0; p < world_; ++p)
      if (is_peer_mapped(p)) signal_add(p, base + rank_, 1);
    for (int p = 0; p < world_; ++p)
      if (is_peer_mapped(p)) wait(base + p, barrier_epoch_, dl, {"barrier", p, "barrier arrival"});
  }

 private:
  // One cache line per counter, so ranks bumping neighbouring slots do not
  // bounce a line between them.
  static constexpr std::size_t counter_stride = 64;

  // The counter after the user's slots and the barrier's R: nonzero once its
  // owner has aborted.
  std::size_t abort_slot() const { return user_slots_ + world_; }

  void check_aborts(const wait_site& site) const {
    if (counter(rank_, abort_slot()).load(std::memory_order_acquire) != 0)
      throw error(rank_, site.op, no_peer, std::string("aborted while waiting for ") + site.what);
    for (int p = 0; p < world_; ++p) {
      if (p == rank_ || !is_peer_mapped(p)) continue;
      const auto word = counter(p, abort_slot()).load(std::memory_order_acquire);
      if (!is_abort(word)) continue;
      const auto b = proxy::peer_aborted(p, decode_abort(word, world_), rank_, site.what);
      throw error(rank_, site.op, b.peer, b.cause);
    }
  }

  static std::size_t signal_bytes(std::size_t slots) {
    return (slots * counter_stride + 4095) / 4096 * 4096;
  }

  // Counters live in shared memory that const-ness of this object does not
  // own, hence a mutable reference from a const member.
  std::atomic_ref<std::uint64_t> counter(int peer, std::size_t slot) const {
    return std::atomic_ref<std::uint64_t>(
        *reinterpret_cast<std::uint64_t*>(peers_[peer] + slot * counter_stride));
  }

  [[noreturn]] void fail(const std::string& what, int peer = no_peer) const {
    throw error(rank_, "shm transport setup", peer, what + ": " + std::strerror(errno));
  }

  void map_own(const std::string& name) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) fail("shm_open(" + name + ")");
    own_segment_created_ = true;
    if (ftruncate(fd, static_cast<off_t>(length_)) != 0) {
      close(fd);
      fail("ftruncate(" + name + ", " + std::to_string(length_) + ")");
    }
    peers_[rank_] = map_fd(fd, name, rank_);
  }

  std::byte* map_fd(int fd, const std::string& name, int peer) const {
    void* p = mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) fail("mmap(" + name + ")", peer);
    return static_cast<std::byte*>(p);
  }

  struct announcement {
    char name[96];
    std::int64_t pid;
    std::uint64_t length;
  };

  template <bootstrap B>
  std::vector<announcement> exchange(B& boot, const std::string& name, deadline dl,
                                     std::vector<std::string>& names) {
    announcement mine{};
    std::strncpy(mine.name, name.c_str(), sizeof(mine.name) - 1);
    mine.pid = getpid();
    mine.length = length_;
    const auto bytes = boot.all_gather(std::as_bytes(std::span(&mine, 1)), dl);
    std::vector<announcement> all(world_);
    std::memcpy(all.data(), bytes.data(), bytes.size());
    for (const auto& a : all) names.emplace_back(a.name);
    return all;
  }

  void map_peers(const std::vector<announcement>& all, const std::vector<std::string>& names) {
    const int node = rank_ / node_size_;
    for (int p = 0; p < world_; ++p) {
      pids_[p] = static_cast<pid_t>(all[p].pid);
      if (p == rank_ || p / node_size_ != node) continue;
      if (all[p].length != length_)
        throw error(rank_, "shm transport setup", p,
                    "buffer sizes disagree: " + std::to_string(all[p].length) + " bytes there, " +
                        std::to_string(length_) + " here");
      const int fd = shm_open(names[p].c_str(), O_RDWR, 0);
      if (fd < 0) fail("shm_open(" + names[p] + ")", p);
      peers_[p] = map_fd(fd, names[p], p);
    }
  }

  void release() {
    for (auto& p : peers_) {
      if (p != nullptr) munmap(p, length_);
      p = nullptr;
    }
  }

  int rank_;
  int world_;
  int node_size_;
  std::size_t user_slots_;
  std::size_t data_offset_;
  std::size_t length_;
  std::size_t bytes_;
  std::vector<std::byte*> peers_;
  std::vector<pid_t> pids_;
  std::uint64_t barrier_epoch_ = 0;
  bool own_segment_created_ = false;
};

static_assert(peer_mapped_transport<transport>);
static_assert(has_peer_exit<transport>);
static_assert(has_abort<transport>);

}  // namespace epcomm::shm
