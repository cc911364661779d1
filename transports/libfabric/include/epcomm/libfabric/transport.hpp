// libfabric transport: one FI_EP_RDM endpoint per rank, one-sided writes into
// every peer's registered symmetric buffer, counting signals carried as
// remote CQ data. Written for EFA (SRD: reliable, unordered) and verified here
// on tcp;ofi_rxm and shm; nothing relies on write ordering:
//
//   put         fi_writemsg with FI_DELIVERY_COMPLETE, split at max_write;
//   signal      an 8-byte fi_writedata whose CQ data is (slot, n); the target's
//               progress adds n to its counter when the completion arrives. It
//               is posted only once every earlier write to that peer has
//               completed (delivery complete: visible at the target), so the
//               target learns "region complete" by counting, never from a last
//               byte;
//   put_signal  when nothing else is in flight to the peer and the bytes fit in
//               one write, the data write itself carries the CQ data (one
//               message); otherwise put, then signal as above;
//   flush       completes once every earlier write to the peer has completed;
//   self        memcpy and a local counter add.
//
// Rails (nic_choice.hpp): a rank may drive several devices, or several
// endpoints of one, each with its own completion queue, address vector and
// registrations of both regions. A put starts on the next rail in turn and
// one of at least options::stripe_min bytes is cut into one piece per rail
// (each split at max_write as before); signals go on rail 0. The receiver
// reads every rail's queue and counts signals the same wherever they land,
// and a signal still waits for every earlier write to the peer, on any
// rail: striping needs no ordering between rails.
//
// A write the provider refuses with -FI_EAGAIN waits in a per-peer queue and
// is posted again by progress(): no call blocks on a peer that stops
// draining. Completion errors are read with fi_cq_readerr and reported, with
// fi_strerror's and the provider's text, as an epcomm::error naming the peer.
//
// Two regions are registered (fi_mr_regattr): a host control region (the
// scratch line signal writes carry, the abort words) and the symmetric data
// region, host memory or, for producers on the GPU, CUDA device memory
// (options::memory; FI_HMEM with iface FI_HMEM_CUDA, asked of the provider
// only then). The registrations honour the provider's mr_mode (FI_MR_LOCAL,
// FI_MR_VIRT_ADDR, FI_MR_ALLOCATED, FI_MR_PROV_KEY, FI_MR_ENDPOINT, and
// FI_MR_HMEM for device memory); the abort lane registers the control region
// once more for its endpoint. Keys and addresses are exchanged through
// the bootstrap, and the address vectors are
// filled in rank order; connections (the abort lane's too) are made at
// construction. Remote CQ
// data is packed into 32 bits, the most EFA carries. Calls are serialized by
// a mutex, so wait() and barrier() may run while a proxy thread issues
// operations and progresses.
//
// Over the shm provider each endpoint's file in /dev/shm carries an epcomm
// name, and the files of dead processes are removed at every start and close
// (shm_regions.hpp): a rank that is killed leaves nothing behind for long.
//
// abort() gives up on the group. Each peer gets one 8-byte write of this
// rank's abort word (transport/peer_abort.hpp) into its abort-word array, carrying remote
// CQ data on the peer's abort slot for this rank: the count says the word has
// landed, the word names the rank to blame. The writes are posted, never
// awaited, so a peer that stopped draining cannot hold abort() up. They go
// through an endpoint of their own (the abort lane: its own completion queue,
// address vector and registration of the control region), so that they
// never queue behind the data: over the shm provider a dead sender's large
// write can hold up every command behind it in a receiver's queue, and the
// survivors' aborts with them. The lane has a lock of its own too: a rank
// that dies inside a write to a peer over the shm provider leaves that peer's
// queue locked, and a survivor's thread writing there spins for good holding
// the data path's mutex. Waits then still read the lane (a peer's abort names
// the root cause), blame a peer that exited once the data path has been held
// up that long, and teardown leaves the provider to the process's end
// (abandoned_transports()) instead of hanging.
//
// A peer that is lost fails the transport, unless mask_lost_peers() was
// called (an engine that masks lost ranks): then a peer whose process exited
// on this host (its pid, looked at about once a millisecond while progressing)
// or to which the fabric failed a write (a refused post, a completion error)
// is lost alone. What is queued, in flight or later issued to it counts
// complete without moving, and only a wait for it fails.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <stdlib.h>  // realpath

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "epcomm/core/error.hpp"
#include "epcomm/libfabric/nic_choice.hpp"
#include "epcomm/libfabric/shm_regions.hpp"
#include "epcomm/transport/concepts.hpp"
#include "epcomm/transport/peer_abort.hpp"
#include "epcomm/transport/process_identity.hpp"
#include "epcomm/transport/rma/base.hpp"
#include "epcomm/transport/rma/completion_window.hpp"
#include "epcomm/transport/rma/symmetric_memory.hpp"

namespace epcomm::libfabric {

struct options {
  // Provider as fi_info names it ("efa", "tcp;ofi_rxm", "shm"); empty:
  // libfabric's first choice, which FI_PROVIDER narrows.
  std::string provider;
  // Largest single write; 0 means the provider's ep_attr->max_msg_size.
  // Larger puts are split into several writes.
  std::size_t max_write = 0;
  // Bound on draining at teardown. EPCOMM_TIMEOUT_MS overrides it.
  std::chrono::milliseconds timeout = default_timeout;
  // Where local_buffer() lives. CUDA device memory (EPCOMM_WITH_CUDA) needs a
  // provider with FI_HMEM; only CUDA producers can then fill it.
  proxy::memory_placement memory{};
  // Endpoints this rank drives (rails), up to max_rails; 0: one per device
  // nic_choice.hpp finds for the rank (one where none is on the PCI bus,
  // or EPCOMM_FI_DOMAIN names them). EPCOMM_FI_RAILS overrides it. Every
  // rank must end up with as many.
  std::size_t rails = 0;
  // Puts of at least this many bytes are striped over the rails.
  std::size_t stripe_min = std::size_t{128} << 10;
};

inline constexpr std::size_t max_rails = 8;

// Remote CQ data: bits 0-19 the signal slot, bits 20-31 the increment.
inline constexpr int signal_slot_bits = 20;
inline constexpr std::size_t max_signal_slots = std::size_t{1} << signal_slot_bits;
inline constexpr std::uint64_t max_signal_increment = (std::uint64_t{1} << 12) - 1;

constexpr std::uint64_t encode_signal(std::size_t slot, std::uint64_t n) {
  return static_cast<std::uint64_t>(slot) | (n << signal_slot_bits);
}
constexpr std::size_t signal_slot_of(std::uint64_t data) { return data & (max_signal_slots - 1); }
constexpr std::uint64_t signal_increment_of(std::uint64_t data) {
  return (data >> signal_slot_bits) & max_signal_increment;
}

class transport : public proxy::rma_transport_base {
  friend class proxy::rma_transport_base;  // run_barrier's hooks

 public:
  using options_type = options;  // for generic code that places the buffer (cuda/)

  // Collective over `boot`: every rank passes the same `bytes` and
  // `signal_slots` and gets the same provider.
  template <bootstrap B>
  transport(B& boot, std::size_t bytes, std::size_t signal_slots, deadline dl,
            const options& opt = {})
      : rma_transport_base(boot.rank(), boot.world_size(), bytes, signal_slots,
                           effective_timeout(opt.timeout), "libfabric"),
        counters_(signal_slots + 4 * static_cast<std::size_t>(boot.world_size())),
        peers_(boot.world_size()) {
    if (counters_.size() > max_signal_slots)
      throw error(rank_, "libfabric setup", no_peer,
                  std::to_string(counters_.size()) + " signal slots exceed the " +
                      std::to_string(max_signal_slots) + " that remote CQ data can name");
    try {
      allocate_memory(opt.memory);  // first: device memory may be refused before any fabric call
      open_endpoints(opt, boot.local_rank(), boot.local_world_size());
      register_memory();
      exchange(boot, dl);
      boot.barrier(dl);  // every peer's endpoint, registration and addresses are ready
      connect_in_order(dl);
    } catch (...) {
      close();
      throw;
    }
  }

