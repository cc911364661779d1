// UCX transport: one UCP worker per rank, the signal counters and the
// symmetric buffer mapped with ucp_mem_map (two regions: the counters in host
// memory, the buffer in host memory or, for producers on the GPU, CUDA device
// memory, options::memory), packed rkeys and worker addresses exchanged
// through the bootstrap. Primitives:
//
//   put         ucp_put_nbx;
//   signal      ucp_worker_fence, then ucp_atomic_op_nbx(UCP_ATOMIC_OP_ADD) on
//               the peer's counter word: the fence makes every earlier put
//               (to any peer) complete at its target before the add happens;
//   put_signal  put, fence, add;
//   flush       ucp_ep_flush_nbx (remote completion);
//   self        memcpy and a local counter add.
//
// Works with any UCX_TLS that offers RMA and 64-bit atomics, natively or
// emulated over active messages (shared memory: posix, sysv, cma; tcp). To a
// peer whose endpoint has no native RMA and atomic lanes (tcp), puts, adds,
// goodbyes and flushes go as the transport's own active messages instead
// (messages.hpp says why: UCX's emulation can abort a survivor), applied by
// the target in the order they were sent; a flush completes when the
// target's reply comes. Both need the target to progress its worker: the
// proxy does. A
// peer that fails (ucp error handling mode PEER), exits (same host, by pid)
// or leaves (its goodbye word, see the destructor), or an operation that
// completes with an error, latches an epcomm::error naming the peer, unless
// mask_lost_peers() was called (an engine that masks lost ranks): then that
// peer alone is lost, its endpoint closed (so its requests complete), what is
// later issued to it counts complete without moving, and only a wait for it
// fails. Calls are
// serialized by a mutex (worker in UCS_THREAD_MODE_SERIALIZED), so wait() and
// barrier() may run while a proxy thread issues operations and progresses.
//
// abort() is an early goodbye after a failure: the word, posted to every
// peer and never awaited, names the rank to blame, and a peer waiting on any
// rank fails as soon as such a word has landed.
#pragma once

#include <ucp/api/ucp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
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
#include <utility>
#include <vector>

#include "epcomm/core/error.hpp"
#include "epcomm/transport/concepts.hpp"
#include "epcomm/transport/peer_abort.hpp"
#include "epcomm/transport/process_identity.hpp"
#include "epcomm/transport/rma/base.hpp"
#include "epcomm/transport/rma/symmetric_memory.hpp"
#include "epcomm/ucx/messages.hpp"

namespace epcomm::ucx {

struct options {
  // Bound on the transport's own waits (teardown). EPCOMM_TIMEOUT_MS overrides it.
  std::chrono::milliseconds timeout = default_timeout;
  // Where local_buffer() lives. CUDA device memory (EPCOMM_WITH_CUDA) is
  // mapped as UCS_MEMORY_TYPE_CUDA and needs a UCX built with CUDA support;
  // only CUDA producers can then fill it.
  proxy::memory_placement memory{};
};

class transport : public proxy::rma_transport_base {
  friend class proxy::rma_transport_base;  // run_barrier's hooks

 public:
  using options_type = options;  // for generic code that places the buffer (cuda/)

  // Collective over `boot`: every rank passes the same `bytes` and `signal_slots`.
  template <bootstrap B>
  transport(B& boot, std::size_t bytes, std::size_t signal_slots, deadline dl,
            const options& opt = {})
      : rma_transport_base(boot.rank(), boot.world_size(), bytes, signal_slots,
                           effective_timeout(opt.timeout), "ucx"),
        slots_(signal_slots + 2 * static_cast<std::size_t>(boot.world_size())),
        peers_(boot.world_size()),
        said_goodbye_(boot.world_size(), false),
        deliveries_(boot.world_size()) {
    if (const char* tls = std::getenv("UCX_TLS")) {
      name_ += std::string("/") + tls;
      shared_memory_only_ = only_shared_memory(tls);
    }
    for (int p = 0; p < world_; ++p) peers_[p].error_context = {this, p};
    try {
      open_worker();
      map_memory(opt.memory);
      exchange(boot, dl);
      boot.barrier(dl);  // every peer's memory is mapped and its rkeys are out
    } catch (...) {
      close();
      throw;
    }
  }

  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  // Collective, like construction, and bounded: waits for this rank's
  // operations, says goodbye to every peer and waits for their goodbyes, so
  // that nobody still needs this rank's worker when it closes (UCX aborts a
  // process whose peer vanishes while it still serves that peer's requests).
  // A goodbye tells peers that a closing connection is a departure, and
  // after a failure which peer it blames; after abort() it went out already.
  // Failed or not, the wait is short for a peer known lost.
  ~transport() {
    {
      std::lock_guard lock(mu_);
      const std::uint64_t aborted_with = abort_word();
      const bool failed = failure_.failed() || aborted_with != 0;
      const int culprit =
          aborted_with != 0 ? decode_abort(aborted_with, world_) : failure_.culprit();
      const deadline dl = teardown_deadline();
      auto progress = [&] { progress_locked(); };
      auto reachable = [&](int p) {
        return p != rank_ && p != culprit && peers_[p].ep != nullptr && !peer_exited(p);
      };
      drain([&] { return outstanding_ == 0; }, dl, progress);
      const std::uint64_t goodbye = failed ? encode_abort(culprit) : left_cleanly_word;
      suppress_latched([&] {
        for (int p = 0; p < world_; ++p)
          if (reachable(p) && !said_goodbye_[p]) post_goodbye(p, goodbye);
      });
      drain(
          [&] {
            for (int p = 0; p < world_; ++p)
              if (reachable(p) && counter(goodbye_slot(p)) == 0) return false;
            return true;
          },
          dl, progress);
      ucp_request_param_t rp{};
      settle(ucp_worker_flush_nbx(worker_, &rp), dl);
    }
    close();
  }

