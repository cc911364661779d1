// The proxy's descriptor ring and engine, without a network: the ring's
// memory layout (part of the producer/proxy wire format), ordering and
// back-pressure between a producer and a consumer thread, and the engine
// driving a scripted transport that completes operations out of order, can
// fail on demand, and can get stuck in a call for good.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "epcomm/proxy/channel.hpp"
#include "epcomm/proxy/engine.hpp"
#include "epcomm/proxy/ring.hpp"
#include "epcomm/proxy/transport_with_proxy.hpp"
#include "epcomm/transport/rma/completion_window.hpp"

using namespace epcomm;
using namespace std::chrono_literals;

namespace {

// Ring memory as a producer outside the engine would provide it: 64-byte
// aligned and zeroed.
struct test_ring {
  struct aligned_delete {
    void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{64}); }
  };
  explicit test_ring(std::uint64_t capacity)
      : memory(static_cast<std::byte*>(
            ::operator new (proxy::ring_bytes(capacity), std::align_val_t{64}))),
        view((std::memset(memory.get(), 0, proxy::ring_bytes(capacity)),
              proxy::ring_view::over(memory.get(), capacity))) {}
  std::unique_ptr<std::byte, aligned_delete> memory;
  proxy::ring_view view;
};

template <class F>
bool eventually(F&& f, std::chrono::milliseconds within = 10s) {
  const auto until = steady::now() + within;
  while (steady::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(100us);
  }
  return f();
}

// A future nobody fulfils: its promise is never destroyed (which would make
// it ready), and stays reachable.
std::shared_future<void> never_ready() {
  static auto* const unfulfilled = new std::promise<void>;
  static const std::shared_future<void> future = unfulfilled->get_future().share();
  return future;
}

// A transport whose operations complete only when the test says so, in any
// order, and which records what it was asked to do.
class scripted_transport {
 public:
  struct op {
    proxy::op_code code;
    int peer;
    std::size_t local, remote, bytes, slot;
    std::uint64_t n;
  };

  int rank() const { return 0; }
  int world_size() const { return 4; }
  std::span<std::byte> local_buffer() { return {}; }
  void wait(std::size_t, std::uint64_t, deadline, wait_site) {}
  void barrier(deadline) {}

  void put(int peer, std::size_t local, std::size_t remote, std::size_t bytes) {
    record({proxy::op_code::put, peer, local, remote, bytes, 0, 0});
    if (stuck_puts_.load()) {
      const std::shared_future<void> until = stuck_until_;
      in_stuck_put_.store(true);
      until.wait();
    }
  }
  void put_signal(int peer, std::size_t local, std::size_t remote, std::size_t bytes,
                  std::size_t slot, std::uint64_t n) {
    record({proxy::op_code::put_signal, peer, local, remote, bytes, slot, n});
  }
  void signal_add(int peer, std::size_t slot, std::uint64_t n) {
    record({proxy::op_code::signal, peer, 0, 0, 0, slot, n});
  }
  void flush(int peer) { record({proxy::op_code::flush, peer, 0, 0, 0, 0, 0}); }

  void progress() {
    progress_calls_.fetch_add(1);
    std::lock_guard lock(mu_);
    if (fail_next_progress_) {
      fail_next_progress_ = false;
      throw error(0, "scripted progress", 2, "the peer went away");
    }
  }
  std::uint64_t completed() const {
    std::lock_guard lock(mu_);
    return window_.watermark();
  }

  // Completes operation `index` (0-based); the others stay pending. The
  // engine issues from its own thread: wait until it has issued that one.
  void complete(std::uint64_t index) {
    REQUIRE(eventually([&] { return issued_count() > index; }));
    std::lock_guard lock(mu_);
    window_.complete(index);
  }
  std::uint64_t issued_count() const {
    std::lock_guard lock(mu_);
    return window_.opened();
  }
  std::vector<op> issued() const {
    std::lock_guard lock(mu_);
    return ops_;
  }
  void fail_progress() {
    std::lock_guard lock(mu_);
    fail_next_progress_ = true;
  }
  // Puts from now on stay in the call until `until` is ready. By default
  // never, as a provider call spinning on a lock a dead process held.
  void stick_puts(std::shared_future<void> until = never_ready()) {
    stuck_until_ = std::move(until);
    stuck_puts_.store(true);
  }
  bool in_stuck_put() const { return in_stuck_put_.load(); }
  std::uint64_t progress_calls() const { return progress_calls_.load(); }

