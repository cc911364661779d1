// The proxy engine: one host thread that drains descriptor rings (one per
// producer channel) and drives an RMA transport. It issues each descriptor as
// one transport operation, keeps the transport progressing (incoming signals
// on fabrics with manual progress depend on it), and retires descriptors in
// ticket order once the transport reports their operations complete.
//
// From construction on, the engine must be the only caller of the
// transport's put, put_signal, signal_add and flush: it numbers operations the
// way the transport does to know which descriptor a completion retires.
//
// A transport error stops the proxy: the error is latched here and in the
// rings' `failed` words, and every later push or quiet rethrows it. Waits on
// signals learn of it from the transport, which latches its own errors. A
// transport that can serve() (progress without issuing anything) is still
// progressed until the engine is destroyed, so that peers' operations on this
// rank's memory complete even after it failed or aborted.
//
// stop() (and destruction) waits for the thread, unless it has been inside
// one transport call for longer than stuck_after: calls never block on a
// peer, so such a thread is stuck in the provider, most likely for good
// (over libfabric's shm provider: spinning on a lock a dead peer held). It
// is detached, not joined: the process leaks a spinning thread instead of
// hanging (abandoned_threads()), and the engine's owner leaks the engine and
// its transport with it (transport_with_proxy.hpp), so that a call that does
// return finds them where they were, not freed or their memory reused.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/failure_latch.hpp"
#include "epcomm/core/spin_wait.hpp"
#include "epcomm/proxy/channel.hpp"
#include "epcomm/proxy/ring.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm::proxy {

struct engine_options {
  // Rings the engine allocates (host producers); ignored by the constructor
  // that takes the caller's rings.
  int channels = 1;                    // producers, one ring each
  std::uint64_t ring_capacity = 1024;  // descriptors per ring, a power of two
  // When there is nothing to do the proxy spins, then yields, then sleeps in
  // growing steps up to this long (0: never sleeps, lowest latency).
  std::chrono::microseconds max_idle_sleep{50};
  // How long destruction waits for descriptors still in flight.
  std::chrono::milliseconds drain_timeout{5'000};
};

template <has_completion_count T>
class engine;

// A host producer's handle with the calls of a kernel's channel_writer that
// the routes use (put, put_signal, signal), so that the code that decides what to
// push is written once for both (normal/route.hpp, low_latency/route.hpp).
// Each call pushes through engine::push, which throws the proxy's error or
// a deadline error; a call that returns has pushed, and returns ok.
template <has_completion_count T>
class engine_writer {
 public:
  engine_writer(engine<T>& e, int channel, const deadline& dl)
      : e_(e), channel_(channel), dl_(dl) {}

  channel_status put(int peer, std::uint64_t local_offset, std::uint64_t remote_offset,
                     std::uint64_t bytes) {
    return push(op_code::put, peer, local_offset, remote_offset, bytes, 0, 0);
  }
  channel_status put_signal(int peer, std::uint64_t local_offset, std::uint64_t remote_offset,
                            std::uint64_t bytes, std::uint64_t slot, std::uint64_t n) {
    return push(op_code::put_signal, peer, local_offset, remote_offset, bytes, slot, n);
  }
  channel_status signal(int peer, std::uint64_t slot, std::uint64_t n) {
    return push(op_code::signal, peer, 0, 0, 0, slot, n);
  }

 private:
  channel_status push(op_code op, int peer, std::uint64_t local_offset, std::uint64_t remote_offset,
                      std::uint64_t bytes, std::uint64_t slot, std::uint64_t n) {
    e_.push(channel_, op, peer, local_offset, remote_offset, bytes, slot, n, dl_);
    return channel_status::ok;
  }

  engine<T>& e_;
  int channel_;
  deadline dl_;
};

template <has_completion_count T>
class engine {
 public:
  // Allocates opt.channels rings in host memory, for host producers (push,
  // quiet).
  engine(T& transport, const engine_options& opt = {})
      : transport_(transport), opt_(opt), issued_(transport.completed()) {
    if (opt.channels < 1) throw error(transport.rank(), "proxy", no_peer, "channels must be >= 1");
    check_capacity(opt.ring_capacity);
    for (int c = 0; c < opt.channels; ++c) {
      const std::size_t bytes = ring_bytes(opt.ring_capacity);
      auto* memory = static_cast<std::byte*>(::operator new (bytes, std::align_val_t{64}));
      std::fill_n(memory, bytes, std::byte{0});
      rings_.emplace_back(memory);
      views_.push_back(ring_view::over(memory, opt.ring_capacity));
    }
    thread_ = std::thread([this] { run(); });
  }