  // The libfabric domain (network device) rail `rail` drives: see nic_choice.hpp.
  const std::string& domain(std::size_t rail = 0) const { return rails_.at(rail).domain_name; }
  std::size_t rails() const { return rails_.size(); }
  // Data writes issued on each rail since construction.
  std::vector<std::uint64_t> rail_writes() const {
    std::lock_guard lock(mu_);
    std::vector<std::uint64_t> out;
    for (const rail& r : rails_) out.push_back(r.writes);
    return out;
  }

  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  // Waits (bounded) for this rank's writes to complete, then closes. After a
  // failure it still drains briefly: healthy peers may be waiting for what is
  // already queued to them, while what was bound for a lost peer never leaves.
  // When the data path stays held (a thread stuck in the provider), the
  // provider's objects are left open: closing them would wait on it too.
  ~transport() {
    const deadline dl = teardown_deadline();
    std::unique_lock lock(mu_, std::defer_lock);
    if (!lock_by(lock, dl)) {
      leave_open();
      return;
    }
    drain([&] { return !busy(); }, dl, [&] { progress_locked(); });
    lock.unlock();
    close();
  }

  // See has_leave_open: the provider's objects stay open, and only this
  // rank's files of the shm provider (and dead processes') are unlinked.
  void leave_open() noexcept {
    abandoned_.fetch_add(1, std::memory_order_relaxed);
    if (over_shm()) {
      for (const std::string& a : shm_addresses_) shm_regions::remove_own(a);
      shm_regions::remove_orphans();
    }
  }

  // Transports of this process whose teardown found the data path held up
  // for good and left the provider open (a bounded leak per lost peer).
  static std::size_t abandoned_transports() { return abandoned_.load(std::memory_order_relaxed); }

  std::size_t max_write() const { return max_write_; }

  // Device memory when options::memory asked for it: then only kernels may
  // touch it (local_buffer_on_device()).
  std::span<std::byte> local_buffer() { return {data(), bytes_}; }
  bool local_buffer_on_device() const { return memory_[data_region].on_device(); }

  // The words wait() reads, one per signal slot, in host memory: what a
  // producer that waits by itself (a proxy::channel in a kernel, through a
  // mapping of them) polls. Only this transport writes them.
  std::span<const std::uint64_t> signal_counters() const { return {counters_.data(), user_slots_}; }

  void put(int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes) {
    std::lock_guard lock(mu_);
    check_op("put", peer, local_off, remote_off, bytes);
    if (peer == rank_) {
      memory_[data_region].copy_within(rank_, "put", remote_off, local_off, bytes);
      tickets_.open(0);
      return;
    }
    const std::uint64_t ticket = tickets_.open(chunks(bytes));
    post_writes(peer, local_off, remote_off, bytes, ticket);
  }

  void put_signal(int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes,
                  std::size_t slot, std::uint64_t n) {
    std::lock_guard lock(mu_);
    check_op("put_signal", peer, local_off, remote_off, bytes);
    check_slot("put_signal", peer, slot);
    if (peer == rank_) {
      memory_[data_region].copy_within(rank_, "put_signal", remote_off, local_off, bytes);
      add_local(slot, n);
      tickets_.open(0);
      return;
    }
    auto& p = peers_[peer];
    if (bytes > 0 && chunks(bytes) == 1 && p.writes.idle() && n <= max_signal_increment) {
      // Nothing earlier is in flight to this peer: the data write itself
      // carries the signal, and the target counts it when it lands.
      const std::uint64_t ticket = tickets_.open(1);
      post_write(peer, local_off, remote_off, bytes, ticket, encode_signal(slot, n), take_rail(1));
      return;
    }
    const std::uint64_t ticket = tickets_.open(chunks(bytes) + signal_writes(n));
    post_writes(peer, local_off, remote_off, bytes, ticket);
    defer(peer, {deferred::kind::signal, slot, n, ticket, p.writes.opened()});
  }

  // Adds n to `slot` of `peer` once every write issued to it so far is visible there.
  void signal_add(int peer, std::size_t slot, std::uint64_t n) {
    std::lock_guard lock(mu_);
    check_peer("signal_add", peer);
    check_slot("signal_add", peer, slot);
    if (peer == rank_) {
      add_local(slot, n);
      tickets_.open(0);
      return;
    }
    const std::uint64_t ticket = tickets_.open(signal_writes(n));
    defer(peer, {deferred::kind::signal, slot, n, ticket, peers_[peer].writes.opened()});
  }

  void flush(int peer) {
    std::lock_guard lock(mu_);
    check_peer("flush", peer);
    if (peer == rank_) {
      tickets_.open(0);
      return;
    }
    const std::uint64_t ticket = tickets_.open(1);
    defer(peer, {deferred::kind::flush, 0, 0, ticket, peers_[peer].writes.opened()});
  }

  // Fails, like a wait, once a peer has aborted: the proxy then stops and
  // its producers learn why, even when what they wait for is their own
  // operations (which an aborted peer may never acknowledge). While a
  // thread calls it (or serve()) waits leave the data path to it.
  void progress() {
    note_driven();
    std::lock_guard lock(mu_);
    check_usable("libfabric progress");
    progress_locked();
    if (abort_notices_.load(std::memory_order_acquire) != 0)
      check_peer_aborts({"libfabric progress", no_peer, "its operations to complete"});
  }

  // Progress that issues nothing new and throws nothing (errors are
  // latched), for a proxy whose work has ended in a failure or an abort:
  // peers' writes to this rank still complete (rxm acknowledges them only
  // when progressed), so their teardown is not held up.
  void serve() {
    note_driven();
    std::lock_guard lock(mu_);
    suppress_latched([&] { progress_locked(); });
  }

  void wait(std::size_t slot, std::uint64_t expected, deadline dl, wait_site site) {
    std::optional<steady::time_point> held_since;  // mu_ seen held at every look since
    wait_signal(
        slot, counters_.size(), expected, dl, site, [&] { return counter(slot); },
        [&] {
          // A proxy thread that drives the provider is its only caller on
          // the data path: a waiter stuck in the provider could not fail.
          if (!driven()) progress_locked();
        },
        [&] {
          // Aborts first: the rank that relayed an abort may have exited since.
          check_peer_aborts(site);
          blame_if_gone(site);
        },
        [&] {
          read_lane();
          check_peer_aborts(site);
          blame_if_gone(site);
          if (std::unique_lock lock(mu_, std::try_to_lock); lock.owns_lock()) {
            held_since.reset();
            return;
          }
          const auto now = steady::now();
          if (!held_since) held_since = now;
          if (now - *held_since >= held_up_limit) blame_exit_while_held_up(site);
        });
  }

  // Every rank signals every other on the transport's own slots, after its
  // earlier writes to that rank; these signals are not numbered operations.
  void barrier(deadline dl) { run_barrier(*this, dl); }

  // Gives up on the group: this rank's waiters (any thread; the proxy's
  // progress() too) throw within about a millisecond, every later call
  // fails, and every peer not known to have exited is sent this rank's abort
  // word, so that a peer waiting in this transport throws an error naming
  // `culprit` (the rank whose failure caused the abort; no_peer: the caller's
  // own decision). The writes are posted, not awaited. Safe from any thread
  // and after a failure; only the first call counts.
  void abort(int culprit = no_peer) {
    // Hands the writes to providers that send only when progressed.
    post_abort_to_peers(
        culprit, lane_mu_, [&](int p, std::uint64_t word) { post_abort(p, word); },
        [&] { progress_lane(); });
  }

