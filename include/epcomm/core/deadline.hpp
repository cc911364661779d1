// Every wait in epcomm has a deadline. The default suits tests; production sets
// its own through the configuration or EPCOMM_TIMEOUT_MS, which overrides both.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

namespace epcomm {

using steady = std::chrono::steady_clock;

inline constexpr std::chrono::milliseconds default_timeout{30'000};

// The timeout in force: EPCOMM_TIMEOUT_MS when set to a positive integer,
// otherwise the configured value.
inline std::chrono::milliseconds effective_timeout(std::chrono::milliseconds configured) {
  if (const char* s = std::getenv("EPCOMM_TIMEOUT_MS")) {
    char* end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (end != s && *end == '\0' && v > 0) return std::chrono::milliseconds(v);
  }
  return configured;
}

// Construction (agreeing on the config, setting up the transport, connecting)
// has its own bound: bringing up a large group takes longer than a call
// should, and a short call timeout chosen to find a lost rank quickly must not
// fail set-up. The config's setup_timeout when positive, else the call timeout
// in force.
template <class Config>
std::chrono::milliseconds setup_timeout_of(const Config& cfg) {
  return cfg.setup_timeout.count() > 0 ? cfg.setup_timeout : effective_timeout(cfg.timeout);
}

class deadline {
 public:
  explicit deadline(steady::time_point at) : at_(at) {}
  static deadline after(std::chrono::milliseconds d) { return deadline(steady::now() + d); }

  bool expired() const { return steady::now() >= at_; }
  steady::time_point at() const { return at_; }
  std::chrono::milliseconds remaining() const {
    const auto r = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - steady::now());
    return r.count() > 0 ? r : std::chrono::milliseconds(0);
  }

 private:
  steady::time_point at_;
};

}  // namespace epcomm
