// The UCX transport's ordered delivery of its own messages (messages.hpp),
// without UCX: whatever order messages arrive in, each sender's are applied
// in its numbering, so a signal never overtakes the writes before it.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "epcomm/ucx/messages.hpp"

using epcomm::ucx::in_order_delivery;
using epcomm::ucx::message_header;
using epcomm::ucx::message_kind;

namespace {

message_header numbered(std::uint64_t n) { return {message_kind::write, 1, 2, 0, n, 8 * n, n}; }

// Delivers messages numbered as `arrival` says, each with one payload byte
// equal to its number; returns the numbers in the order they were applied.
std::vector<std::uint64_t> applied_order(in_order_delivery& d, std::vector<std::uint64_t> arrival) {
  std::vector<std::uint64_t> applied;
  for (std::uint64_t n : arrival) {
    const std::byte payload[] = {static_cast<std::byte>(n)};
    d.deliver(0, numbered(n), payload, [&](const message_header& h, std::span<const std::byte> p) {
      REQUIRE(p.size() == 1);
      CHECK(static_cast<std::uint64_t>(p[0]) == h.number);  // its own payload, kept while held
      CHECK(h.offset == 8 * h.number);
      applied.push_back(h.number);
    });
  }
  return applied;
}

}  // namespace

TEST_CASE("messages in order are applied as they come") {
  in_order_delivery d;
  CHECK(applied_order(d, {1, 2, 3}) == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(d.held() == 0);
}

TEST_CASE("a message that comes early waits for those before it") {
  in_order_delivery d;
  CHECK(applied_order(d, {3, 2}).empty());
  CHECK(d.held() == 2);
  CHECK(applied_order(d, {1}) == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(d.held() == 0);
  CHECK(applied_order(d, {5, 4, 7, 6}) == std::vector<std::uint64_t>{4, 5, 6, 7});
}

TEST_CASE("a message that comes twice is an error naming its sender") {
  in_order_delivery d;
  CHECK(applied_order(d, {1, 3}) == std::vector<std::uint64_t>{1});
  for (std::uint64_t again : {1, 3}) {
    try {
      applied_order(d, {again});
      FAIL("message ", again, " was taken twice");
    } catch (const epcomm::error& e) {
      CHECK(e.peer() == 2);
      CHECK(std::string(e.what()).find("arrived twice") != std::string::npos);
    }
  }
  CHECK(applied_order(d, {2}) == std::vector<std::uint64_t>{2, 3});
}