  // Drains rings whose memory the caller owns and keeps alive longer than
  // the engine, each laid out by ring_view::over: pinned host memory that
  // CUDA kernels write (cuda/proxy_rings.hpp), producers writing through a
  // proxy::channel. One ring per channel, in the order given.
  engine(T& transport, std::span<const ring_view> rings, const engine_options& opt = {})
      : transport_(transport),
        opt_(opt),
        views_(rings.begin(), rings.end()),
        issued_(transport.completed()) {
    if (views_.empty()) throw error(transport.rank(), "proxy", no_peer, "no rings to drain");
    for (const ring_view& r : views_) check_capacity(r.header->capacity);
    thread_ = std::thread([this] { run(); });
  }

  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Waits (up to drain_timeout) for what is in flight, then stops the
  // thread. True once it has ended; false when it is left behind, stuck in
  // a transport call: it may still come back to this engine and its
  // transport at any time, so their owner keeps both allocated for the
  // process's life (proxy/transport_with_proxy.hpp). Later calls return the
  // same answer.
  bool stop() {
    if (!thread_.joinable()) return !left_behind_;
    stop_.store(true, std::memory_order_release);
    while (!finished_.load(std::memory_order_acquire)) {
      const auto since = call_since_.load(std::memory_order_acquire);
      if (since != 0 && steady::now().time_since_epoch().count() - since > stuck_after_ticks()) {
        thread_.detach();
        left_behind_ = true;
        abandoned_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    thread_.join();
    return true;
  }

  // An owner that cannot keep the engine (a test's) still never waits on a
  // stuck thread; one that can calls stop() first.
  ~engine() { stop(); }

  // Proxy threads of this process left behind by stop(), stuck in a
  // transport call.
  static std::size_t abandoned_threads() { return abandoned_.load(std::memory_order_relaxed); }

  int channels() const { return static_cast<int>(views_.size()); }
  // The ring of `channel`, for producers that write descriptors themselves.
  ring_view ring(int channel) const { return views_.at(channel); }

  // Host producer of `channel`: enqueues one descriptor, waiting while the
  // ring is full. Throws the proxy's error if it has stopped.
  void push(int channel, op_code op, int peer, std::uint64_t local_offset,
            std::uint64_t remote_offset, std::uint64_t bytes, std::uint64_t signal_slot,
            std::uint64_t signal_value, const deadline& dl) {
    failure_.rethrow();
    const ring_view r = views_.at(channel);
    auto pushed = [&] {
      return try_push(r, op, peer, local_offset, remote_offset, bytes, signal_slot, signal_value);
    };
    if (!epcomm::detail::spin_wait(pushed, dl, [&] { failure_.rethrow(); }))
      throw error(transport_.rank(), "proxy push", peer,
                  "deadline expired: the ring of channel " + std::to_string(channel) +
                      " stayed full (" + std::to_string(r.header->capacity) +
                      " descriptors in flight)");
  }

  // Host producer of `channel`: push() behind a channel_writer's interface.
  engine_writer<T> writer(int channel, const deadline& dl) { return {*this, channel, dl}; }

  // Host producer of `channel`: returns once every descriptor it pushed is
  // complete, so the bytes they read may be overwritten.
  void quiet(int channel, const deadline& dl) {
    const ring_view r = views_.at(channel);
    if (!epcomm::detail::spin_wait([&] { return drained(r); }, dl, [&] { failure_.rethrow(); })) {
      failure_.rethrow();
      const std::string incomplete =
          std::to_string(r.header->head - load_acquire(&r.header->tail)) +
          " operations of channel " + std::to_string(channel) + " incomplete";
      // A peer that exited is why, when one has: the proxy thread may be
      // held in the provider on a lock it held (libfabric's shm provider).
      if constexpr (has_peer_exit<T>)
        for (int p = 0; p < transport_.world_size(); ++p)
          if (p != transport_.rank() && transport_.peer_exited(p))
            throw error(transport_.rank(), "proxy quiet", p,
                        "peer process exited; waited out the deadline with " + incomplete);
      throw error(transport_.rank(), "proxy quiet", no_peer, "deadline expired with " + incomplete);
    }
    failure_.rethrow();
  }

  bool failed() const { return failure_.failed(); }
  void rethrow() const { failure_.rethrow(); }

 private:
  struct channel_state {
    explicit channel_state(ring_view r) : consumer(r) {}
    ring_consumer consumer;
    std::deque<std::uint64_t> tickets;  // transport operation of each read, unretired descriptor
  };

  void check_capacity(std::uint64_t capacity) const {
    if (!valid_capacity(capacity))
      throw error(transport_.rank(), "proxy", no_peer,
                  "ring_capacity must be a power of two >= 2, got " + std::to_string(capacity));
  }

  struct aligned_delete {
    void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{64}); }
  };

  static constexpr std::chrono::seconds stuck_after{2};
  static steady::rep stuck_after_ticks() {
    return std::chrono::duration_cast<steady::duration>(stuck_after).count();
  }

