// What the RMA transports (libfabric, UCX) share above their providers: the
// rank's identity and sizes, the mutex that serializes their calls, the
// numbered operations, the first failure, this rank's abort, the checks every
// call makes (worded alike), and the bounded wait on a signal counter. Each
// transport derives from it and keeps what is its own: the data path, the
// counters, how a peer's abort or loss shows, and teardown.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/failure_latch.hpp"
#include "epcomm/core/spin_wait.hpp"
#include "epcomm/transport/concepts.hpp"
#include "epcomm/transport/peer_abort.hpp"
#include "epcomm/transport/process_identity.hpp"
#include "epcomm/transport/rma/completion_window.hpp"
#include "epcomm/transport/rma/lost_peers.hpp"

namespace epcomm::proxy {

class rma_transport_base {
 public:
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  std::size_t size() const { return bytes_; }
  // "<transport>/<provider or TLS>", for test and error messages.
  const std::string& name() const { return name_; }

  // Operations [0, completed()) are all complete.
  std::uint64_t completed() const {
    std::lock_guard lock(mu_);
    return tickets_.watermark();
  }

  bool aborted() const { return abort_word_.load(std::memory_order_acquire) != 0; }

  // Rank `peer` is known gone: its process exited on this host (by pid) or,
  // once the transport masks lost peers, the fabric failed it.
  bool peer_exited(int peer) const {
    if (peer < 0 || peer >= world_ || peer == rank_) return false;
    return lost_.lost(peer) || exited(processes_[peer], self_);
  }

  // The lowest rank known gone (peer_exited), or no_peer.
  int first_exited_peer() const {
    for (int p = 0; p < world_; ++p)
      if (peer_exited(p)) return p;
    return no_peer;
  }

 protected:
  rma_transport_base(int rank, int world, std::size_t bytes, std::size_t user_slots,
                     std::chrono::milliseconds timeout, std::string name)
      : rank_(rank),
        world_(world),
        bytes_(bytes),
        user_slots_(user_slots),
        timeout_(timeout),
        name_(std::move(name)),
        processes_(static_cast<std::size_t>(world)),
        lost_(world) {}

  // abort()'s culprit, or no_peer when it names no rank of the group.
  int valid_culprit(int culprit) const {
    return culprit < no_peer || culprit >= world_ ? no_peer : culprit;
  }

  // Records `word` (non-zero) as what this rank's abort sends; false when an
  // earlier abort() did already: only the first call counts.
  bool claim_abort(std::uint64_t word) {
    std::uint64_t none = 0;
    return abort_word_.compare_exchange_strong(none, word, std::memory_order_acq_rel);
  }
  // The word claim_abort() recorded; 0 before any abort().
  std::uint64_t abort_word() const { return abort_word_.load(std::memory_order_acquire); }