  // Device memory when options::memory asked for it: then only kernels may
  // touch it.
  std::span<std::byte> local_buffer() { return {data(), bytes_}; }
  bool local_buffer_on_device() const { return local_[data_region].memory.on_device(); }

  // The words wait() reads, one per signal slot, in host memory: what a
  // producer that waits by itself (a proxy::channel in a kernel, through a
  // mapping of them) polls. Only this transport writes them.
  std::span<const std::uint64_t> signal_counters() const { return {counter_word(0), user_slots_}; }

  void put(int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes) {
    std::lock_guard lock(mu_);
    check_op("put", peer, local_off, remote_off, bytes);
    if (peer == rank_ || lost(peer)) {
      if (peer == rank_)
        local_[data_region].memory.copy_within(rank_, "put", remote_off, local_off, bytes);
      tickets_.open(0);
      return;
    }
    const std::uint64_t ticket = tickets_.open(bytes > 0 ? 1 : 0);
    if (bytes > 0) post_put(peer, local_off, remote_off, bytes, ticket);
  }

  void put_signal(int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes,
                  std::size_t slot, std::uint64_t n) {
    std::lock_guard lock(mu_);
    check_op("put_signal", peer, local_off, remote_off, bytes);
    check_slot("put_signal", peer, slot);
    if (peer == rank_ || lost(peer)) {
      if (peer == rank_) {
        local_[data_region].memory.copy_within(rank_, "put_signal", remote_off, local_off, bytes);
        add_local(slot, n);
      }
      tickets_.open(0);
      return;
    }
    const std::uint64_t ticket = tickets_.open(bytes > 0 ? 2 : 1);
    if (bytes > 0) post_put(peer, local_off, remote_off, bytes, ticket);
    post_signal(peer, slot, n, ticket);
  }

  // Adds n to `slot` of `peer` once every earlier put has completed at its target.
  void signal_add(int peer, std::size_t slot, std::uint64_t n) {
    std::lock_guard lock(mu_);
    check_peer("signal_add", peer);
    check_slot("signal_add", peer, slot);
    if (peer == rank_ || lost(peer)) {
      if (peer == rank_) add_local(slot, n);
      tickets_.open(0);
      return;
    }
    post_signal(peer, slot, n, tickets_.open(1));
  }

  void flush(int peer) {
    std::lock_guard lock(mu_);
    check_peer("flush", peer);
    if (peer == rank_ || lost(peer)) {
      tickets_.open(0);
      return;
    }
    const ucp_ep_h ep = endpoint("flush", peer);
    const std::uint64_t ticket = tickets_.open(1);
    if (peers_[peer].by_messages) {
      // The request carries the ticket; the reply, which comes once every
      // earlier message has been applied there, completes it.
      peers_[peer].flushes.push_back(acquire(peer, ticket));
      send_message(peer, message_kind::flush_request, 0, 0, no_ticket, nullptr, 0, ticket);
      return;
    }
    op_record* op = acquire(peer, ticket);
    const ucp_request_param_t rp = request_param(op);
    track(op, ucp_ep_flush_nbx(ep, &rp), "ucp_ep_flush_nbx");
  }

  // Fails, like a wait, once a peer has aborted (its goodbye words are
  // scanned about once a millisecond): the proxy then stops and its
  // producers learn why, even when what they wait for is their own
  // operations (which an aborted peer may never complete).
  void progress() {
    std::lock_guard lock(mu_);
    check_usable("ucx progress");
    progress_locked();
    if (const auto now = steady::now(); now >= next_abort_scan_) {
      next_abort_scan_ = now + std::chrono::milliseconds(1);
      check_peer_aborts({"ucx progress", no_peer, "its operations to complete"});
    }
  }

  // Progress that issues nothing new and throws nothing (errors are
  // latched), for a proxy whose work has ended in a failure or an abort:
  // peers' writes and signals to this rank (messages, or RMA that UCX
  // emulates) are still served, so they complete and their senders can close
  // before this rank does; UCX aborts a process that later finds emulated
  // requests whose senders have gone.
  void serve() {
    std::lock_guard lock(mu_);
    suppress_latched([&] { progress_locked(); });
  }

  void wait(std::size_t slot, std::uint64_t expected, deadline dl, wait_site site) {
    // A peer's abort naming the root cause first, then the awaited peer's
    // exit or departure: both explain more than a knock-on error.
    auto explain = [&] {
      check_peer_aborts(site);
      blame_if_gone(site, slot, expected);
      blame_silent_exits(site);
    };
    // Goodbye words land by a put, a plain copy inside progress (which runs
    // under mu_): the periodic check reads them under mu_ too.
    auto watch = [&] {
      const std::lock_guard lock(mu_);
      explain();
    };
    wait_signal(
        slot, slots_, expected, dl, site, [&] { return counter(slot); }, [&] { progress_locked(); },
        explain, watch);
    order_after_progress();
  }

  // Every rank signals every other on the transport's own slots; these
  // signals are not numbered operations.
  void barrier(deadline dl) { run_barrier(*this, dl); }