  // has_peer_exit: a peer's process is gone once the test says so.
  void exit_peer(int peer) { exited_.fetch_or(1u << peer); }
  bool peer_exited(int peer) const { return (exited_.load() >> peer & 1u) != 0; }

  // has_leave_open: only records that it was called.
  void leave_open() noexcept { left_open_.store(true); }
  bool left_open() const { return left_open_.load(); }

 private:
  void record(const op& o) {
    std::lock_guard lock(mu_);
    ops_.push_back(o);
    window_.open(1);
  }

  mutable std::mutex mu_;
  std::vector<op> ops_;
  proxy::completion_window window_;
  bool fail_next_progress_ = false;
  std::shared_future<void> stuck_until_;  // written before stuck_puts_ is set, read after
  std::atomic<bool> stuck_puts_{false}, in_stuck_put_{false}, left_open_{false};
  std::atomic<std::uint64_t> progress_calls_{0};
  std::atomic<unsigned> exited_{0};  // bit per peer
};

static_assert(has_completion_count<scripted_transport>);
static_assert(has_leave_open<scripted_transport>);
static_assert(has_peer_exit<scripted_transport>);

}  // namespace

TEST_CASE("the ring's layout is fixed: producers on the device share it") {
  CHECK(sizeof(proxy::descriptor) == 64);
  CHECK(alignof(proxy::descriptor) == 64);
  CHECK(sizeof(proxy::ring_header) == 192);
  CHECK(proxy::ring_bytes(8) == 192 + 8 * 64);
  test_ring r(8);
  CHECK(reinterpret_cast<std::byte*>(r.view.slots) ==
        reinterpret_cast<std::byte*>(r.view.header) + sizeof(proxy::ring_header));
  CHECK(r.view.header->capacity == 8);
  CHECK(proxy::valid_capacity(2));
  CHECK(proxy::valid_capacity(1024));
  CHECK_FALSE(proxy::valid_capacity(0));
  CHECK_FALSE(proxy::valid_capacity(1));
  CHECK_FALSE(proxy::valid_capacity(12));
}

TEST_CASE("a full ring refuses, retiring frees slots, order and fields survive wrap-around") {
  test_ring r(4);
  proxy::ring_consumer consumer(r.view);
  proxy::descriptor d{};
  CHECK_FALSE(consumer.pop(d));
  std::uint64_t pushed = 0, popped = 0;
  for (int round = 0; round < 5; ++round) {
    while (proxy::try_push(r.view, proxy::op_code::put_signal, static_cast<int>(pushed % 3),
                           pushed * 8, pushed * 16, pushed + 1, pushed % 5, pushed + 7))
      ++pushed;
    CHECK(pushed - popped == 4);  // exactly the capacity
    CHECK_FALSE(proxy::drained(r.view));
    while (consumer.pop(d)) {
      CHECK(d.sequence == popped + 1);
      CHECK(d.op == static_cast<std::uint32_t>(proxy::op_code::put_signal));
      CHECK(d.peer == static_cast<int>(popped % 3));
      CHECK(d.local_offset == popped * 8);
      CHECK(d.remote_offset == popped * 16);
      CHECK(d.bytes == popped + 1);
      CHECK(d.signal_slot == popped % 5);
      CHECK(d.signal_value == popped + 7);
      ++popped;
    }
    // Read but not retired: still no room.
    CHECK_FALSE(proxy::try_push(r.view, proxy::op_code::put, 0, 0, 0, 0));
    CHECK(consumer.in_flight() == 4);
    consumer.retire(4);
    CHECK(proxy::drained(r.view));
  }
  CHECK(pushed == 20);
}