  // Runs one transport call, saying when it began for the destructor.
  template <class F>
  decltype(auto) in_call(F&& f) {
    call_since_.store(steady::now().time_since_epoch().count(), std::memory_order_release);
    struct ended {
      std::atomic<steady::rep>& since;
      ~ended() { since.store(0, std::memory_order_release); }
    } end{call_since_};
    return f();
  }

  void run() {
    std::vector<channel_state> channels;
    for (const auto& v : views_) channels.emplace_back(v);
    std::optional<error> stopped;
    try {
      drive(channels);
    } catch (const error& e) {
      stopped = e;
    } catch (const std::exception& e) {
      stopped = error(transport_.rank(), "proxy", no_peer, e.what());
    }
    if (stopped) {
      // Rings first: whoever sees failed(), or gets the error from push or
      // quiet, then finds every ring marked too, so that channels report it.
      for (auto& c : channels) c.consumer.mark_failed();
      failure_.latch(*stopped);
      serve_until_stopped();
    }
    finished_.store(true, std::memory_order_release);
  }

  // After a failure nothing more is issued, but peers may still be writing
  // to this rank: over UCX's emulated RMA (tcp) and libfabric's rxm their
  // operations complete only when this rank progresses, and UCX aborts a
  // process that, at its own teardown, finds requests whose senders have
  // meanwhile closed. So the transport keeps being served until the buffer
  // that owns this engine goes away.
  void serve_until_stopped() {
    if constexpr (has_serve<T>) {
      auto sleep = std::chrono::microseconds(1);
      while (!stop_.load(std::memory_order_acquire)) {
        in_call([&] { transport_.serve(); });
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(1'000));
      }
    }
  }

  void drive(std::vector<channel_state>& channels) {
    int idle = 0;
    auto sleep = std::chrono::microseconds(1);
    std::optional<steady::time_point> drain_until;
    for (;;) {
      bool busy = false;
      for (auto& c : channels) {
        descriptor d;
        while (c.consumer.pop(d)) {
          in_call([&] { issue(d); });
          c.tickets.push_back(++issued_);
          busy = true;
        }
      }
      in_call([&] { transport_.progress(); });
      const std::uint64_t done = in_call([&] { return transport_.completed(); });
      bool pending = false;
      for (auto& c : channels) {
        std::uint64_t n = 0;
        while (!c.tickets.empty() && c.tickets.front() <= done) {
          c.tickets.pop_front();
          ++n;
        }
        if (n != 0) {
          c.consumer.retire(n);
          busy = true;
        }
        pending = pending || !c.tickets.empty();
      }
      if (stop_.load(std::memory_order_acquire)) {
        if (!pending) return;
        if (!drain_until) drain_until = steady::now() + opt_.drain_timeout;
        if (steady::now() >= *drain_until)
          throw error(transport_.rank(), "proxy shutdown", no_peer,
                      "operations still incomplete after the drain timeout");
      }
      if (busy) {
        idle = 0;
        sleep = std::chrono::microseconds(1);
        continue;
      }
      ++idle;
      if (idle < 64) {
        epcomm::detail::cpu_relax();
      } else if (idle < 64 + 256 || opt_.max_idle_sleep.count() == 0) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, opt_.max_idle_sleep);
      }
    }
  }

  void issue(const descriptor& d) {
    const int world = transport_.world_size();
    if (d.peer < 0 || d.peer >= world)
      throw error(transport_.rank(), "proxy", no_peer,
                  "descriptor names peer " + std::to_string(d.peer) + ", outside [0, " +
                      std::to_string(world) + ")");
    switch (static_cast<op_code>(d.op)) {
      case op_code::put:
        transport_.put(d.peer, d.local_offset, d.remote_offset, d.bytes);
        return;
      case op_code::put_signal:
        transport_.put_signal(d.peer, d.local_offset, d.remote_offset, d.bytes, d.signal_slot,
                              d.signal_value);
        return;
      case op_code::signal:
        transport_.signal_add(d.peer, d.signal_slot, d.signal_value);
        return;
      case op_code::flush:
        transport_.flush(d.peer);
        return;
    }
    throw error(transport_.rank(), "proxy", d.peer,
                "descriptor has unknown op code " + std::to_string(d.op));
  }

  T& transport_;
  engine_options opt_;
  std::vector<std::unique_ptr<std::byte, aligned_delete>> rings_;
  std::vector<ring_view> views_;
  std::uint64_t issued_;  // transport operations started (proxy thread only)
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};       // run() has returned but for its last instruction
  std::atomic<steady::rep> call_since_{0};  // when the running transport call began; 0: none
  bool left_behind_ = false;                // stop() detached the thread (owner's thread only)
  inline static std::atomic<std::size_t> abandoned_{0};
  failure_latch failure_;
  std::thread thread_;
};

}  // namespace epcomm::proxy