  // Gives up on the group: this rank's waiters (any thread; the proxy's
  // progress() too) throw within about a millisecond, every later call
  // fails, and every peer not known to have exited gets this rank's goodbye
  // after a failure blamed on `culprit` (no_peer: the caller's own decision),
  // so that a peer waiting in this transport throws an error naming it. The
  // puts are posted, not awaited; the destructor still waits (briefly) for
  // them and for the peers' goodbyes. Safe from any thread and after a
  // failure; only the first call counts.
  void abort(int culprit = no_peer) {
    // Sends what the transport sends only when progressed (tcp).
    post_abort_to_peers(
        culprit, mu_,
        [&](int p, std::uint64_t word) {
          if (!said_goodbye_[p] && peers_[p].ep != nullptr) post_goodbye(p, word);
        },
        [&] { progress_locked(); });
  }

  // See has_lost_peer_masking. Needs every endpoint to report its peer's
  // failure (UCP_ERR_HANDLING_MODE_PEER): one that does not (UCX's
  // shared-memory transports) neither fails the requests of a peer that is
  // gone nor lets its endpoint be force-closed.
  void mask_lost_peers() {
    std::lock_guard lock(mu_);
    for (int p = 0; p < world_; ++p)
      if (p != rank_ && !peers_[p].reports_failure)
        throw error(rank_, "ucx setup", no_peer,
                    "mask_lost_ranks needs endpoints that report a peer's failure "
                    "(UCP_ERR_HANDLING_MODE_PEER), and the one to rank " +
                        std::to_string(p) +
                        " does not: UCX's shared-memory transports cannot (UCX_TLS=tcp or an "
                        "RDMA transport can) (" +
                        name_ + ")");
    lost_.start_masking();
  }

  // Whether puts and signals to `peer` go as the transport's own active
  // messages (its endpoint has no native RMA and atomics) rather than UCX's RMA.
  bool sends_messages_to(int peer) const {
    if (peer < 0 || peer >= world_)
      throw error(
          rank_, "sends_messages_to", no_peer,
          "peer " + std::to_string(peer) + " is outside [0, " + std::to_string(world_) + ")");
    return peers_[peer].by_messages;
  }

  // How many workers this process has left behind rather than destroy them
  // after losing a peer (close() says why).
  static std::atomic<int>& abandoned_workers() {
    static std::atomic<int> count{0};
    return count;
  }

 private:
  static constexpr std::uint64_t no_ticket = std::numeric_limits<std::uint64_t>::max();
  static constexpr std::size_t counter_bytes = sizeof(std::uint64_t);
  static constexpr unsigned message_id = 0;  // our active messages' UCX id

  // The two mapped regions, indices into local_ and a peer's rkeys and bases.
  static constexpr int counter_region = 0;
  static constexpr int data_region = 1;

  struct mapped_region {
    proxy::symmetric_memory memory;
    ucp_mem_h memh = nullptr;
  };

  struct peer_ref {
    transport* self;
    int peer;
  };

  struct op_record;

  struct peer_state {
    ucp_ep_h ep = nullptr;
    ucp_rkey_h rkeys[2] = {};
    std::uint64_t bases[2] = {};     // remote addresses of the mapped regions
    peer_ref error_context{};        // what the endpoint's error handler receives
    bool reports_failure = false;    // created with UCP_ERR_HANDLING_MODE_PEER
    bool by_messages = false;        // writes and adds go as our active messages
    std::uint64_t sent = 0;          // the number of the last message sent to it
    std::deque<op_record*> flushes;  // by messages: flushes awaiting its reply, oldest first
  };

  // One UCX request in flight (or, by messages, a flush awaiting its reply);
  // operand and header stay valid until the request completes.
  struct op_record {
    transport* self;
    int peer;
    std::uint64_t ticket;
    std::uint64_t operand;
    message_header header;
    const char* call;
    void* request;  // while UCX holds it: what teardown cancels
  };

  struct announcement {
    std::uint64_t address_bytes;
    std::uint64_t rkey_bytes[2];
    std::uint64_t bases[2];
    std::uint64_t bytes;
    proxy::process_identity process;
  };

  std::size_t goodbye_slot(int peer) const { return user_slots_ + world_ + peer; }

  // True when a UCX_TLS list names shared-memory transports only.
  static bool only_shared_memory(std::string_view tls) {
    constexpr std::string_view shared[] = {"posix", "sysv", "cma", "knem", "xpmem",
                                           "self",  "sm",   "shm", "mm"};
    if (tls.empty() || tls.front() == '^') return false;
    while (!tls.empty()) {
      const std::size_t comma = tls.find(',');
      const std::string_view t = tls.substr(0, comma);
      if (std::find(std::begin(shared), std::end(shared), t) == std::end(shared)) return false;
      tls = comma == std::string_view::npos ? std::string_view{} : tls.substr(comma + 1);
    }
    return true;
  }

  // The counter region holds one 8-byte word per slot.
  std::byte* data() { return local_[data_region].memory.data(); }
  std::uint64_t* counter_word(std::size_t slot) const {
    return reinterpret_cast<std::uint64_t*>(local_[counter_region].memory.data()) + slot;
  }
  std::uint64_t counter(std::size_t slot) {
    return std::atomic_ref<std::uint64_t>(*counter_word(slot)).load(std::memory_order_acquire);
  }
  void add_local(std::size_t slot, std::uint64_t n) {
    std::atomic_ref<std::uint64_t>(*counter_word(slot)).fetch_add(n, std::memory_order_release);
  }
  // The barrier's signal to `peer`, ordered after this rank's earlier
  // writes there as every signal is. mu_ held.
  void post_barrier_arrival(int peer, std::size_t slot) { post_signal(peer, slot, 1, no_ticket); }