TEST_CASE("a producer and a consumer thread agree on every descriptor, in order") {
  constexpr std::uint64_t total = 200'000;
  test_ring r(8);
  std::atomic<bool> bad{false};
  std::thread consumer_thread([&] {
    proxy::ring_consumer consumer(r.view);
    proxy::descriptor d{};
    std::mt19937 rng(7);
    for (std::uint64_t expect = 0; expect < total;) {
      if (!consumer.pop(d)) {
        if (consumer.in_flight() != 0) consumer.retire(consumer.in_flight());
        continue;
      }
      if (d.local_offset != expect || d.remote_offset != ~expect || d.bytes != expect * 3)
        bad = true;
      ++expect;
      // Retire in uneven batches, as completions would.
      if (rng() % 3 == 0) consumer.retire(consumer.in_flight());
    }
    consumer.retire(consumer.in_flight());
  });
  for (std::uint64_t i = 0; i < total; ++i)
    while (!proxy::try_push(r.view, proxy::op_code::put, 1, i, ~i, i * 3))
      std::this_thread::yield();
  consumer_thread.join();
  CHECK_FALSE(bad.load());
  CHECK(proxy::drained(r.view));
}

TEST_CASE("the completion window's watermark waits for the oldest operation") {
  proxy::completion_window w;
  CHECK(w.open(1) == 0);
  CHECK(w.open(2) == 1);
  CHECK(w.open(0) == 2);  // complete at once, but behind 0 and 1
  CHECK(w.watermark() == 0);
  w.complete(1);
  w.complete(1);
  CHECK(w.watermark() == 0);
  w.complete(0);
  CHECK(w.watermark() == 3);
  CHECK(w.idle());
  CHECK(w.open(1) == 3);
  w.add_part(3);
  w.complete(3);
  CHECK(w.watermark() == 3);
  w.complete(3);
  CHECK(w.watermark() == 4);
  CHECK(w.opened() == 4);
}

TEST_CASE("the engine issues descriptors in order and retires them in order") {
  scripted_transport t;
  proxy::engine_options opt;
  opt.channels = 2;
  opt.ring_capacity = 8;
  proxy::engine<scripted_transport> engine(t, opt);
  const deadline dl = deadline::after(10s);
  engine.push(0, proxy::op_code::put, 1, 10, 20, 30, 0, 0, dl);
  engine.push(0, proxy::op_code::put_signal, 2, 11, 21, 31, 4, 1, dl);
  engine.push(0, proxy::op_code::signal, 3, 0, 0, 0, 5, 2, dl);
  engine.push(0, proxy::op_code::flush, 1, 0, 0, 0, 0, 0, dl);
  REQUIRE(eventually([&] { return t.issued().size() == 4; }));
  const auto ops = t.issued();
  CHECK(ops[0].code == proxy::op_code::put);
  CHECK((ops[0].peer == 1 && ops[0].local == 10 && ops[0].remote == 20 && ops[0].bytes == 30));
  CHECK(ops[1].code == proxy::op_code::put_signal);
  CHECK((ops[1].peer == 2 && ops[1].slot == 4 && ops[1].n == 1 && ops[1].bytes == 31));
  CHECK(ops[2].code == proxy::op_code::signal);
  CHECK((ops[2].peer == 3 && ops[2].slot == 5 && ops[2].n == 2));
  CHECK(ops[3].code == proxy::op_code::flush);

  // Completing the later ones retires nothing: the first is still pending.
  t.complete(3);
  t.complete(1);
  t.complete(2);
  std::this_thread::sleep_for(20ms);
  const auto ring = engine.ring(0);
  CHECK(proxy::load_acquire(&ring.header->tail) == 0);
  CHECK_THROWS_AS(engine.quiet(0, deadline::after(50ms)), error);
  t.complete(0);
  engine.quiet(0, dl);  // now all four retire
  CHECK(proxy::load_acquire(&ring.header->tail) == 4);
  CHECK(proxy::drained(engine.ring(1)));  // the other channel never had work
}

TEST_CASE("a full ring holds the producer back until operations complete") {
  scripted_transport t;
  proxy::engine_options opt;
  opt.ring_capacity = 2;
  proxy::engine<scripted_transport> engine(t, opt);
  const deadline dl = deadline::after(10s);
  engine.push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, dl);
  engine.push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, dl);
  try {
    engine.push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, deadline::after(100ms));
    FAIL("pushed into a full ring");
  } catch (const error& e) {
    CHECK(std::string(e.what()).find("stayed full") != std::string::npos);
    CHECK(e.peer() == 1);
  }
  std::thread completer([&] {
    std::this_thread::sleep_for(20ms);
    t.complete(0);
  });
  engine.push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, dl);  // waits for the completion
  completer.join();
  t.complete(1);
  REQUIRE(eventually([&] { return t.issued().size() == 3; }));
  t.complete(2);
  engine.quiet(0, dl);
}

