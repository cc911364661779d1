// call_queue (host/call_queue.hpp): a buffer's communication thread. Calls
// run in submission order, one at a time, off the submitting thread; errors
// reach the completion; drain waits for every queued call, and returns at
// once when a queued call itself drains (a synchronous call made from it).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "epcomm/host/call_queue.hpp"

using namespace epcomm;

TEST_CASE("calls run in order, off the caller's thread, one at a time") {
  call_queue q;
  std::vector<int> order;  // written by the queue's thread only, read after drain
  std::atomic<int> running{0};
  bool overlapped = false;
  std::vector<completion<std::thread::id>> done;
  for (int i = 0; i < 20; ++i)
    done.push_back(q.submit([&, i] {
      overlapped |= running.fetch_add(1) != 0;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      order.push_back(i);
      running.fetch_sub(1);
      return std::this_thread::get_id();
    }));
  q.drain();
  for (auto& c : done) {
    CHECK(c.ready());
    CHECK(c.get() != std::this_thread::get_id());
  }
  CHECK_FALSE(overlapped);
  REQUIRE(order.size() == 20u);
  for (int i = 0; i < 20; ++i) CHECK(order[i] == i);
}

TEST_CASE("a call's exception reaches its completion, and the queue goes on") {
  call_queue q;
  auto bad = q.submit([]() -> int { throw std::runtime_error("no peer"); });
  auto good = q.submit([] { return 7; });
  CHECK_THROWS_WITH(bad.get(), "no peer");
  CHECK(good.get() == 7);
}

TEST_CASE("a queued call may drain the queue it runs on") {
  call_queue q;
  auto c = q.submit([&q] {
    q.drain();  // what a synchronous engine call does first
    return 1;
  });
  c.wait();
  CHECK(c.get() == 1);
}

TEST_CASE("destruction runs what is still queued") {
  std::atomic<int> ran{0};
  {
    call_queue q;
    for (int i = 0; i < 5; ++i)
      q.submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ran.fetch_add(1);
      });
  }
  CHECK(ran.load() == 5);
}