  // The awaited peer exited on this host, or said a clean goodbye (closed
  // its transport: everything it sent before has landed): the wait fails at
  // once, naming it. Otherwise its loss shows as an endpoint error, a
  // goodbye after a failure (check_peer_aborts) or, at worst, the deadline.
  // While masking, a peer that closed its transport is lost like one that
  // exited: it writes nothing more.
  void blame_if_gone(const wait_site& site, std::size_t slot, std::uint64_t expected) {
    if (site.peer < 0 || site.peer >= world_ || site.peer == rank_) return;
    if (counter(goodbye_slot(site.peer)) == left_cleanly_word && counter(slot) < expected) {
      const std::string left = "closed its transport";
      if (lost_.masking()) lose(site.peer, left);
      fail_gone_or(site, "peer " + std::to_string(site.peer) + " " + left +
                             " while this rank waited for " + site.what);
    }
    if (peer_exited(site.peer)) {
      // A goodbye it wrote on its way out names the root cause; it has
      // landed if the exit is visible, so it is read again first.
      check_peer_aborts(site);
      fail_gone(site);
    }
  }

  // Over UCX's shared memory every sender's messages to this rank (emulated
  // puts and adds, goodbye words among them) pass through one receive queue;
  // a peer killed while writing an entry holds up every entry behind it for
  // good, the awaited peer's data and a surviving peer's abort alike. So a
  // peer on this host that exited without a goodbye fails the wait, whichever
  // peer it awaits: the group has lost it. A goodbye it did send may still
  // be queued: progress reads it first. Not while masking: there only the
  // awaited peer's loss fails a wait. mu_ held.
  void blame_silent_exits(const wait_site& site) {
    if (lost_.masking()) return;
    for (int p = 0; p < world_; ++p) {
      if (p == site.peer || counter(goodbye_slot(p)) != 0 || !peer_exited(p)) continue;
      suppress_latched([&] { progress_locked(); });
      if (counter(goodbye_slot(p)) != 0) continue;
      std::string cause =
          std::string("peer process exited while this rank waited for ") + site.what;
      if (site.peer >= 0) cause += " from peer " + std::to_string(site.peer);
      fail(site.op, p, cause);
    }
  }

  // fail_gone() while masking; otherwise `cause` fails the transport.
  [[noreturn]] void fail_gone_or(const wait_site& site, const std::string& cause) {
    if (lost_.masking()) fail_gone(site);
    fail(site.op, site.peer, cause);
  }

  // A peer gave up on the group (aborted, or closed after a failure): every
  // wait fails, whichever peer it awaits, naming the rank that peer blamed.
  void check_peer_aborts(const wait_site& site) {
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      const std::uint64_t goodbye = counter(goodbye_slot(p));
      if (!is_abort(goodbye)) continue;
      const auto b = proxy::peer_aborted(p, decode_abort(goodbye, world_), rank_, site.what);
      fail(site.op, b.peer, b.cause);
    }
  }

  [[noreturn]] void fail_status(const char* op, int peer, const char* call, ucs_status_t s) {
    fail(op, peer, std::string(call) + " failed: " + ucs_status_string(s));
  }

  // ---- bring-up -----------------------------------------------------------