  // See has_lost_peer_masking: a lost peer's queued and later writes count
  // complete without moving, and so do those in flight to it (a completion
  // the provider still reports for one is then only taken back). Refused
  // over the shm provider, which after any peer's exit refuses the
  // survivors' writes to each other too (-FI_EAGAIN until teardown).
  void mask_lost_peers() {
    std::lock_guard lock(mu_);
    if (over_shm())
      throw error(rank_, "libfabric setup", no_peer,
                  "mask_lost_ranks needs a provider that keeps serving the survivors once a peer "
                  "has exited; the shm provider then refuses their writes to each other until "
                  "teardown (tcp;ofi_rxm and efa do not) (" +
                      name_ + ")");
    lost_.start_masking();
  }

 private:
  static constexpr std::uint64_t no_ticket = std::numeric_limits<std::uint64_t>::max();
  // How long a waiter finds the data path held at every look before it takes
  // the provider for stuck (blame_exit_while_held_up). A call's hold is
  // microseconds; a large copy over the shm provider a few milliseconds.
  static constexpr std::chrono::milliseconds held_up_limit{200};
  inline static std::atomic<std::size_t> abandoned_{0};
  // The control region starts with a scratch line: signal writes carry their
  // meaning in CQ data and write these 8 bytes, which nobody reads. Then one
  // abort word per rank (what that rank's abort wrote here; this rank's own
  // is the source of its abort writes).
  static constexpr std::size_t scratch_bytes = 64;

  // The two registered regions, indices into local_ and remote_region arrays.
  static constexpr int control_region = 0;
  static constexpr int data_region = 1;

  // One endpoint of this rank's, on the device nic_choice.hpp gave it, with
  // what it needs of its own (the abort lane's objects live in rail 0's
  // domain).
  struct rail {
    fi_info* info = nullptr;
    std::string domain_name;
    fid_fabric* fabric = nullptr;
    fid_domain* domain = nullptr;
    fid_cq* cq = nullptr;
    fid_av* av = nullptr;
    fid_ep* ep = nullptr;
    fid_mr* mr[2] = {};  // its registrations of control_region and data_region
    void* desc[2] = {};
    std::uint64_t writes = 0;  // data writes issued on it
  };
  // Where a peer's region is: its key, and its address when FI_MR_VIRT_ADDR
  // (else 0: offsets are from the region's start).
  struct remote_region {
    std::uint64_t key = 0;
    std::uint64_t base = 0;
  };

  // A signal or flush held back until every write issued to the peer before
  // it has completed there.
  struct deferred {
    enum class kind { signal, flush } what;
    std::size_t slot;
    std::uint64_t n;
    std::uint64_t ticket;  // no_ticket for the barrier's signals
    std::uint64_t after_writes;
  };

  // One fabric write, kept until it completes; the provider may use ctx.
  struct posted {
    fi_context2 ctx;
    int peer;
    std::uint64_t ticket;
    std::uint64_t write;  // index in the peer's write window, or no_ticket for a signal
    int region;           // control_region or data_region, on both sides
    std::size_t rail;     // on the data path: the rail it goes by
    void* local;
    std::uint64_t remote_off;  // from the start of the peer's region
    std::size_t bytes;
    std::optional<std::uint64_t> cq_data;
    bool on_abort_lane;  // posted through the abort lane's endpoint
    bool live;           // acquired and not yet released
    bool abandoned;      // counted complete when its peer was lost (lose_peer)
  };

  // Operations posted and not yet completed: the provider holds their
  // contexts until then. The data path's are under mu_, the lane's under
  // lane_mu_.
  struct op_pool {
    std::vector<std::unique_ptr<posted>> all;
    std::vector<posted*> free;
    std::size_t outstanding = 0;
    std::size_t abandoned = 0;    // of the outstanding ones
    std::vector<std::size_t> to;  // the outstanding ones by peer

    posted* acquire(int peer, std::uint64_t ticket, std::uint64_t write) {
      if (free.empty()) {
        all.push_back(std::make_unique<posted>());
        free.push_back(all.back().get());
      }
      posted* op = free.back();
      free.pop_back();
      *op = posted{};
      op->peer = peer;
      op->ticket = ticket;
      op->write = write;
      op->live = true;
      ++outstanding;
      if (to.size() <= static_cast<std::size_t>(peer))
        to.resize(static_cast<std::size_t>(peer) + 1);
      ++to[static_cast<std::size_t>(peer)];
      return op;
    }
    void release(posted* op) {
      op->live = false;
      free.push_back(op);
      --outstanding;
      --to[static_cast<std::size_t>(op->peer)];
    }
    std::size_t outstanding_to(int peer) const {
      return static_cast<std::size_t>(peer) < to.size() ? to[static_cast<std::size_t>(peer)] : 0;
    }
  };

  // A peer's endpoint on one rail, and its regions as that rail registered them.
  struct peer_rail {
    fi_addr_t addr = FI_ADDR_UNSPEC;
    remote_region regions[2];
  };

  struct peer_state {
    peer_rail rails[max_rails];
    fi_addr_t abort_addr = FI_ADDR_UNSPEC;  // the peer's abort lane
    remote_region abort_words;              // its control region, as its abort lane registered it
    proxy::completion_window writes;        // every data write to this peer, in issue order
    std::deque<deferred> held;
    std::deque<posted*> backlog;  // refused with -FI_EAGAIN, posted again in order
    // When the exit scan first found its process gone (not masking).
    std::optional<steady::time_point> exit_seen;
  };

  struct rail_announcement {
    std::uint8_t addr[232];
    std::uint64_t addrlen;
    remote_region regions[2];
  };
  struct announcement {
    rail_announcement rails[max_rails];
    std::uint64_t rail_count;
    std::uint8_t abort_addr[232];
    std::uint64_t abort_addrlen;
    remote_region abort_words;
    std::uint64_t bytes;
    proxy::process_identity process;
  };

  std::byte* data() { return memory_[data_region].data(); }
  std::uint64_t* abort_words() const {
    return reinterpret_cast<std::uint64_t*>(memory_[control_region].data() + scratch_bytes);
  }

  // Counter slots after the user's: barrier arrivals, connection hellos,
  // abort notices, one of each per rank.
  std::size_t hello_slot(int peer) const { return user_slots_ + world_ + peer; }
  std::size_t abort_slot(int peer) const { return user_slots_ + 2 * world_ + peer; }
  std::size_t lane_hello_slot(int peer) const { return user_slots_ + 3 * world_ + peer; }

  std::uint64_t counter(std::size_t slot) const {
    return std::atomic_ref<const std::uint64_t>(counters_[slot]).load(std::memory_order_acquire);
  }
  void add_local(std::size_t slot, std::uint64_t n) {
    std::atomic_ref<std::uint64_t>(counters_[slot]).fetch_add(n, std::memory_order_release);
  }
  // The barrier's signal to `peer`, held back until this rank's earlier
  // writes there have completed. mu_ held.
  void post_barrier_arrival(int peer, std::size_t slot) {
    defer(peer, {deferred::kind::signal, slot, 1, no_ticket, peers_[peer].writes.opened()});
  }