TEST_CASE("a transport error stops the proxy and reaches the producer") {
  scripted_transport t;
  proxy::engine<scripted_transport> engine(t);
  const deadline dl = deadline::after(10s);
  engine.push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, dl);
  t.fail_progress();
  try {
    engine.quiet(0, dl);
    FAIL("quiet succeeded although the transport failed");
  } catch (const error& e) {
    CHECK(e.peer() == 2);
    CHECK(std::string(e.what()).find("the peer went away") != std::string::npos);
  }
  CHECK(engine.failed());
  CHECK(proxy::proxy_failed(engine.ring(0)));
  CHECK_THROWS_AS(engine.push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, dl), error);
}

TEST_CASE("a proxy thread stuck in a transport call is left behind at destruction, not joined") {
  scripted_transport t;
  const std::size_t before = proxy::engine<scripted_transport>::abandoned_threads();
  const auto start = steady::now();
  {
    proxy::engine<scripted_transport> engine(t);
    t.stick_puts();
    engine.push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, deadline::after(10s));
    REQUIRE(eventually([&] { return t.in_stuck_put(); }));
  }
  const auto took = steady::now() - start;
  CHECK(proxy::engine<scripted_transport>::abandoned_threads() == before + 1);
  // stuck_after (2 s) from the call's start, not the drain timeout (5 s).
  CHECK(took >= 2s);
  CHECK(took < 5s);
}

// A quiet that outlasts its deadline because the proxy thread is held in the
// transport blames a peer whose process exited, when there is one: over
// libfabric's shm provider that peer's death is what holds the thread.
TEST_CASE("a quiet held up by a stuck proxy thread names a peer that exited") {
  scripted_transport t;
  std::promise<void> release;
  proxy::engine<scripted_transport> engine(t);
  t.stick_puts(release.get_future().share());
  engine.push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, deadline::after(10s));
  REQUIRE(eventually([&] { return t.in_stuck_put(); }));
  auto quiet_error = [&]() -> std::optional<error> {
    try {
      engine.quiet(0, deadline::after(100ms));
    } catch (const error& e) {
      return e;
    }
    return std::nullopt;
  };
  const std::optional<error> alive = quiet_error();
  REQUIRE(alive);
  CHECK(alive->peer() == no_peer);
  CHECK(std::string(alive->what()).find("deadline expired") != std::string::npos);
  t.exit_peer(3);
  const std::optional<error> gone = quiet_error();
  REQUIRE(gone);
  CHECK(gone->peer() == 3);
  CHECK(std::string(gone->what()).find("peer process exited") != std::string::npos);
  CHECK(std::string(gone->what()).find("deadline expired") == std::string::npos);
  release.set_value();
}

// What the owner of a transport and its proxy does with a stuck thread: it
// is left behind, and so are the engine and the transport it may come back
// to. When its call does return, it runs on in them (under AddressSanitizer
// a freed engine or transport would stop the test here).
TEST_CASE("a stuck proxy's engine and transport outlive their owner, for its thread to return to") {
  using owner = proxy::transport_with_proxy<true, proxy::engine, scripted_transport>;
  const std::size_t before = proxy::engine<scripted_transport>::abandoned_threads();
  std::promise<void> release;
  scripted_transport* t = nullptr;
  {
    owner owned([] { return scripted_transport{}; }, proxy::engine_options{});
    t = &owned.transport();
    t->stick_puts(release.get_future().share());
    owned.proxy().push(0, proxy::op_code::put, 1, 0, 0, 8, 0, 0, deadline::after(10s));
    REQUIRE(eventually([&] { return t->in_stuck_put(); }));
  }
  CHECK(proxy::engine<scripted_transport>::abandoned_threads() == before + 1);
  CHECK(t->left_open());
  const std::uint64_t calls = t->progress_calls();
  release.set_value();
  CHECK(eventually([&] { return t->progress_calls() > calls; }));
}

