// The one exception type epcomm throws: it always says which rank failed, in
// which operation, because of which peer (if any), and why.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace epcomm {

inline constexpr int no_peer = -1;

class error : public std::runtime_error {
 public:
  error(int rank, std::string_view op, int peer, std::string_view cause)
      : std::runtime_error(format(rank, op, peer, cause)),
        rank_(rank),
        peer_(peer),
        op_(op),
        cause_(cause) {}

  int rank() const noexcept { return rank_; }
  // The peer the failure is attributed to, or no_peer.
  int peer() const noexcept { return peer_; }
  const std::string& op() const noexcept { return op_; }
  const std::string& cause() const noexcept { return cause_; }

 private:
  static std::string format(int rank, std::string_view op, int peer, std::string_view cause) {
    std::string s = "epcomm: rank " + std::to_string(rank) + ": " + std::string(op);
    if (peer != no_peer) s += " (peer " + std::to_string(peer) + ")";
    s += ": ";
    s += cause;
    return s;
  }

  int rank_;
  int peer_;
  std::string op_;
  std::string cause_;
};

}  // namespace epcomm