  // A proxy thread drives the provider: it called progress() or serve()
  // lately (it does every 50 us or so, every 1 ms once failed). A thread
  // stuck in the provider holds mu_, so a waiter that finds mu_ free and no
  // driver (there was none, or its engine is gone) may progress itself.
  static constexpr std::chrono::milliseconds driver_gap{10};
  void note_driven() {
    driven_at_.store(steady::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  bool driven() const {
    const steady::time_point at{steady::duration(driven_at_.load(std::memory_order_relaxed))};
    return steady::now() - at < driver_gap;
  }

  // A peer that exited on this host, or one lost while masking, fails the
  // wait at once (elsewhere its loss shows as a completion error or, at
  // worst, the deadline). An abort
  // it relayed on its way out names the root cause, so the lane, where
  // aborts arrive, is read and peers' aborts checked before the exit is
  // blamed. Only the lane: over the shm provider a write to the dead peer,
  // or a read of a queue it was writing into, can wait for good on a lock
  // it held.
  void blame_if_gone(const wait_site& site) {
    if (!peer_exited(site.peer)) return;
    read_lane();
    check_peer_aborts(site);
    fail_gone(site);
  }

  // The waiter has found mu_ held at every look for held_up_limit: the
  // thread holding it may be stuck in the provider for good, on a lock a
  // dead peer held. When a peer has exited the wait fails, naming the
  // lowest such (the awaited one lives: blame_if_gone has looked).
  void blame_exit_while_held_up(const wait_site& site) {
    for (int p = 0; p < world_; ++p)
      if (peer_exited(p))
        fail(site.op, p,
             std::string("peer process exited while waiting for ") + site.what + " from peer " +
                 std::to_string(site.peer) +
                 ", and this rank's fabric provider has been held up since");
  }

  // Peers' aborts that have arrived, read by a waiter; errors of this rank's
  // own aborts are latched, and the wait reports a better one.
  void read_lane() {
    std::unique_lock lane(lane_mu_, std::defer_lock);
    if (lock_by(lane, deadline::after(held_up_limit))) suppress_latched([&] { progress_lane(); });
  }

  // A peer's abort notice has arrived (its CQ data counts only once the word
  // has landed): the wait fails, naming the rank that peer blamed.
  void check_peer_aborts(const wait_site& site) {
    for (int p = 0; p < world_; ++p) {
      if (p == rank_ || counter(abort_slot(p)) == 0) continue;
      const std::uint64_t word =
          std::atomic_ref<std::uint64_t>(abort_words()[p]).load(std::memory_order_acquire);
      const auto b = proxy::peer_aborted(p, decode_abort(word, world_), rank_, site.what);
      fail(site.op, b.peer, b.cause);
    }
  }

  [[noreturn]] void fail_fi(const char* op, int peer, const char* call, long rc) {
    fail(op, peer, std::string(call) + " failed: " + fi_strerror(static_cast<int>(-rc)));
  }

  // The bytes of each write of a put of `bytes`: max_write_ (which may be
  // SIZE_MAX), or for a striped put one share per rail, whole pages.
  std::size_t piece(std::size_t bytes) const {
    if (rails_.size() < 2 || bytes < stripe_min_) return max_write_;
    constexpr std::size_t page = 4096;
    const std::size_t share = (bytes + rails_.size() - 1) / rails_.size();
    return std::min(max_write_, (share + page - 1) / page * page);
  }
  // Writes a put of `bytes` takes (no overflow).
  std::uint32_t chunks(std::size_t bytes) const {
    return bytes == 0 ? 0 : static_cast<std::uint32_t>(1 + (bytes - 1) / piece(bytes));
  }
  // The rail the next of `writes` writes starts on; they take rails in turn.
  std::size_t take_rail(std::size_t writes) {
    const std::size_t first = next_rail_;
    next_rail_ = (next_rail_ + writes) % rails_.size();
    return first;
  }
  static std::uint32_t signal_writes(std::uint64_t n) {
    return static_cast<std::uint32_t>((n + max_signal_increment - 1) / max_signal_increment);
  }

  // ---- bring-up -----------------------------------------------------------

  // The fi_info of the device each rail drives (nic_choice.hpp), among
  // `usable` (one entry per domain and provider, libfabric's order), for
  // `rails` rails (0: as many as the choice finds, at most max_rails); null
  // for a rail whose EPCOMM_FI_DOMAIN entry names a domain none of them has.
  static std::vector<fi_info*> choose_domains(const std::vector<fi_info*>& usable,
                                              const options& opt, std::size_t rails, int local_rank,
                                              int local_ranks) {
    std::vector<fi_info*> out;
    const char* named = std::getenv("EPCOMM_FI_DOMAIN");
    if (!domain_override(named, local_rank).empty()) {
      const std::size_t count = std::max<std::size_t>(rails, 1);  // named: one unless asked
      for (std::size_t k = 0; k < count; ++k) {
        const std::string name = domain_override(named, local_rank, k, count);
        const auto i = std::find_if(usable.begin(), usable.end(),
                                    [&](const fi_info* f) { return name == f->domain_attr->name; });
        out.push_back(i == usable.end() ? nullptr : *i);
      }
      return out;
    }
    const std::vector<fi_info*> firsts = one_per_domain(usable);
    std::vector<nic> nics;
    for (fi_info* i : firsts)
      nics.push_back({i->domain_attr->name, pci_path(sysfs_device(i->nic))});
    for (std::size_t i :
         choose_nics(nics, gpu_pci_path(opt.memory), local_rank, local_ranks, rails))
      out.push_back(firsts[i]);
    out.resize(std::min(out.size(), max_rails));
    return out;
  }

  // The rails asked for: EPCOMM_FI_RAILS, else options::rails (0: the choice's).
  std::size_t requested_rails(const options& opt) {
    std::size_t rails = opt.rails;
    std::string from = "options::rails";
    if (const char* env = std::getenv("EPCOMM_FI_RAILS"); env != nullptr && *env != '\0') {
      char* end = nullptr;
      const unsigned long v = std::strtoul(env, &end, 10);
      rails = *end == '\0' && v != 0 ? static_cast<std::size_t>(v) : max_rails + 1;
      from = std::string("EPCOMM_FI_RAILS=") + env;
    }
    if (rails > max_rails)
      fail("libfabric setup", no_peer,
           from + " is not a rail count from 1 to " + std::to_string(max_rails));
    return rails;
  }

  // The first (preferred) fi_info of each domain, in libfabric's order.
  static std::vector<fi_info*> one_per_domain(const std::vector<fi_info*>& usable) {
    std::vector<fi_info*> firsts;
    for (fi_info* i : usable)
      if (std::none_of(firsts.begin(), firsts.end(), [&](const fi_info* f) {
            return std::strcmp(f->domain_attr->name, i->domain_attr->name) == 0;
          }))
        firsts.push_back(i);
    return firsts;
  }

  // The sysfs path of a device on the PCI bus, resolved through its links;
  // empty when libfabric does not say where it is.
  static std::string sysfs_device(const fid_nic* n) {
    if (n == nullptr || n->bus_attr == nullptr || n->bus_attr->bus_type != FI_BUS_PCI) return {};
    const fi_pci_attr& p = n->bus_attr->attr.pci;
    char bdf[32];
    std::snprintf(bdf, sizeof bdf, "%04x:%02x:%02x.%x", p.domain_id, p.bus_id, p.device_id,
                  p.function_id);
    return resolved(std::string("/sys/bus/pci/devices/") + bdf);
  }

  static std::string resolved(const std::string& path) {
    char out[PATH_MAX];
    return ::realpath(path.c_str(), out) != nullptr ? std::string(out) : std::string{};
  }

  // The PCIe path of the GPU holding the data region; empty for host memory.
  static std::vector<std::string> gpu_pci_path(const proxy::memory_placement& m) {
#if defined(EPCOMM_WITH_CUDA)
    if (m.kind == proxy::memory_kind::cuda_device) {
      char bus[32] = {};
      if (cudaDeviceGetPCIBusId(bus, sizeof bus, m.cuda_device) == cudaSuccess) {
        for (char* c = bus; *c != '\0'; ++c) *c = static_cast<char>(std::tolower(*c));
        return pci_path(resolved(std::string("/sys/bus/pci/devices/") + bus));
      }
    }
#else
    (void)m;
#endif
    return {};
  }

  void open_endpoints(const options& opt, int local_rank, int local_ranks) {
    fi_info* hints = fi_allocinfo();
    if (hints == nullptr) fail("libfabric setup", no_peer, "fi_allocinfo failed");
    hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
    hints->ep_attr->type = FI_EP_RDM;
    // Every posted operation carries its own fi_context2, as these modes ask.
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    // What EFA demands; a provider that needs less ignores the rest.
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    const bool device = opt.memory.kind == proxy::memory_kind::cuda_device;
    if (device) {
      // Registration of device memory; asked only when used, since a
      // provider without it (or a libfabric built without CUDA) would
      // otherwise be refused for host memory too.
      hints->caps |= FI_HMEM;
      hints->domain_attr->mr_mode |= FI_MR_HMEM;
    }
    hints->domain_attr->threading = FI_THREAD_DOMAIN;  // this class serializes every call
    hints->domain_attr->av_type = FI_AV_TABLE;
    hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    if (!opt.provider.empty()) hints->fabric_attr->prov_name = strdup(opt.provider.c_str());
    fi_info* list = nullptr;
    const int rc = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0,
                              hints, &list);
    fi_freeinfo(hints);
    const std::string wanted =
        opt.provider.empty()
            ? (std::getenv("FI_PROVIDER") ? std::string("FI_PROVIDER=") + std::getenv("FI_PROVIDER")
                                          : std::string("any provider"))
            : "provider " + opt.provider;
    if (rc != 0)
      fail("libfabric setup", no_peer,
           "no " + wanted + " offers FI_EP_RDM with RMA writes and delivery-complete" +
               (device ? " on CUDA device memory (FI_HMEM)" : "") +
               ": fi_getinfo: " + fi_strerror(-rc));
    // Signals need 4 bytes of CQ data and keys must fit 64 bits (no FI_MR_RAW).
    std::vector<fi_info*> usable;
    for (fi_info* i = list; i != nullptr; i = i->next)
      if (i->domain_attr->cq_data_size >= 4 && i->domain_attr->mr_key_size <= 8)
        usable.push_back(i);
    if (usable.empty()) {
      fi_freeinfo(list);
      fail("libfabric setup", no_peer,
           "no " + wanted + " offers 4 bytes of remote CQ data with 64-bit memory keys");
    }
    std::vector<fi_info*> chosen;
    try {
      chosen = choose_domains(usable, opt, requested_rails(opt), local_rank, local_ranks);
    } catch (...) {
      fi_freeinfo(list);
      throw;
    }
    if (const auto missing = std::find(chosen.begin(), chosen.end(), nullptr);
        missing != chosen.end()) {
      const std::size_t k = static_cast<std::size_t>(missing - chosen.begin());
      std::string offered;
      for (const fi_info* i : one_per_domain(usable))
        offered += (offered.empty() ? "" : ", ") + std::string(i->domain_attr->name);
      fi_freeinfo(list);
      fail("libfabric setup", no_peer,
           "EPCOMM_FI_DOMAIN names '" +
               domain_override(std::getenv("EPCOMM_FI_DOMAIN"), local_rank, k, chosen.size()) +
               "' for local rank " + std::to_string(local_rank) +
               (chosen.size() > 1 ? " rail " + std::to_string(k) : std::string()) + ", which " +
               wanted + " does not offer (offered: " + offered + ")");
    }
    for (fi_info* c : chosen) {
      rails_.emplace_back();
      rails_.back().info = fi_dupinfo(c);
      if (rails_.back().info == nullptr) {
        fi_freeinfo(list);
        fail("libfabric setup", no_peer, "fi_dupinfo failed");
      }
    }
    fi_freeinfo(list);
    const fi_info* first = rails_[0].info;
    shm_ = std::string_view(first->fabric_attr->prov_name) == "shm";
    name_ = std::string("libfabric/") + first->fabric_attr->prov_name;
    max_write_ = SIZE_MAX;
    for (const rail& r : rails_) max_write_ = std::min(max_write_, r.info->ep_attr->max_msg_size);
    if (opt.max_write != 0) max_write_ = std::min(max_write_, opt.max_write);
    if (max_write_ == 0) fail("libfabric setup", no_peer, "provider reports max_msg_size 0");
    stripe_min_ = opt.stripe_min;

    // Files of this host's dead epcomm processes go first (shm provider).
    if (over_shm()) shm_regions::remove_orphans();
    for (rail& r : rails_) {
      r.domain_name = r.info->domain_attr->name;
      long rc = fi_fabric(r.info->fabric_attr, &r.fabric, nullptr);
      if (rc != 0) fail_fi("libfabric setup", no_peer, "fi_fabric", rc);
      rc = fi_domain(r.fabric, r.info, &r.domain, nullptr);
      if (rc != 0) fail_fi("libfabric setup", no_peer, "fi_domain", rc);
      open_rdm_endpoint(r.info, r.domain, r.cq, r.av, r.ep);
    }
    // The abort lane carries one 8-byte write per peer, once: small queues
    // (a write the provider refuses for now waits in the peer's queue).
    fi_info* lane = fi_dupinfo(first);
    if (lane == nullptr) fail("libfabric setup", no_peer, "fi_dupinfo failed");
    const std::size_t lane_depth = std::max<std::size_t>(64, static_cast<std::size_t>(world_));
    lane->tx_attr->size = std::min(lane->tx_attr->size, lane_depth);
    lane->rx_attr->size = std::min(lane->rx_attr->size, lane_depth);
    try {
      open_rdm_endpoint(lane, rails_[0].domain, lane_.cq, lane_.av, lane_.ep);
    } catch (...) {
      fi_freeinfo(lane);
      throw;
    }
    fi_freeinfo(lane);
  }

  // An endpoint of `info` in `domain` with a completion queue and an address
  // vector of its own, enabled. Over the shm provider its file gets an epcomm
  // name, so that a survivor, or the next start, can tell when it is orphaned.
  void open_rdm_endpoint(fi_info* info, fid_domain* domain, fid_cq*& cq, fid_av*& av, fid_ep*& ep) {
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_NONE;
    long r = fi_cq_open(domain, &cq_attr, &cq, nullptr);
    if (r != 0) fail_fi("libfabric setup", no_peer, "fi_cq_open", r);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    av_attr.count = static_cast<std::size_t>(world_);
    r = fi_av_open(domain, &av_attr, &av, nullptr);
    if (r != 0) fail_fi("libfabric setup", no_peer, "fi_av_open", r);
    r = fi_endpoint(domain, info, &ep, nullptr);
    if (r != 0) fail_fi("libfabric setup", no_peer, "fi_endpoint", r);
    r = fi_ep_bind(ep, &av->fid, 0);
    if (r != 0) fail_fi("libfabric setup", no_peer, "fi_ep_bind(av)", r);
    r = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
    if (r != 0) fail_fi("libfabric setup", no_peer, "fi_ep_bind(cq)", r);
    if (over_shm()) {
      const std::string address = shm_regions::next_address();
      r = fi_setname(&ep->fid, const_cast<char*>(address.c_str()), address.size() + 1);
      if (r != 0) fail_fi("libfabric setup", no_peer, "fi_setname", r);
      shm_addresses_.push_back(address);
    }
    r = fi_enable(ep);
    if (r != 0) fail_fi("libfabric setup", no_peer, "fi_enable", r);
  }

  void allocate_memory(const proxy::memory_placement& data_memory) {
    memory_[control_region] = proxy::symmetric_memory(
        rank_, "libfabric setup", scratch_bytes + static_cast<std::size_t>(world_) * 8, {});
    memory_[data_region] = proxy::symmetric_memory(rank_, "libfabric setup", bytes_, data_memory);
  }

  void register_memory() {
    // Keys count only where the provider lets the application choose them;
    // they differ, as keys must within a domain (rails may share a device).
    constexpr std::uint64_t key_base = 0x45504330;
    for (std::size_t k = 0; k < rails_.size(); ++k) {
      rail& r = rails_[k];
      for (int i : {control_region, data_region})
        register_region(r, memory_[i], key_base + 2 * k + static_cast<std::uint64_t>(i), r.ep,
                        r.mr[i], r.desc[i]);
    }
    register_region(rails_[0], memory_[control_region], key_base + 2 * max_rails, lane_.ep,
                    lane_.mr, lane_.desc);
  }

  // Registers `memory` in rail `r`'s domain for `ep` (bound to it where the
  // provider wants that).
  void register_region(const rail& r, const proxy::symmetric_memory& memory,
                       std::uint64_t requested_key, fid_ep* ep, fid_mr*& mr, void*& desc) {
    const iovec iov{memory.data(), memory.bytes()};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = FI_WRITE | FI_REMOTE_WRITE;
    attr.requested_key = requested_key;
    attr.iface = FI_HMEM_SYSTEM;
    if (memory.on_device()) {
      attr.iface = FI_HMEM_CUDA;
      attr.device.cuda = memory.placement().cuda_device;
    }
    long rc = fi_mr_regattr(r.domain, &attr, 0, &mr);
    if (rc != 0)
      fail_fi("libfabric setup", no_peer,
              memory.on_device() ? "fi_mr_regattr (FI_HMEM_CUDA)" : "fi_mr_regattr", rc);
    if (r.info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
      rc = fi_mr_bind(mr, &ep->fid, 0);
      if (rc != 0) fail_fi("libfabric setup", no_peer, "fi_mr_bind", rc);
      rc = fi_mr_enable(mr);
      if (rc != 0) fail_fi("libfabric setup", no_peer, "fi_mr_enable", rc);
    }
    desc = fi_mr_desc(mr);
  }

  template <bootstrap B>
  void exchange(B& boot, const deadline& dl) {
    announcement mine{};
    mine.rail_count = rails_.size();
    for (std::size_t k = 0; k < rails_.size(); ++k) {
      rail_announcement& a = mine.rails[k];
      a.addrlen = address_of(rails_[k].ep, a.addr);
      for (int i : {control_region, data_region})
        a.regions[i] = announced(rails_[k], rails_[k].mr[i], memory_[i]);
    }
    mine.abort_addrlen = address_of(lane_.ep, mine.abort_addr);
    mine.abort_words = announced(rails_[0], lane_.mr, memory_[control_region]);
    mine.bytes = bytes_;
    mine.process = self_;
    const auto gathered = boot.all_gather(std::as_bytes(std::span(&mine, 1)), dl);
    std::vector<announcement> all(world_);
    std::memcpy(all.data(), gathered.data(), gathered.size());
    for (int p = 0; p < world_; ++p) {
      if (all[p].bytes != bytes_)
        fail("libfabric setup", p,
             "buffer sizes disagree: " + std::to_string(all[p].bytes) + " bytes there, " +
                 std::to_string(bytes_) + " here");
      if (all[p].rail_count != rails_.size())
        fail("libfabric setup", p,
             "rail counts disagree: " + std::to_string(all[p].rail_count) + " there, " +
                 std::to_string(rails_.size()) +
                 " here (options::rails, EPCOMM_FI_RAILS or the devices found differ)");
      for (std::size_t k = 0; k < rails_.size(); ++k) {
        if (fi_av_insert(rails_[k].av, all[p].rails[k].addr, 1, &peers_[p].rails[k].addr, 0,
                         nullptr) != 1)
          fail("libfabric setup", p,
               "fi_av_insert rejected the peer's address on rail " + std::to_string(k));
        peers_[p].rails[k].regions[control_region] = all[p].rails[k].regions[control_region];
        peers_[p].rails[k].regions[data_region] = all[p].rails[k].regions[data_region];
      }
      if (fi_av_insert(lane_.av, all[p].abort_addr, 1, &peers_[p].abort_addr, 0, nullptr) != 1)
        fail("libfabric setup", p, "fi_av_insert rejected the peer's abort-lane address");
      processes_[p] = all[p].process;
      peers_[p].abort_words = all[p].abort_words;
    }
  }

  // Writes `ep`'s address into `addr` (232 bytes); returns its length.
  std::uint64_t address_of(fid_ep* ep, std::uint8_t (&addr)[232]) {
    std::size_t len = sizeof addr;
    const int r = fi_getname(&ep->fid, addr, &len);
    if (r == -FI_ETOOSMALL)
      fail("libfabric setup", no_peer,
           "endpoint address of " + std::to_string(len) + " bytes exceeds " +
               std::to_string(sizeof addr));
    if (r != 0) fail_fi("libfabric setup", no_peer, "fi_getname", r);
    return len;
  }

  // What peers need to write into `memory` through rail `r`'s registration
  // `mr`: with FI_MR_VIRT_ADDR they address it by pointer.
  remote_region announced(const rail& r, fid_mr* mr, const proxy::symmetric_memory& memory) {
    const std::uint64_t key = fi_mr_key(mr);
    if (key == FI_KEY_NOTAVAIL)
      fail("libfabric setup", no_peer, "the provider did not give a memory region a key");
    const bool virt_addr = (r.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    return {key, virt_addr ? reinterpret_cast<std::uint64_t>(memory.data()) : 0};
  }

  // The shm provider, whose endpoints keep a file each in /dev/shm.
  bool over_shm() const { return shm_; }

  void close() {
    // A peer that died without closing left its file (shm_regions.hpp).
    if (over_shm() && !rails_.empty() && rails_[0].ep != nullptr) shm_regions::remove_orphans();
    if (lane_.ep != nullptr) fi_close(&lane_.ep->fid);
    for (rail& r : rails_)
      if (r.ep != nullptr) fi_close(&r.ep->fid);
    for (rail& r : rails_)
      for (fid_mr* mr : r.mr)
        if (mr != nullptr) fi_close(&mr->fid);
    if (lane_.mr != nullptr) fi_close(&lane_.mr->fid);
    if (lane_.av != nullptr) fi_close(&lane_.av->fid);
    if (lane_.cq != nullptr) fi_close(&lane_.cq->fid);
    lane_ = {};
    for (rail& r : rails_) {
      if (r.av != nullptr) fi_close(&r.av->fid);
      if (r.cq != nullptr) fi_close(&r.cq->fid);
      if (r.domain != nullptr) fi_close(&r.domain->fid);
      if (r.fabric != nullptr) fi_close(&r.fabric->fid);
      if (r.info != nullptr) fi_freeinfo(r.info);
    }
    rails_.clear();
  }

  // Connection-based providers (rxm) connect on first use. Connecting here
  // instead, in one direction (every rank says hello to the ranks above it,
  // then waits for the hellos of the ranks below and for its own to
  // complete), keeps connection setup out of the first dispatch, avoids two
  // ranks connecting to each other at once (rxm then refuses one attempt and
  // retries), and makes an unreachable peer fail construction. A
  // connectionless provider (EFA) just exchanges a few signals.
  void connect_in_order(const deadline& dl) {
    std::unique_lock lock(mu_);
    auto* scratch = reinterpret_cast<std::uint64_t*>(memory_[control_region].data());
    for (int p = rank_ + 1; p < world_; ++p) {
      for (std::size_t k = 0; k < rails_.size(); ++k)  // one hello on every rail
        post_signal(p, hello_slot(rank_), 1, no_ticket, k);
      std::lock_guard lane(lane_mu_);
      post_on_lane(p, scratch, 0, lane_hello_slot(rank_));  // the abort lane too
    }
    auto greeted = [&](int p) {
      return counter(hello_slot(p)) == rails_.size() && counter(lane_hello_slot(p)) != 0;
    };
    auto connected = [&] {
      if (busy()) return false;
      for (int p = 0; p < rank_; ++p)
        if (!greeted(p)) return false;
      return true;
    };
    while (!connected()) {
      progress_locked();
      // Lets the ranks this one waits for run when there are more ranks than cores.
      std::this_thread::yield();
      if (dl.expired()) {
        int late = rank_ - 1;
        while (late >= 0 && greeted(late)) --late;
        fail("libfabric setup", late >= 0 ? late : no_peer,
             "deadline expired while connecting to the other ranks");
      }
    }
  }

  // ---- data path (mu_ held) -----------------------------------------------

  // Writes not yet complete (queued ones and aborts included), or signals
  // still held back.
  bool busy() const {
    if (ops_.outstanding != ops_.abandoned) return true;
    if (std::lock_guard lane(lane_mu_); lane_.ops.outstanding != 0) return true;
    return std::any_of(peers_.begin(), peers_.end(),
                       [](const peer_state& p) { return !p.held.empty(); });
  }

  void post_writes(int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes,
                   std::uint64_t ticket) {
    const std::size_t each = piece(bytes);
    std::size_t rail = take_rail(chunks(bytes));
    for (std::size_t off = 0, len = 0; off < bytes; off += len) {
      len = std::min(each, bytes - off);
      post_write(peer, local_off + off, remote_off + off, len, ticket, std::nullopt, rail);
      rail = (rail + 1) % rails_.size();
    }
  }

  void post_write(int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes,
                  std::uint64_t ticket, std::optional<std::uint64_t> cq_data, std::size_t rail) {
    auto& p = peers_[peer];
    posted* op = ops_.acquire(peer, ticket, p.writes.open(1));
    op->rail = rail;
    ++rails_[rail].writes;
    post(op, data_region, data() + local_off, remote_off, bytes, cq_data);
  }

  void post_signal(int peer, std::size_t slot, std::uint64_t n, std::uint64_t ticket,
                   std::size_t rail = 0) {
    posted* op = ops_.acquire(peer, ticket, no_ticket);
    op->rail = rail;
    post(op, control_region, memory_[control_region].data(), 0, sizeof(std::uint64_t),
         encode_signal(slot, n));
  }

  // This rank's abort `word` into its slot at `peer`, the CQ data saying it
  // has landed; the word's source is this rank's own slot. lane_mu_ held, as
  // for everything on the lane.
  void post_abort(int peer, std::uint64_t word) {
    std::atomic_ref<std::uint64_t>(abort_words()[rank_]).store(word, std::memory_order_release);
    post_on_lane(peer, abort_words() + rank_,
                 scratch_bytes + static_cast<std::uint64_t>(rank_) * sizeof(std::uint64_t),
                 abort_slot(rank_));
  }

  // 8 bytes from `local` (in the control region) to `remote_off` of the
  // peer's control region through the abort lane, carrying one signal on
  // `slot`. Refused ones wait in the lane's own backlog: an abort must not
  // queue behind a backlog of data to a peer that stopped draining.
  void post_on_lane(int peer, std::uint64_t* local, std::uint64_t remote_off, std::size_t slot) {
    posted* op = lane_.ops.acquire(peer, no_ticket, no_ticket);
    op->on_abort_lane = true;
    op->region = control_region;
    op->local = local;
    op->remote_off = remote_off;
    op->bytes = sizeof(std::uint64_t);
    op->cq_data = encode_signal(slot, 1);
    bool posted_now;
    try {
      posted_now = try_post(op);
    } catch (const error&) {
      lane_.ops.release(op);  // the provider refused it for good: nothing to wait for at teardown
      throw;
    }
    if (!posted_now) lane_.backlog.push_back(op);
  }

  // Reads the lane's completions (peers' aborts and hellos, this rank's
  // aborts) and posts what it refused before; an abort for a peer that has
  // exited is dropped. lane_mu_ held.
  void progress_lane() {
    drain_cq(lane_.cq);
    std::erase_if(lane_.backlog, [&](posted* op) {
      if (try_post(op)) return true;
      if (!peer_exited(op->peer)) return false;
      lane_.ops.release(op);
      return true;
    });
  }

  void post(posted* op, int region, void* local, std::uint64_t remote_off, std::size_t bytes,
            std::optional<std::uint64_t> cq_data) {
    op->region = region;
    op->local = local;
    op->remote_off = remote_off;
    op->bytes = bytes;
    op->cq_data = cq_data;
    if (lost(op->peer)) {  // masked: counts complete, moves nothing
      on_completion_of(op);
      return;
    }
    auto& backlog = peers_[op->peer].backlog;
    // Over the shm provider a write to a peer that exited may never return
    // (retry_backlog); it waits in the backlog, which drops it.
    if (backlog.empty() && !(over_shm() && peer_exited(op->peer)) && post_data(op)) return;
    backlog.push_back(op);
  }

  // Posts a data-path write; false when the provider's queues are full and
  // it must be tried again after progress. A write the provider refuses for
  // good fails the transport or, when masking, loses its peer: it then
  // counts complete, as everything to that peer does.
  bool post_data(posted* op) {
    const ssize_t rc = write_now(op);
    if (rc == 0) return true;
    if (rc == -FI_EAGAIN) return false;
    if (!lost_.masking())
      fail_fi(op->write == no_ticket ? "libfabric signal" : "libfabric write", op->peer,
              "fi_writemsg", rc);
    lose_peer(op->peer, std::string("fi_writemsg failed: ") + fi_strerror(static_cast<int>(-rc)));
    on_completion_of(op);
    return true;
  }

  // Posts `op`; false when the provider's queues are full (-FI_EAGAIN) and it
  // must be tried again after progress.
  bool try_post(posted* op) {
    const ssize_t rc = write_now(op);
    if (rc == 0) return true;
    if (rc == -FI_EAGAIN) return false;
    fail_fi(op->write == no_ticket ? "libfabric signal" : "libfabric write", op->peer,
            "fi_writemsg", rc);
  }

  // One fi_writemsg of `op`: 0, -FI_EAGAIN when the provider's queues are
  // full, or the provider's error. Never blocks, so a peer that stops
  // draining cannot stall the proxy or, through it, the other peers.
  ssize_t write_now(posted* op) {
    const peer_state& peer = peers_[op->peer];
    const peer_rail& there = peer.rails[op->rail];
    const remote_region& to = op->on_abort_lane ? peer.abort_words : there.regions[op->region];
    iovec iov{op->local, op->bytes};
    void* desc = op->on_abort_lane ? lane_.desc : rails_[op->rail].desc[op->region];
    fi_rma_iov target{to.base + op->remote_off, op->bytes, to.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = op->on_abort_lane ? peer.abort_addr : there.addr;
    msg.rma_iov = &target;
    msg.rma_iov_count = 1;
    msg.context = &op->ctx;
    msg.data = op->cq_data.value_or(0);
    const std::uint64_t flags =
        FI_COMPLETION | FI_DELIVERY_COMPLETE | (op->cq_data ? FI_REMOTE_CQ_DATA : 0);
    return fi_writemsg(op->on_abort_lane ? lane_.ep : rails_[op->rail].ep, &msg, flags);
  }

  // Queued writes to a peer that exited never go: they are dropped (with the
  // signals held behind them) so that they neither fail every later progress
  // nor hold up teardown, and the loss is reported once.
  // Nothing is posted to a peer known exited: over the shm provider the
  // write could wait for good on a lock it held.
  // When masking, the peer is lost instead, and what it was owed counts
  // complete. That is decided after the loop: the peer can exit while it
  // runs, after progress_locked() found it alive.
  void retry_backlog(int peer) {
    auto& p = peers_[peer];
    while (!p.backlog.empty() && !peer_exited(peer)) {
      if (!post_data(p.backlog.front())) return;
      p.backlog.pop_front();
    }
    if (p.backlog.empty()) return;
    if (lost_.masking() && !lost(peer)) lose_peer(peer, {});
    if (lost(peer)) {
      for (posted* op : p.backlog) on_completion_of(op);
      p.backlog.clear();
      return;
    }
    const std::size_t dropped = p.backlog.size();
    for (posted* op : p.backlog) ops_.release(op);
    p.backlog.clear();
    p.held.clear();
    fail("libfabric write", peer,
         "peer process exited with " + std::to_string(dropped) + " writes to it still queued");
  }

  // Without masking: operations to a peer that exited, still incomplete
  // unanswered_grace after its exit was seen, never complete (over the shm
  // provider the peer's own progress answers them), and a quiet would wait
  // out its deadline: the transport fails, naming the peer. An answer the
  // peer sent before it exited has had that long to be read (drain_cq runs
  // first), so a peer that exits after the group is done fails nothing.
  static constexpr std::chrono::milliseconds unanswered_grace{250};
  void fail_if_unanswered(int peer) {
    if (steady::now() - *peers_[peer].exit_seen < unanswered_grace) return;
    std::size_t open = ops_.outstanding_to(peer);
    open -= std::min(open, peers_[peer].backlog.size());  // queued: retry_backlog's
    if (open != 0)
      fail("libfabric write", peer,
           "peer process exited with " + std::to_string(open) +
               (open == 1 ? " operation" : " operations") + " to it unanswered for " +
               std::to_string(unanswered_grace.count()) + " ms");
  }

  void defer(int peer, const deferred& d) {
    peers_[peer].held.push_back(d);
    release_held(peer);
  }

  // Posts the held signals (completes the held flushes) of `peer` whose
  // earlier writes have all completed.
  void release_held(int peer) {
    auto& p = peers_[peer];
    while (!p.held.empty() && p.held.front().after_writes <= p.writes.watermark()) {
      const deferred d = p.held.front();
      p.held.pop_front();
      if (d.what == deferred::kind::flush) {
        tickets_.complete(d.ticket);
        continue;
      }
      for (std::uint64_t left = d.n; left > 0;) {
        const std::uint64_t part = std::min(left, max_signal_increment);
        post_signal(peer, d.slot, part, d.ticket);
        left -= part;
      }
    }
  }

  // Every peer's queue moves on even when another peer's fails: an abort
  // queued to a live peer must not wait behind writes to a lost one.
  void progress_locked() {
    {
      std::lock_guard lane(lane_mu_);
      progress_lane();  // an abort first: it names the root cause
    }
    for (const rail& r : rails_) drain_cq(r.cq);
    if (lost_.masking())
      find_exited_peers([&](int p) { lose_peer(p, {}); });
    else
      find_exited_peers([&](int p) {
        if (!peers_[p].exit_seen) peers_[p].exit_seen = steady::now();
      });
    std::optional<error> first;
    for (int p = 0; p < world_; ++p) {
      try {
        if (!peers_[p].backlog.empty()) retry_backlog(p);
        if (!peers_[p].held.empty()) release_held(p);
        if (peers_[p].exit_seen) fail_if_unanswered(p);
      } catch (const error& e) {
        if (!first) first = e;
      }
    }
    if (first) throw *first;
  }

  // Reads every available completion: incoming signals bump counters, our own
  // operations complete their tickets and writes.
  void drain_cq(fid_cq* cq) {
    fi_cq_data_entry entries[32];
    for (;;) {
      const ssize_t n = fi_cq_read(cq, entries, 32);
      if (n == -FI_EAGAIN) return;
      if (n == -FI_EAVAIL) {
        on_cq_error(cq);
        continue;
      }
      if (n < 0) fail_fi("libfabric progress", no_peer, "fi_cq_read", n);
      for (ssize_t i = 0; i < n; ++i) on_completion(entries[i]);
      if (n < 32) return;
    }
  }

  void on_completion(const fi_cq_data_entry& e) {
    if (e.flags & FI_REMOTE_WRITE) {
      if (e.flags & FI_REMOTE_CQ_DATA) {
        const std::size_t slot = signal_slot_of(e.data);
        if (slot >= counters_.size())
          fail("libfabric progress", no_peer,
               "incoming signal names slot " + std::to_string(slot) + " of " +
                   std::to_string(counters_.size()));
        add_local(slot, signal_increment_of(e.data));
        if (slot >= abort_slot(0) && slot < abort_slot(world_))
          abort_notices_.fetch_add(1, std::memory_order_release);
      }
      return;
    }
    on_completion_of(static_cast<posted*>(e.op_context));
  }

  // The lane's operations complete on the lane's queue (lane_mu_ held), the
  // data path's on its own (mu_ held).
  // An operation lost with its peer was counted complete then: its
  // completion only gives it back.
  void on_completion_of(posted* op) {
    if (op->on_abort_lane) {
      lane_.ops.release(op);
      return;
    }
    if (op->abandoned)
      --ops_.abandoned;
    else
      settle(op);
    ops_.release(op);
  }

  void settle(const posted* op) {
    if (op->write != no_ticket) peers_[op->peer].writes.complete(op->write);
    if (op->ticket != no_ticket) tickets_.complete(op->ticket);
  }

  // A completion error fails the transport, naming the operation's peer. When
  // masking, it loses that peer instead (a lost abort write is dropped: the
  // abort is best effort towards a peer that is gone), and an error that
  // names no operation of this rank's is ignored: a peer's lost connection
  // may surface so, and what it concerns is that peer's.
  void on_cq_error(fid_cq* cq) {
    fi_cq_err_entry err{};
    const ssize_t r = fi_cq_readerr(cq, &err, 0);
    if (r < 0) fail_fi("libfabric progress", no_peer, "fi_cq_readerr", r);
    auto* op = static_cast<posted*>(err.op_context);
    char detail[256] = {};
    const char* provider_text =
        fi_cq_strerror(cq, err.prov_errno, err.err_data, detail, sizeof detail);
    const std::string cause = std::string("completion error: ") + fi_strerror(err.err) +
                              (provider_text != nullptr && *provider_text != '\0'
                                   ? std::string(" (") + provider_text + ")"
                                   : std::string());
    if (lost_.masking()) {
      if (op != nullptr && !op->on_abort_lane) lose_peer(op->peer, cause);
      if (op != nullptr) on_completion_of(op);
      return;
    }
    const int peer = op != nullptr ? op->peer : no_peer;
    const bool signal = op != nullptr && op->write == no_ticket;
    if (op != nullptr) on_completion_of(op);  // failed, but no longer the provider's
    fail(signal ? "libfabric signal" : "libfabric write", peer, cause);
  }

  // ---- lost peers (mask_lost_peers; mu_ held) ------------------------------

  bool lost(int peer) const { return lost_.lost(peer); }

  // Marks `peer` lost (`cause`: how the fabric failed it; empty: its process
  // exited). Every operation to it not yet complete counts complete now; the
  // provider's completions of those in flight only give them back later.
  void lose_peer(int peer, std::string cause) {
    if (!lost_.mark(peer, std::move(cause))) return;
    for (const auto& op : ops_.all)
      if (op->live && !op->abandoned && op->peer == peer) {
        settle(op.get());
        op->abandoned = true;
        ++ops_.abandoned;
      }
  }

  std::size_t max_write_ = 0;
  std::size_t stripe_min_ = 0;
  std::size_t next_rail_ = 0;  // where the next put starts (take_rail)

  bool shm_ = false;  // the provider is shm (over_shm())
  std::vector<rail> rails_;
  proxy::symmetric_memory memory_[2];  // control_region, data_region
  // The abort lane: an endpoint for abort words only, with what it needs of
  // its own, its registration of the control region, its operations and
  // their lock.
  struct {
    fid_cq* cq = nullptr;
    fid_av* av = nullptr;
    fid_ep* ep = nullptr;
    fid_mr* mr = nullptr;
    void* desc = nullptr;
    op_pool ops;
    std::deque<posted*> backlog;  // refused with -FI_EAGAIN
  } lane_;
  mutable std::mutex lane_mu_;  // taken after mu_ when both are

  // Local signal counters, read with acquire: the user's slots, then per
  // rank a barrier, a connection-hello, an abort and an abort-lane hello slot.
  std::vector<std::uint64_t> counters_;
  std::vector<peer_state> peers_;
  std::vector<std::string> shm_addresses_;      // this rank's endpoints over the shm provider
  op_pool ops_;                                 // the data path's
  std::atomic<std::size_t> abort_notices_ = 0;  // peers' abort notices received
  std::atomic<steady::rep> driven_at_ = 0;      // when progress() or serve() was last called
};

static_assert(rma_transport<transport>);
static_assert(has_completion_count<transport>);
static_assert(has_abort<transport>);
static_assert(has_serve<transport>);
static_assert(gpu_fed_transport<transport>);
static_assert(has_lost_peer_masking<transport>);

}  // namespace epcomm::libfabric