TEST_CASE("a descriptor naming no valid peer or op stops the proxy with an error") {
  for (int peer : {-1, 4}) {
    scripted_transport t;
    proxy::engine<scripted_transport> engine(t);
    const deadline dl = deadline::after(10s);
    engine.push(0, proxy::op_code::put, peer, 0, 0, 8, 0, 0, dl);
    try {
      engine.quiet(0, dl);
      FAIL("a descriptor for peer ", peer, " was accepted");
    } catch (const error& e) {
      CHECK(std::string(e.what()).find("outside [0, 4)") != std::string::npos);
    }
  }
  scripted_transport t;
  proxy::engine<scripted_transport> engine(t);
  REQUIRE(proxy::try_push(engine.ring(0), static_cast<proxy::op_code>(99), 1, 0, 0, 0));
  CHECK_THROWS_WITH_AS(engine.quiet(0, deadline::after(10s)),
                       doctest::Contains("unknown op code 99"), error);
}

TEST_CASE("the engine checks its options") {
  scripted_transport t;
  proxy::engine_options opt;
  opt.ring_capacity = 6;
  CHECK_THROWS_WITH_AS(proxy::engine<scripted_transport>(t, opt), doctest::Contains("power of two"),
                       error);
  opt.ring_capacity = 8;
  opt.channels = 0;
  CHECK_THROWS_WITH_AS(proxy::engine<scripted_transport>(t, opt),
                       doctest::Contains("channels must be >= 1"), error);
}

namespace {
// The four pushes the channel tests make, as the transport was handed them:
// put(1, 10, 20, 30), put_signal(2, ..., slot, 5), signal(3, 1, 7), flush(peer).
void check_pushes(const std::vector<scripted_transport::op>& ops, std::size_t put_signal_slot,
                  int flush_peer) {
  REQUIRE(ops.size() == 4);
  CHECK((ops[0].code == proxy::op_code::put && ops[0].peer == 1 && ops[0].local == 10 &&
         ops[0].remote == 20 && ops[0].bytes == 30));
  CHECK((ops[1].code == proxy::op_code::put_signal && ops[1].slot == put_signal_slot &&
         ops[1].n == 5));
  CHECK((ops[2].code == proxy::op_code::signal && ops[2].peer == 3 && ops[2].n == 7));
  CHECK((ops[3].code == proxy::op_code::flush && ops[3].peer == flush_peer));
}
}  // namespace

// The producer handle a kernel holds (proxy::channel), here driven by a host
// thread over rings the test owns, as pinned memory would be.
TEST_CASE("a channel over the caller's rings issues, waits for room, quiets and reports") {
  scripted_transport t;
  test_ring a(2), b(4);
  const std::vector<proxy::ring_view> rings{a.view, b.view};
  proxy::engine<scripted_transport> engine(t, rings);
  CHECK(engine.channels() == 2);
  std::uint64_t counters[3] = {};
  // Calls that must give up wait briefly; calls that must succeed get a
  // deadline a loaded CI machine cannot miss.
  const proxy::channel hasty{a.view, counters, std::chrono::nanoseconds(100ms).count()};
  const proxy::channel ch{a.view, counters, std::chrono::nanoseconds(10s).count()};

  CHECK(ch.put(1, 10, 20, 30) == proxy::channel_status::ok);
  CHECK(ch.put_signal(2, 11, 21, 31, 2, 5) == proxy::channel_status::ok);
  // Capacity 2, nothing complete: the third waits, then gives up.
  CHECK(hasty.signal(3, 1, 7) == proxy::channel_status::ring_full);
  CHECK(hasty.quiet() == proxy::channel_status::not_drained);
  t.complete(0);
  CHECK(ch.signal(3, 1, 7) == proxy::channel_status::ok);  // a slot came free
  t.complete(1);
  t.complete(2);
  CHECK(ch.quiet() == proxy::channel_status::ok);
  CHECK(ch.flush(1) == proxy::channel_status::ok);
  REQUIRE(eventually([&] { return t.issued().size() == 4; }));
  check_pushes(t.issued(), 2, 1);
  t.complete(3);

  // wait: reaches the count another thread publishes, or says it was late.
  std::uint64_t seen = 0;
  CHECK(hasty.wait(1, 1, &seen) == proxy::channel_status::signal_late);
  CHECK(seen == 0);
  std::thread signaller([&] {
    std::this_thread::sleep_for(10ms);
    __atomic_store_n(&counters[1], 3, __ATOMIC_RELEASE);
  });
  CHECK(ch.wait(1, 3, &seen) == proxy::channel_status::ok);
  CHECK(seen == 3);
  signaller.join();

  // A transport error: every call of every channel reports the failed proxy.
  t.fail_progress();
  REQUIRE(eventually([&] { return engine.failed(); }));
  const proxy::channel other{b.view, counters, std::chrono::nanoseconds(10s).count()};
  CHECK(hasty.put(1, 0, 0, 8) == proxy::channel_status::proxy_failed);
  CHECK(other.quiet() == proxy::channel_status::ok);  // nothing was pushed to it
  CHECK(other.signal(1, 0, 1) == proxy::channel_status::proxy_failed);
  CHECK(other.wait(0, 1) == proxy::channel_status::proxy_failed);  // at once, not after 10 s
  CHECK(std::string(proxy::to_string(proxy::channel_status::signal_late)).find("signal") !=
        std::string::npos);
}