  void open_worker() {
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) fail_status("ucx setup", no_peer, "ucp_config_read", s);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) fail_status("ucx setup", no_peer, "ucp_init", s);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one thread at a time, under mu_
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) fail_status("ucx setup", no_peer, "ucp_worker_create", s);
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = message_id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = &transport::on_message;
    hp.arg = this;
    s = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (s != UCS_OK) fail_status("ucx setup", no_peer, "ucp_worker_set_am_recv_handler", s);
  }

  void map_memory(const proxy::memory_placement& data_memory) {
    local_[counter_region].memory =
        proxy::symmetric_memory(rank_, "ucx setup", slots_ * counter_bytes, {});
    local_[data_region].memory = proxy::symmetric_memory(rank_, "ucx setup", bytes_, data_memory);
    for (mapped_region& r : local_) {
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
      mp.address = r.memory.data();
      mp.length = r.memory.bytes();
      mp.memory_type = r.memory.on_device() ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
      const ucs_status_t s = ucp_mem_map(context_, &mp, &r.memh);
      if (s != UCS_OK)
        fail_status("ucx setup", no_peer,
                    r.memory.on_device() ? "ucp_mem_map (UCS_MEMORY_TYPE_CUDA)" : "ucp_mem_map", s);
    }
  }

  struct address_release {
    ucp_worker_h worker;
    void operator()(ucp_address_t* a) const { ucp_worker_release_address(worker, a); }
  };
  struct rkey_buffer_release {
    void operator()(void* b) const { ucp_rkey_buffer_release(b); }
  };

  template <bootstrap B>
  void exchange(B& boot, const deadline& dl) {
    ucp_address_t* raw_address = nullptr;
    std::size_t address_bytes = 0;
    ucs_status_t s = ucp_worker_get_address(worker_, &raw_address, &address_bytes);
    if (s != UCS_OK) fail_status("ucx setup", no_peer, "ucp_worker_get_address", s);
    const std::unique_ptr<ucp_address_t, address_release> address(raw_address, {worker_});
    std::unique_ptr<void, rkey_buffer_release> rkeys[2];
    announcement mine{address_bytes, {}, {}, bytes_, self_};
    for (int i : {counter_region, data_region}) {
      void* raw_rkey = nullptr;
      std::size_t rkey_bytes = 0;
      s = ucp_rkey_pack(context_, local_[i].memh, &raw_rkey, &rkey_bytes);
      if (s != UCS_OK) fail_status("ucx setup", no_peer, "ucp_rkey_pack", s);
      rkeys[i].reset(raw_rkey);
      mine.rkey_bytes[i] = rkey_bytes;
      mine.bases[i] = reinterpret_cast<std::uint64_t>(local_[i].memory.data());
    }

    // Sizes first, so that every rank then gathers blocks of one size.
    const auto sizes = boot.all_gather(std::as_bytes(std::span(&mine, 1)), dl);
    std::vector<announcement> all(world_);
    std::memcpy(all.data(), sizes.data(), sizes.size());
    std::size_t max_address = 0, max_rkey[2] = {0, 0};
    for (const auto& a : all) {
      max_address = std::max<std::size_t>(max_address, a.address_bytes);
      for (int i : {counter_region, data_region})
        max_rkey[i] = std::max<std::size_t>(max_rkey[i], a.rkey_bytes[i]);
    }
    // Block: address, counter rkey, data rkey, each at its largest size.
    std::vector<std::byte> block(max_address + max_rkey[0] + max_rkey[1]);
    std::memcpy(block.data(), address.get(), address_bytes);
    std::memcpy(block.data() + max_address, rkeys[0].get(), mine.rkey_bytes[0]);
    std::memcpy(block.data() + max_address + max_rkey[0], rkeys[1].get(), mine.rkey_bytes[1]);
    const auto blob = boot.all_gather(block, dl);
    for (int p = 0; p < world_; ++p) {
      if (all[p].bytes != bytes_)
        fail("ucx setup", p,
             "buffer sizes disagree: " + std::to_string(all[p].bytes) + " bytes there, " +
                 std::to_string(bytes_) + " here");
      processes_[p] = all[p].process;
      if (p == rank_) continue;
      const std::byte* at = blob.data() + static_cast<std::size_t>(p) * block.size();
      connect(p, at, {at + max_address, at + max_address + max_rkey[0]}, all[p]);
    }
  }

  void connect(int p, const std::byte* address, std::array<const std::byte*, 2> rkeys,
               const announcement& a) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(address);
    // Peer failure is reported through UCP_ERR_HANDLING_MODE_PEER, without
    // which UCX aborts the process on a transport error. UCX's shared-memory
    // transports do not support it and refuse such endpoints; with only those
    // selected the mode is NONE (a peer on this host is watched through its
    // pid instead), and a refusal elsewhere falls back to NONE as well.
    ep.err_mode = shared_memory_only_ ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &transport::on_peer_error;
    ep.err_handler.arg = &peers_[p].error_context;
    ucs_status_t s = ucp_ep_create(worker_, &ep, &peers_[p].ep);
    if (s == UCS_ERR_UNREACHABLE && ep.err_mode == UCP_ERR_HANDLING_MODE_PEER) {
      ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      s = ucp_ep_create(worker_, &ep, &peers_[p].ep);
    }
    if (s != UCS_OK) fail_status("ucx setup", p, "ucp_ep_create", s);
    peers_[p].reports_failure = ep.err_mode == UCP_ERR_HANDLING_MODE_PEER;
    // UCX's emulation of RMA reaches device memory; ours does not.
    peers_[p].by_messages = !local_buffer_on_device() && emulates_rma(peers_[p].ep);
    for (int i : {counter_region, data_region}) {
      s = ucp_ep_rkey_unpack(peers_[p].ep, rkeys[i], &peers_[p].rkeys[i]);
      if (s != UCS_OK) fail_status("ucx setup", p, "ucp_ep_rkey_unpack", s);
      peers_[p].bases[i] = a.bases[i];
    }
  }

  // Whether UCX would emulate puts or atomics to this endpoint's peer with
  // messages that the peer answers: no lane of the endpoint carries native
  // RMA ("rma_bw#") or atomics ("amo#") in UCX's own description of it (UCX
  // 1.13 offers no query for it), as over tcp.
  static bool emulates_rma(ucp_ep_h ep) {
    char* text = nullptr;
    std::size_t size = 0;
    FILE* stream = open_memstream(&text, &size);
    if (stream == nullptr) return true;
    ucp_ep_print_info(ep, stream);
    std::fclose(stream);
    const std::string_view lanes(text, size);
    const bool native = lanes.find("rma_bw#") != std::string_view::npos &&
                        lanes.find("amo#") != std::string_view::npos;
    std::free(text);
    return !native;
  }

  void close() {
    // After a failure what is still queued may be bound for a rank that is
    // gone and will never take it: the wait for it is short.
    const auto bound = failure_.failed() || aborted() ? std::chrono::milliseconds(200)
                                                      : std::chrono::milliseconds(2'000);
    const deadline dl = deadline::after(std::min(timeout_, bound));
    // Replies still awaited will not be served now.
    for (int p = 0; p < world_; ++p) give_up_flushes(p);
    // Requests that can no longer complete (a peer failed) are cancelled, so
    // that their callbacks run and UCX gets them back.
    if (worker_ != nullptr && outstanding_ != 0) {
      for (auto& op : pool_)
        if (op->request != nullptr) ucp_request_cancel(worker_, op->request);
      while (outstanding_ != 0 && !dl.expired()) ucp_worker_progress(worker_);
    }
    for (int p = 0; p < world_; ++p) disconnect(p);
    bool closed = true;
    for (ucs_status_ptr_t r : closing_) closed = settle(r, dl) && closed;
    closing_.clear();
    // Closing leaves work of UCX's own (discarding transport endpoints) that
    // progress finishes; destroying the worker before would leak it.
    while (worker_ != nullptr && ucp_worker_progress(worker_) != 0 && !dl.expired()) {
    }
    // An endpoint whose peer cannot force-close (shared memory: error mode
    // NONE) and still holds requests for a rank that has died never finishes
    // closing, and destroying the worker would purge those requests, which
    // UCX 1.13 treats as a bug ("stubs.c:102 Assertion '0'" under
    // uct_mm_ep_pending_purge, 1 survivor in 100 of the fault stress over
    // UCX_TLS=sm): the process would die. Then the worker and its context
    // are left as they are, never progressed again, a bounded leak (one
    // worker per transport that lost a peer so) that the process survives.
    if (worker_ != nullptr && (!closed || outstanding_ != 0)) {
      ++abandoned_workers();
      worker_ = nullptr;
      context_ = nullptr;
      return;
    }
    for (mapped_region& r : local_) {
      if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
      r.memh = nullptr;
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
    worker_ = nullptr;
    context_ = nullptr;
  }

  // Progresses until the request `r` (from an _nbx call) is done, or dl;
  // whether it is done.
  bool settle(ucs_status_ptr_t r, const deadline& dl) {
    if (r == nullptr || UCS_PTR_IS_ERR(r)) return true;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && !dl.expired())
      ucp_worker_progress(worker_);
    if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
    ucp_request_free(r);
    return true;
  }

  // ---- data path (mu_ held) -----------------------------------------------

  op_record* acquire(int peer, std::uint64_t ticket) {
    if (free_.empty()) {
      pool_.push_back(std::make_unique<op_record>());
      free_.push_back(pool_.back().get());
    }
    op_record* op = free_.back();
    free_.pop_back();
    *op = op_record{this, peer, ticket, 0, {}, "", nullptr};
    ++outstanding_;
    return op;
  }

  // Masking: a peer lost meanwhile (UCX may have run its error callback
  // inside the call just made for the same operation, a put before a signal)
  // gets nothing more, and this part of the operation counts complete.
  bool skipped_lost(int peer, std::uint64_t ticket) {
    if (!lost(peer)) return false;
    if (ticket != no_ticket) tickets_.complete(ticket);
    return true;
  }

  // The endpoint to `peer`, unless disconnect() closed it after a failure.
  ucp_ep_h endpoint(const char* op, int peer) {
    if (peers_[peer].ep == nullptr)
      fail(op, peer, "the connection to peer " + std::to_string(peer) + " failed earlier");
    return peers_[peer].ep;
  }

  ucp_request_param_t request_param(op_record* op) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = &transport::on_done;
    rp.user_data = op;
    return rp;
  }

  void post_put(int peer, std::size_t local_off, std::size_t remote_off, std::size_t bytes,
                std::uint64_t ticket) {
    if (skipped_lost(peer, ticket)) return;
    const ucp_ep_h ep = endpoint("put", peer);
    const auto& p = peers_[peer];
    if (p.by_messages) {
      send_message(peer, message_kind::write, data_region, remote_off, ticket, data() + local_off,
                   bytes);
      return;
    }
    op_record* op = acquire(peer, ticket);
    const ucp_request_param_t rp = request_param(op);
    track(op,
          ucp_put_nbx(ep, data() + local_off, bytes, p.bases[data_region] + remote_off,
                      p.rkeys[data_region], &rp),
          "ucp_put_nbx");
  }

  // Goodbye words are abort words (transport/peer_abort.hpp): 0 still here,
  // left_cleanly_word left after its work, encode_abort(c) aborted or left
  // after a failure blamed on c.

  // Sets this rank's goodbye word at `peer` with a put, after everything
  // issued before has completed there (the fence). Once per peer.
  void post_goodbye(int peer, std::uint64_t word) {
    said_goodbye_[peer] = true;
    const ucp_ep_h ep = endpoint("ucx teardown", peer);
    const auto& p = peers_[peer];
    if (p.by_messages) {
      send_message(peer, message_kind::write, counter_region, goodbye_slot(rank_) * counter_bytes,
                   no_ticket, nullptr, counter_bytes, word);
      return;
    }
    const ucs_status_t s = ucp_worker_fence(worker_);
    if (s != UCS_OK) fail_status("ucx teardown", peer, "ucp_worker_fence", s);
    op_record* op = acquire(peer, no_ticket);
    op->operand = word;
    const ucp_request_param_t rp = request_param(op);
    track(op,
          ucp_put_nbx(ep, &op->operand, sizeof op->operand,
                      p.bases[counter_region] + goodbye_slot(rank_) * counter_bytes,
                      p.rkeys[counter_region], &rp),
          "ucp_put_nbx");
  }

  void post_signal(int peer, std::size_t slot, std::uint64_t n, std::uint64_t ticket) {
    if (skipped_lost(peer, ticket)) return;
    const ucp_ep_h ep = endpoint("ucx signal", peer);
    const auto& p = peers_[peer];
    if (p.by_messages) {
      // The target applies it after every message sent to it before.
      send_message(peer, message_kind::add, counter_region, slot * counter_bytes, ticket, nullptr,
                   0, n);
      return;
    }
    // Everything issued before completes at its target before the add.
    const ucs_status_t s = ucp_worker_fence(worker_);
    if (s != UCS_OK) fail_status("ucx signal", peer, "ucp_worker_fence", s);
    op_record* op = acquire(peer, ticket);
    op->operand = n;
    ucp_request_param_t rp = request_param(op);
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    rp.datatype = ucp_dt_make_contig(sizeof(std::uint64_t));
    track(op,
          ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &op->operand, 1,
                            p.bases[counter_region] + slot * counter_bytes, p.rkeys[counter_region],
                            &rp),
          "ucp_atomic_op_nbx");
  }

  // Sends the next message to `peer` (messages.hpp), eager so that the
  // target never answers it; `ticket` completes once UCX is done with the
  // payload: `bytes` from `payload`, or with payload null the 8-byte `value`.
  void send_message(int peer, message_kind kind, std::uint32_t region, std::uint64_t offset,
                    std::uint64_t ticket, const std::byte* payload, std::size_t bytes,
                    std::uint64_t value = 0) {
    op_record* op = acquire(peer, ticket);
    op->operand = value;
    op->header = {kind, region, rank_, 0, ++peers_[peer].sent, offset, value};
    ucp_request_param_t rp = request_param(op);
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_EAGER;
    const void* from = payload != nullptr ? static_cast<const void*>(payload) : &op->operand;
    track(op,
          ucp_am_send_nbx(peers_[peer].ep, message_id, &op->header, sizeof op->header, from, bytes,
                          &rp),
          "ucp_am_send_nbx");
  }

  // UCX's handler for our messages, inside ucp_worker_progress (mu_ held).
  static ucs_status_t on_message(void* arg, const void* header, std::size_t header_bytes,
                                 void* data, std::size_t bytes, const ucp_am_recv_param_t* param) {
    static_cast<transport*>(arg)->receive(header, header_bytes, data, bytes, param->recv_attr);
    return UCS_OK;
  }

  void receive(const void* header, std::size_t header_bytes, const void* data, std::size_t bytes,
               std::uint64_t attributes) {
    message_header h;
    if (header_bytes != sizeof h) return park(no_peer, "a message with a malformed header");
    std::memcpy(&h, header, sizeof h);
    if (h.sender < 0 || h.sender >= world_ || h.sender == rank_)
      return park(no_peer, "a message from no peer (rank " + std::to_string(h.sender) + ")");
    if ((attributes & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0)
      return park(h.sender, "a message that came by rendezvous, not eagerly");
    // A lost peer is masked: nothing more of its lands.
    if (lost(h.sender)) return;
    try {
      deliveries_[h.sender].deliver(
          rank_, h, {static_cast<const std::byte*>(data), bytes},
          [&](const message_header& m, std::span<const std::byte> payload) { apply(m, payload); });
    } catch (const error& e) {
      if (!deferred_error_) deferred_error_ = e;
    }
  }

  void apply(const message_header& h, std::span<const std::byte> payload) {
    const auto refuse = [&](const std::string& what) {
      throw error(rank_, "ucx message", h.sender, what);
    };
    const bool to_counter = h.region == counter_region;
    if (h.kind == message_kind::write || h.kind == message_kind::add) {
      if (!to_counter && h.region != data_region)
        refuse("a message to region " + std::to_string(h.region));
      const std::size_t size = to_counter ? slots_ * counter_bytes : bytes_;
      const std::size_t length = h.kind == message_kind::add ? counter_bytes : payload.size();
      if (h.offset > size || length > size - h.offset)
        refuse("a message past the end of its region (offset " + std::to_string(h.offset) + ", " +
               std::to_string(length) + " bytes, region of " + std::to_string(size) + ")");
      if (to_counter && (h.offset % counter_bytes != 0 || length != counter_bytes))
        refuse("a message to the counters that is not one aligned word");
      if (!to_counter && local_buffer_on_device())
        refuse("a write message to a buffer in device memory");
    }
    const std::size_t slot = h.offset / counter_bytes;
    switch (h.kind) {
      case message_kind::write:
        if (to_counter) {
          std::uint64_t word;
          std::memcpy(&word, payload.data(), sizeof word);
          std::atomic_ref<std::uint64_t>(*counter_word(slot))
              .store(word, std::memory_order_release);
        } else {
          std::memcpy(data() + h.offset, payload.data(), payload.size());
        }
        return;
      case message_kind::add:
        if (!to_counter) refuse("an add outside the counters");
        add_local(slot, h.value);
        return;
      case message_kind::flush_request:
        flush_replies_.push_back({h.sender, h.value});
        return;
      case message_kind::flush_reply: {
        auto& waiting = peers_[h.sender].flushes;
        if (waiting.empty() || waiting.front()->ticket != h.value)
          refuse("a reply to flush " + std::to_string(h.value) + ", which is not the next one");
        op_record* op = waiting.front();
        waiting.pop_front();
        finish(op, UCS_OK);
        return;
      }
    }
    refuse("a message of unknown kind " + std::to_string(static_cast<std::uint32_t>(h.kind)));
  }

  void park(int peer, const std::string& what) {
    if (!deferred_error_) deferred_error_ = error(rank_, "ucx message", peer, "received " + what);
  }

  // Flush requests applied during progress are answered after it, through
  // the requester's endpoint unless that has gone (its failure is reported
  // there, and nobody awaits the reply).
  void send_flush_replies() {
    // Taken first: a send that throws leaves none to be sent twice.
    for (const auto& [peer, ticket] : std::exchange(flush_replies_, {}))
      if (peers_[peer].ep != nullptr && !lost(peer))
        send_message(peer, message_kind::flush_reply, 0, 0, no_ticket, nullptr, 0, ticket);
  }

  // By messages: flushes to `peer` whose reply will not come count complete;
  // whoever gave up on the peer reports why.
  void give_up_flushes(int peer) {
    auto& waiting = peers_[peer].flushes;
    while (!waiting.empty()) {
      op_record* op = waiting.front();
      waiting.pop_front();
      finish(op, UCS_OK);
    }
  }

  // Finishes `op` now if UCX completed it inline, else when its callback runs.
  void track(op_record* op, ucs_status_ptr_t r, const char* call) {
    op->call = call;
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) op->request = r;
    if (r == nullptr) {
      finish(op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(r)) {
      const int peer = op->peer;
      finish(op, UCS_OK);
      if (lost_.masking() && peer != no_peer) {
        lose(peer, std::string(call) + " failed: " + ucs_status_string(UCS_PTR_STATUS(r)));
        return;
      }
      fail_status("ucx operation", peer, call, UCS_PTR_STATUS(r));
    }
  }

  void finish(op_record* op, ucs_status_t status) {
    if (status != UCS_OK && lost_.masking())
      lose(op->peer, std::string(op->call) + " completed with: " + ucs_status_string(status));
    else if (status != UCS_OK && !deferred_error_)
      deferred_error_ =
          error(rank_, "ucx operation", op->peer,
                std::string(op->call) + " completed with: " + ucs_status_string(status) + " (" +
                    name_ + ")");
    if (op->ticket != no_ticket) tickets_.complete(op->ticket);
    op->request = nullptr;
    free_.push_back(op);
    --outstanding_;
  }

  static void on_done(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<op_record*>(user_data);
    op->self->finish(op, status);
    ucp_request_free(request);
  }

  static void on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* ctx = static_cast<peer_ref*>(arg);
    transport& self = *ctx->self;
    self.disconnect(ctx->peer);
    if (self.lost_.masking()) {
      self.lose(ctx->peer, std::string("endpoint failed: ") + ucs_status_string(status));
      return;
    }
    // A peer that said goodbye closed its end on purpose.
    if (self.counter(self.goodbye_slot(ctx->peer)) != 0) return;
    if (!self.deferred_error_)
      self.deferred_error_ = error(
          self.rank_, "ucx peer", ctx->peer,
          std::string("endpoint failed: ") + ucs_status_string(status) + " (" + self.name_ + ")");
  }

  // Starts closing the endpoint to `peer`; close() settles it, and its
  // flushes awaiting a reply count complete. The error callback calls it at
  // once for a failed peer: where UCX still emulates RMA (device memory over
  // tcp), a request from the failed peer delivered afterwards would be
  // answered through the failed endpoint, which UCX treats as fatal
  // (messages.hpp); without the endpoint it finds nobody to answer and is
  // dropped.
  void disconnect(int peer) {
    give_up_flushes(peer);
    peer_state& p = peers_[peer];
    if (p.ep == nullptr) return;
    for (ucp_rkey_h& k : p.rkeys) {
      if (k != nullptr) ucp_rkey_destroy(k);
      k = nullptr;
    }
    // Forced where the endpoint reports peer failures (UCX refuses it
    // elsewhere): a peer that has gone must not hold it up.
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = p.reports_failure ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    closing_.push_back(ucp_ep_close_nbx(p.ep, &rp));
    p.ep = nullptr;
  }

  // Callbacks cannot throw through UCX: they park the error, which is
  // latched and thrown once ucp_worker_progress has returned.
  void progress_locked() {
    for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
    }
    send_flush_replies();
    if (lost_.masking()) close_lost_endpoints();
    if (deferred_error_) {
      const error e = *deferred_error_;
      deferred_error_.reset();
      failure_.latch(e);
      throw e;
    }
  }

  // ---- lost peers (mask_lost_peers; mu_ held) ------------------------------

  bool lost(int peer) const { return lost_.lost(peer); }

  // Marks `peer` lost (`cause`: how; empty: its process exited). Its endpoint
  // is closed by the next progress (not here: this may run inside a UCX
  // callback), which completes its requests.
  void lose(int peer, std::string cause) {
    if (peer != no_peer && peer != rank_) lost_.mark(peer, std::move(cause));
  }

  // Peers whose process exited are lost too, and lost peers' endpoints are
  // closed, forced, which completes their requests.
  void close_lost_endpoints() {
    find_exited_peers([&](int p) { lose(p, {}); });
    for (int p = 0; p < world_; ++p)
      if (lost(p)) disconnect(p);
  }

  std::size_t slots_;                // user slots, then per rank one barrier and one goodbye slot
  bool shared_memory_only_ = false;  // UCX_TLS names shared-memory transports only

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  mapped_region local_[2];  // counter_region, data_region

  std::optional<error> deferred_error_;
  std::vector<peer_state> peers_;
  std::vector<bool> said_goodbye_;             // this rank's goodbye is out to that peer
  std::vector<in_order_delivery> deliveries_;  // per sender, its messages to this rank
  std::vector<std::pair<int, std::uint64_t>> flush_replies_;  // (requester, ticket) to answer
  std::vector<ucs_status_ptr_t> closing_;                     // endpoints being closed (disconnect)
  std::vector<std::unique_ptr<op_record>> pool_;
  std::vector<op_record*> free_;
  std::size_t outstanding_ = 0;           // requests not yet completed
  steady::time_point next_abort_scan_{};  // progress() looks for peers' aborts from then on
};

static_assert(rma_transport<transport>);
static_assert(has_completion_count<transport>);
static_assert(has_abort<transport>);
static_assert(has_serve<transport>);
static_assert(gpu_fed_transport<transport>);
static_assert(has_lost_peer_masking<transport>);

}  // namespace epcomm::ucx