  // Teardown waits long for a healthy group and briefly after a failure or
  // an abort, when a lost peer will never answer.
  deadline teardown_deadline() const {
    const auto budget = failure_.failed() || aborted() ? std::chrono::milliseconds(1'000)
                                                       : std::chrono::milliseconds(5'000);
    return deadline::after(std::min(timeout_, budget));
  }

  // Runs f, which may fail with an error that fail() has latched already:
  // the caller carries on (with the other peers, with teardown, with
  // serving) and later calls report the failure.
  template <class F>
  static void suppress_latched(F&& f) {
    try {
      f();
    } catch (const error&) {
      // Latched; what the caller does next does not depend on it.
    }
  }

  // Takes `lock` (over mu_) by dl; false when it stays held that long. A
  // proxy thread can be stuck inside a provider call for good (a lock in
  // shared memory that a dead peer held, libfabric's shm provider), holding
  // mu_: waits and teardown then go on without it instead of hanging.
  static bool lock_by(std::unique_lock<std::mutex>& lock, const deadline& dl) {
    while (!lock.try_lock()) {
      if (dl.expired()) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }

  // The barrier both transports run, on their own slots after the user's
  // (rank p's arrival at user_slots_ + p): under mu_ (taken by dl), this
  // rank counts its own arrival (self.add_local) and has every other rank
  // signalled after its earlier writes there (self.post_barrier_arrival);
  // then it waits for every rank's (self.wait). These signals are not
  // numbered operations.
  template <class Self>
  void run_barrier(Self& self, const deadline& dl) {
    std::uint64_t epoch;
    {
      std::unique_lock lock(mu_, std::defer_lock);
      if (!lock_by(lock, dl)) {
        // A peer that exited is why, when one has: the provider may be held
        // on a lock it held (libfabric's shm provider).
        const int gone = first_exited_peer();
        fail("barrier", gone,
             std::string(gone == no_peer ? "" : "peer process exited; ") +
                 "deadline expired while the fabric provider was held up");
      }
      check_usable("barrier");
      epoch = ++barrier_epoch_;
      for (int p = 0; p < world_; ++p) {
        if (p == rank_)
          self.add_local(user_slots_ + rank_, 1);
        else
          self.post_barrier_arrival(p, user_slots_ + rank_);
      }
    }
    for (int p = 0; p < world_; ++p)
      self.wait(user_slots_ + p, epoch, dl, {"barrier", p, "barrier arrival"});
  }

  // abort()'s fan-out, the same over both transports: the first call
  // records the word naming `culprit` (transport/peer_abort.hpp); then,
  // under `mu`, post(p, word) for every peer not known gone, and one
  // progress() for the providers that send only when progressed. The writes
  // are posted, not awaited; a failure of either is latched, not thrown.
  template <class Post, class Progress>
  void post_abort_to_peers(int culprit, std::mutex& mu, Post&& post, Progress&& progress) {
    const std::uint64_t word = encode_abort(valid_culprit(culprit));
    if (!claim_abort(word)) return;
    std::lock_guard lock(mu);
    for (int p = 0; p < world_; ++p)
      if (p != rank_ && !peer_exited(p)) suppress_latched([&] { post(p, word); });
    suppress_latched(progress);
  }

  // Progresses, swallowing latched errors, until done() or dl.
  template <class Done, class Progress>
  static void drain(Done&& done, const deadline& dl, Progress&& progress_locked) {
    while (!done() && !dl.expired()) suppress_latched(progress_locked);
  }

  [[noreturn]] void fail(const char* op, int peer, const std::string& cause) {
    const error e(rank_, op, peer, cause + " (" + name_ + ")");
    failure_.latch(e);  // later calls report the first failure; this one reports its own
    throw e;
  }

  // A wait for site.peer, which is gone, fails: the transport with it, unless
  // lost peers are masked, when the loss is the caller's to handle and the
  // transport goes on with the others (the error is not latched).
  [[noreturn]] void fail_gone(const wait_site& site) {
    const std::string cause = lost_.waiting_failed(site.peer, site.what);
    if (lost_.masking()) throw error(rank_, site.op, site.peer, cause + " (" + name_ + ")");
    fail(site.op, site.peer, cause);
  }

  // While masking, lose(p) for each peer not yet lost whose process has
  // exited on this host, looking about once a millisecond: an operation to
  // such a peer may never complete, nor fail. mu_ held.
  template <class Lose>
  void find_exited_peers(Lose&& lose) {
    const auto now = steady::now();
    if (now < next_exit_scan_) return;
    next_exit_scan_ = now + std::chrono::milliseconds(1);
    for (int p = 0; p < world_; ++p)
      if (p != rank_ && !lost_.lost(p) && exited(processes_[p], self_)) lose(p);
  }

  // After abort() every call fails, saying so; after a failure, with its error.
  void check_usable(const char* op) const {
    if (aborted()) throw error(rank_, op, no_peer, "the transport was aborted (" + name_ + ")");
    failure_.rethrow();
  }

  void check_own_abort(const wait_site& site) const {
    if (aborted())
      throw error(rank_, site.op, no_peer,
                  std::string("aborted while waiting for ") + site.what + " (" + name_ + ")");
  }

  void check_peer(const char* op, int peer) {
    check_usable(op);
    if (peer < 0 || peer >= world_)
      fail(op, no_peer,
           "peer " + std::to_string(peer) + " is outside [0, " + std::to_string(world_) + ")");
  }
  void check_op(const char* op, int peer, std::size_t local_off, std::size_t remote_off,
                std::size_t bytes) {
    check_peer(op, peer);
    if (bytes > bytes_ || local_off > bytes_ - bytes || remote_off > bytes_ - bytes)
      fail(op, peer,
           std::to_string(bytes) + " bytes from offset " + std::to_string(local_off) + " to " +
               std::to_string(remote_off) + " overrun the " + std::to_string(bytes_) +
               "-byte buffer");
  }
  void check_slot(const char* op, int peer, std::size_t slot) {
    if (slot >= user_slots_)
      fail(op, peer,
           "signal slot " + std::to_string(slot) + " is outside [0, " +
               std::to_string(user_slots_) + ")");
  }

  // Waits until count() >= expected for counter `slot` (of `slots`), with the
  // deadline dl. Progresses the transport itself whenever mu_ is free, so
  // that waiting works with or without a proxy thread. The transport says
  // when the count can never arrive:
  //   on_progress_error(), mu_ held: progress failed; throws a more telling
  //     error than that failure when it has one (a peer's abort naming the
  //     root cause, the awaited peer's exit);
  //   watch(), about once a millisecond: throws once a peer aborted or the
  //     awaited one is gone.
  template <class Count, class Progress, class OnProgressError, class Watch>
  void wait_signal(std::size_t slot, std::size_t slots, std::uint64_t expected, const deadline& dl,
                   const wait_site& site, Count&& count, Progress&& progress_locked,
                   OnProgressError&& on_progress_error, Watch&& watch) {
    if (slot >= slots)
      throw error(rank_, site.op, site.peer,
                  "wait on signal slot " + std::to_string(slot) + " of " + std::to_string(slots));
    check_own_abort(site);
    auto ready = [&] {
      if (count() >= expected) return true;
      if (std::unique_lock lock(mu_, std::try_to_lock); lock.owns_lock()) {
        try {
          failure_.rethrow();
          progress_locked();
        } catch (const error&) {
          on_progress_error();
          throw;
        }
      }
      return count() >= expected;
    };
    auto alive = [&] {
      check_own_abort(site);
      watch();
      failure_.rethrow();
    };
    if (!detail::spin_wait(ready, dl, alive))
      throw error(rank_, site.op, site.peer,
                  std::string("deadline expired waiting for ") + site.what + ": expected " +
                      std::to_string(expected) + ", saw " + std::to_string(count()) + " (" + name_ +
                      ")");
  }

  // For a provider that raises counters inside its own progress with no
  // release the C++ model or ThreadSanitizer knows of (UCX's emulated
  // atomics: a plain atomic add after copying the data in): progress runs
  // under mu_, so taking it after a wait orders what that progress wrote
  // before this rank reads it. A provider held up for good orders nothing
  // any more: then it returns without the lock. Not for a transport whose
  // counters move only by its own release adds (libfabric): there a thread
  // stuck in the provider on a lock a dead peer held would cost each wait
  // this bound, silently, and with it the call's deadline.
  void order_after_progress() {
    std::unique_lock after_progress(mu_, std::defer_lock);
    lock_by(after_progress, deadline::after(std::min(timeout_, std::chrono::milliseconds(1'000))));
  }

  const int rank_;
  const int world_;
  const std::size_t bytes_;
  const std::size_t user_slots_;
  const std::chrono::milliseconds timeout_;  // bound on the transport's own waits
  std::string name_;                         // completed by the transport once it knows more

  mutable std::mutex mu_;  // serializes every call that touches the provider
  failure_latch failure_;
  completion_window tickets_;  // numbered operations
  const process_identity self_ = this_process();
  std::vector<process_identity> processes_;  // every rank's, from the bootstrap exchange
  lost_peers lost_;                          // peers lost while masking (has_lost_peer_masking)

 private:
  std::atomic<std::uint64_t> abort_word_{0};
  steady::time_point next_exit_scan_{};  // find_exited_peers() looks again from then on
  std::uint64_t barrier_epoch_ = 0;      // barriers run so far (run_barrier), mu_ held
};

}  // namespace epcomm::proxy
