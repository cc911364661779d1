// Fault injection for tests: make one rank exit, stall or drop its transport
// at a chosen point of the protocol, so that survivors' behaviour can be
// tested. Armed only by the environment variable
//
//   EPCOMM_FAULT="rank=R,point=P,action=A[,stall_ms=N][,hit=K]"
//
//   point   before_notify | mid_dispatch | mid_combine | low_latency
//   action  exit  (the process vanishes at once, as a crash would)
//           stall (sleeps stall_ms, default 10000, then carries on)
//           drop  (aborts its transport, then fails locally: peers learn of
//                  it the way they would of a lost connection)
//   hit     fire the K-th time the point is reached (default 1)
//
// Unset, every injection point costs one predictable branch.
#pragma once

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "epcomm/core/enum_names.hpp"
#include "epcomm/core/error.hpp"

namespace epcomm::fault {

enum class point { before_notify, mid_dispatch, mid_combine, low_latency };
enum class action { exit, stall, drop };

// Exit status of a rank that an injected `exit` fault ended.
inline constexpr int exit_code = 77;

struct plan {
  int rank = -1;
  point at = point::before_notify;
  action what = action::exit;
  std::chrono::milliseconds stall{10'000};
  int hit = 1;
};

inline constexpr auto point_names = names_for<point, point::low_latency>(
    "before_notify", "mid_dispatch", "mid_combine", "low_latency");
inline constexpr auto action_names = names_for<action, action::drop>("exit", "stall", "drop");

inline const char* name(point p) { return point_names(p); }
inline const char* name(action a) { return action_names(a); }

// Parses a plan; throws epcomm::error naming the bad field, so a typo in a
// test's fault never silently disarms it.
inline plan parse(std::string_view spec) {
  plan p;
  auto bad = [&](const std::string& why) -> plan {
    throw error(no_peer, "fault injection", no_peer,
                "EPCOMM_FAULT='" + std::string(spec) + "': " + why);
  };
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    const std::string_view field = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    const auto eq = field.find('=');
    if (eq == std::string_view::npos) return bad("field without '='");
    const std::string key(field.substr(0, eq));
    const std::string value(field.substr(eq + 1));
    auto number = [&]() {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || v < 0) bad(key + " needs a non-negative integer");
      return v;
    };
    if (key == "rank")
      p.rank = static_cast<int>(number());
    else if (key == "stall_ms")
      p.stall = std::chrono::milliseconds(number());
    else if (key == "hit")
      p.hit = static_cast<int>(number());
    else if (key == "point") {
      const auto at = point_names.parse(value);
      if (!at) return bad("unknown point '" + value + "'");
      p.at = *at;
    } else if (key == "action") {
      const auto what = action_names.parse(value);
      if (!what) return bad("unknown action '" + value + "'");
      p.what = *what;
    } else {
      return bad("unknown field '" + key + "'");
    }
  }
  if (p.rank < 0) return bad("rank is required");
  return p;
}

namespace detail {
// Read once per process, on first use (after fork, in a rank).
inline std::optional<plan>& armed() {
  static std::optional<plan> p = []() -> std::optional<plan> {
    const char* s = std::getenv("EPCOMM_FAULT");
    if (s == nullptr || *s == '\0') return std::nullopt;
    return parse(s);
  }();
  return p;
}
inline int& hits(point p) {
  static int counts[4] = {};
  return counts[static_cast<int>(p)];
}
}  // namespace detail

// Disarms the plan in this process: survivors that re-form a group get new
// rank numbers, and one of them must not inherit the victim's fault.
inline void disarm() { detail::armed().reset(); }

// Called by the engines at each point. `abort_transport` is how this rank
// drops its transport (a callable, so this header needs no transport type).
template <class Abort>
void inject(point at, int rank, const char* op, Abort&& abort_transport) {
  const auto& p = detail::armed();
  if (!p || p->rank != rank || p->at != at || ++detail::hits(at) != p->hit) return;
  switch (p->what) {
    case action::exit:
      std::_Exit(exit_code);
    case action::stall:
      std::this_thread::sleep_for(p->stall);
      return;
    case action::drop:
      abort_transport();
      throw error(rank, op, no_peer,
                  std::string("transport dropped by fault injection at ") + name(at));
  }
}

}  // namespace epcomm::fault