// A kernel's run of pushes (proxy::channel_writer): the same descriptors, in
// order, while reading where the proxy is only when the ring looks full.
TEST_CASE("a channel writer pushes in order, waits for room only when full, and reports") {
  scripted_transport t;
  test_ring a(2);
  proxy::engine<scripted_transport> engine(t, std::span(&a.view, 1));
  std::uint64_t counters[2] = {};
  const proxy::channel ch{a.view, counters, std::chrono::nanoseconds(100ms).count()};
  {
    proxy::channel_writer w = ch.writer();
    CHECK(w.put(1, 10, 20, 30) == proxy::channel_status::ok);
    CHECK(w.put_signal(2, 11, 21, 31, 1, 5) == proxy::channel_status::ok);
    CHECK(w.signal(3, 1, 7) == proxy::channel_status::ring_full);  // nothing completed
    t.complete(0);
    // Once the proxy has retired it, the writer reads tail again and finds room.
    REQUIRE(eventually([&] { return proxy::load_acquire(&a.view.header->tail) == 1; }));
    CHECK(w.signal(3, 1, 7) == proxy::channel_status::ok);
    t.complete(1);
    CHECK(w.flush(2) == proxy::channel_status::ok);
    t.complete(2);
  }
  const proxy::channel patient{a.view, counters, std::chrono::nanoseconds(10s).count()};
  t.complete(3);
  CHECK(patient.quiet() == proxy::channel_status::ok);  // the writer kept head up to date
  check_pushes(t.issued(), 1, 2);

  // A writer made after the proxy failed refuses at once; one that finds the
  // ring full of a failed proxy's work says so instead of waiting it out.
  proxy::channel_writer before = patient.writer();
  CHECK(before.put(1, 0, 0, 8) == proxy::channel_status::ok);
  CHECK(before.put(1, 0, 0, 8) == proxy::channel_status::ok);
  t.fail_progress();
  REQUIRE(eventually([&] { return engine.failed(); }));
  proxy::channel_writer after = patient.writer();
  CHECK(after.put(1, 0, 0, 8) == proxy::channel_status::proxy_failed);
  const auto start = steady::now();
  CHECK(before.put(1, 0, 0, 8) == proxy::channel_status::proxy_failed);
  CHECK(steady::now() - start < 5s);
}

TEST_CASE("the engine refuses rings that are not rings") {
  scripted_transport t;
  CHECK_THROWS_WITH_AS(proxy::engine<scripted_transport>(t, std::span<const proxy::ring_view>{}),
                       doctest::Contains("no rings"), error);
  test_ring r(4);
  r.view.header->capacity = 3;
  CHECK_THROWS_WITH_AS(proxy::engine<scripted_transport>(t, std::span(&r.view, 1)),
                       doctest::Contains("power of two"), error);
}
