// A bootstrap configured by the variables torchrun and TorchX set: RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID. The ranks rendezvous over
// TCP at rank 0 (MASTER_ADDR) and every all_gather goes through rank 0. A star costs
// O(world_size) at the root, which is fine for the few small exchanges a bootstrap makes, and it
// puts every failure in one place, from where it is reported to all ranks at once.
//
// The rendezvous port is EPCOMM_MASTER_PORT, by default MASTER_PORT + 1: torchrun's own store
// listens on MASTER_PORT at rank 0. Rank 0 admits only members of its job (EPCOMM_JOB_ID, else
// TORCHELASTIC_RUN_ID): a process of another job gets an error naming both jobs and the
// rendezvous goes on without it; a stranger on the port, or a connection that never finishes its
// hello, is dropped and, should the deadline pass, named in the error.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/bootstrap/hello.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"

namespace epcomm {
namespace detail::tcp {

// Owns a file descriptor. Closing it is also how peers learn that this rank is gone.
class socket {
 public:
  socket() = default;
  explicit socket(int fd) : fd_(fd) {}
  socket(socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  socket& operator=(socket&& other) noexcept {
    if (this != &other) {
      close();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~socket() { close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
};

inline std::string errno_text(int err) { return std::system_category().message(err); }

// The bootstrap exchanges many small messages in lockstep; Nagle's algorithm would hold each one
// back until the previous one is acknowledged.
inline void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Milliseconds for poll(), rounded up so that a wait that times out has reached the deadline.
inline int poll_timeout(const deadline& dl) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(dl.at() - steady::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

// Waits for `events` on fd: the events that occurred (errors included), or 0 once dl expired.
inline short wait_for(int fd, short events, const deadline& dl) {
  for (;;) {
    pollfd p{fd, events, 0};
    if (::poll(&p, 1, poll_timeout(dl)) > 0) return p.revents;
    if (dl.expired()) return 0;
  }
}

// ok: done. lost: EOF or a socket error (ECONNRESET, EPIPE, ...); either way the peer is gone.
// peer_spoke: see send_all.
enum class io { ok, lost, timed_out, peer_spoke };

// One read that does not block (every socket here is non-blocking): the byte count, 0 when
// nothing has arrived yet, or nullopt when the peer is gone. `out` must not be empty.
inline std::optional<std::size_t> recv_some(int fd, std::span<std::byte> out) {
  for (;;) {
    const ssize_t n = ::recv(fd, out.data(), out.size(), 0);
    if (n > 0) return static_cast<std::size_t>(n);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return std::nullopt;
  }
}

inline io recv_all(int fd, std::span<std::byte> out, const deadline& dl) {
  while (!out.empty()) {
    const std::optional<std::size_t> n = recv_some(fd, out);
    if (!n) return io::lost;
    out = out.subspan(*n);
    if (*n == 0 && wait_for(fd, POLLIN, dl) == 0) return io::timed_out;
  }
  return io::ok;
}

// With watch_input, stops with peer_spoke when the peer sends something (or hangs up) while this
// side waits to send: rank 0 speaks out of turn only to report a failure, and after that it may
// never read the rest of what a member is sending.
inline io send_all(int fd, std::span<const std::byte> data, const deadline& dl,
                   bool watch_input = false) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n >= 0) {
      data = data.subspan(static_cast<std::size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return io::lost;
    const short events =
        wait_for(fd, static_cast<short>(watch_input ? POLLOUT | POLLIN : POLLOUT), dl);
    if (events == 0) return io::timed_out;
    if (events & POLLIN) return io::peer_spoke;
  }
  return io::ok;
}

// MASTER_ADDR as an IPv4 address (a dotted quad or a host name such as "localhost"), or nullopt
// with the reason in `why`.
inline std::optional<sockaddr_in> resolve(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    why = "cannot resolve MASTER_ADDR '" + host + "': " + ::gai_strerror(rc);
    return std::nullopt;
  }
  sockaddr_in addr{};
  std::memcpy(&addr, found->ai_addr, sizeof addr);
  ::freeaddrinfo(found);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  return addr;
}

// Connecting to a free local port in the ephemeral range can succeed by the socket connecting to
// itself (TCP simultaneous open); that is nobody listening, not rank 0.
inline bool connected_to_itself(int fd) {
  sockaddr_in self{}, peer{};
  socklen_t self_len = sizeof self, peer_len = sizeof peer;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len);
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len);
  return self.sin_port == peer.sin_port && self.sin_addr.s_addr == peer.sin_addr.s_addr;
}

// One connection attempt: the socket, or an invalid one with the reason in `why`.
inline socket try_connect(const sockaddr_in& addr, const deadline& dl, std::string& why) {
  socket s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    why = errno_text(errno);
    return {};
  }
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
      errno != EINPROGRESS) {
    why = errno_text(errno);
    return {};
  }
  if (wait_for(s.fd(), POLLOUT, dl) == 0) {
    why = "connection attempt timed out";
    return {};
  }
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    why = errno_text(err);
    return {};
  }
  if (connected_to_itself(s.fd())) {
    why = errno_text(ECONNREFUSED);
    return {};
  }
  set_nodelay(s.fd());
  return s;
}

// The hello is in bootstrap/hello.hpp; every message after it, in either direction:
// block, member to rank 0: length u64, then the bytes.
inline constexpr std::size_t block_header_bytes = 8;
// reply, rank 0 to member: magic u32, status u32, peer i32, length u64, then the gathered
// blocks (status ok) or the cause of the failure (status failed).
inline constexpr std::size_t reply_header_bytes = 20;
inline constexpr std::uint64_t reply_ok = 0;
inline constexpr std::uint64_t reply_failed = 1;

inline std::array<std::byte, reply_header_bytes> reply_header(std::uint64_t status, int peer,
                                                              std::size_t length) {
  std::array<std::byte, reply_header_bytes> h{};
  put_le<4>(&h[0], magic);
  put_le<4>(&h[4], status);
  put_le<4>(&h[8], static_cast<std::uint32_t>(peer));
  put_le<8>(&h[12], length);
  return h;
}

}  // namespace detail::tcp

// Not thread-safe: one thread at a time may call all_gather/barrier. After any failure the
// connections may be mid-message, so every later call throws. A moved-from env_bootstrap may only
// be destroyed or assigned to.
class env_bootstrap {
 public:
  // What the launcher says about this process. Fields are named after the variables they come
  // from, and the errors about them name those variables too.
  struct params {
    int rank = 0;        // RANK
    int world_size = 1;  // WORLD_SIZE
    // LOCAL_RANK and LOCAL_WORLD_SIZE, both or neither. Neither means that all ranks run on this
    // node: local_rank() == rank(), local_world_size() == world_size().
    std::optional<int> local_rank;
    std::optional<int> local_world_size;
    // Where rank 0 listens: an IPv4 address or host name of its node, and a TCP port. Unused when
    // world_size is 1.
    std::string master_addr;  // MASTER_ADDR
    int master_port = 0;      // EPCOMM_MASTER_PORT, else MASTER_PORT + 1
    // The job this process belongs to (EPCOMM_JOB_ID, else TORCHELASTIC_RUN_ID, which torchrun
    // and TorchX set): rank 0 admits only members with the same one. At most
    // detail::tcp::max_job_id_bytes; empty admits any member that is also without one.
    std::string job_id;
    // Bounds the rendezvous in the constructor; EPCOMM_TIMEOUT_MS overrides it.
    std::chrono::milliseconds timeout = default_timeout;
  };

  // Rendezvous with the other ranks: returns once all world_size ranks have connected to rank 0.
  explicit env_bootstrap(const params& p)
      : rank_(p.rank),
        world_size_(p.world_size),
        local_rank_(p.local_rank.value_or(p.rank)),
        local_world_size_(p.local_world_size.value_or(p.world_size)),
        job_id_(p.job_id) {
    check(p);
    if (world_size_ == 1) return;
    const deadline dl = deadline::after(effective_timeout(p.timeout));
    if (rank_ == 0) {
      rendezvous_as_root(p, dl);
    } else {
      rendezvous_as_member(p, dl);
    }
  }

  // Reads the launcher's variables (see params; MASTER_ADDR and a port are required only when
  // WORLD_SIZE > 1) and rendezvous within `timeout`. Errors about a variable name it; their rank
  // is -1 while RANK itself is missing or malformed.
  static env_bootstrap from_environment(std::chrono::milliseconds timeout = default_timeout) {
    params p;
    p.rank = required_int("RANK", -1);
    p.world_size = required_int("WORLD_SIZE", p.rank);
    p.local_rank = optional_int("LOCAL_RANK", p.rank);
    p.local_world_size = optional_int("LOCAL_WORLD_SIZE", p.rank);
    std::optional<int> port = optional_int("EPCOMM_MASTER_PORT", p.rank);
    if (!port)
      if (const std::optional<int> torch = optional_int("MASTER_PORT", p.rank)) port = *torch + 1;
    const char* addr = std::getenv("MASTER_ADDR");
    if (p.world_size > 1 && addr == nullptr) missing("MASTER_ADDR", p.rank);
    if (p.world_size > 1 && !port) missing("EPCOMM_MASTER_PORT (or MASTER_PORT)", p.rank);
    p.master_addr = addr != nullptr ? addr : "";
    p.master_port = port.value_or(0);
    for (const char* name : {"EPCOMM_JOB_ID", "TORCHELASTIC_RUN_ID"})
      if (const char* job = std::getenv(name); job != nullptr && *job != '\0') {
        p.job_id = job;
        break;
      }
    p.timeout = timeout;
    return env_bootstrap(p);
  }

  env_bootstrap(env_bootstrap&&) noexcept = default;
  env_bootstrap& operator=(env_bootstrap&&) noexcept = default;
  env_bootstrap(const env_bootstrap&) = delete;
  env_bootstrap& operator=(const env_bootstrap&) = delete;
  ~env_bootstrap() = default;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_world_size() const { return local_world_size_; }

  // Every rank must pass the same number of bytes; a rank that passes another size is named in
  // the error every rank gets (rank 0's size is the reference).
  std::vector<std::byte> all_gather(std::span<const std::byte> mine, deadline dl) {
    return exchange(mine, dl, "all_gather");
  }

  void barrier(deadline dl) { exchange({}, dl, "barrier"); }

 private:
  using socket = detail::tcp::socket;
  using io = detail::tcp::io;

  static constexpr std::string_view config_op = "bootstrap configuration";
  static constexpr std::string_view rendezvous_op = "bootstrap rendezvous";
  // How often a member retries connecting while rank 0 is not listening yet.
  static constexpr std::chrono::milliseconds retry_interval{50};

  [[noreturn]] static void missing(const char* name, int rank) {
    throw error(rank, config_op, no_peer, std::string(name) + " is not set");
  }

  static std::optional<int> optional_int(const char* name, int rank) {
    const char* s = std::getenv(name);
    if (s == nullptr) return std::nullopt;
    const std::string_view v(s);
    int out = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
      throw error(rank, config_op, no_peer, std::string(name) + "='" + s + "' is not an integer");
    }
    return out;
  }

  static int required_int(const char* name, int rank) {
    const std::optional<int> v = optional_int(name, rank);
    if (!v) missing(name, rank);
    return *v;
  }

  static void check(const params& p) {
    const auto bad = [&](const std::string& cause) {
      throw error(p.rank, config_op, no_peer, cause);
    };
    const auto str = [](int v) { return std::to_string(v); };
    if (p.world_size < 1) bad("WORLD_SIZE=" + str(p.world_size) + " is not positive");
    if (p.rank < 0 || p.rank >= p.world_size) {
      bad("RANK=" + str(p.rank) + " is outside [0, WORLD_SIZE=" + str(p.world_size) + ")");
    }
    if (p.local_rank && !p.local_world_size) bad("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not");
    if (!p.local_rank && p.local_world_size) bad("LOCAL_WORLD_SIZE is set but LOCAL_RANK is not");
    if (p.local_world_size) {
      const int lws = *p.local_world_size, lr = *p.local_rank;
      if (lws < 1 || lws > p.world_size) {
        bad("LOCAL_WORLD_SIZE=" + str(lws) + " is outside [1, WORLD_SIZE=" + str(p.world_size) +
            "]");
      }
      if (lr < 0 || lr >= lws) {
        bad("LOCAL_RANK=" + str(lr) + " is outside [0, LOCAL_WORLD_SIZE=" + str(lws) + ")");
      }
    }
    if (p.world_size == 1) return;
    if (p.master_addr.empty()) bad("MASTER_ADDR is empty");
    if (p.master_port < 1 || p.master_port > 65535) {
      bad("the rendezvous port " + str(p.master_port) +
          " (EPCOMM_MASTER_PORT, else MASTER_PORT + 1) is not a TCP port (1-65535)");
    }
    if (p.job_id.size() > detail::tcp::max_job_id_bytes) {
      bad("the job id (EPCOMM_JOB_ID or TORCHELASTIC_RUN_ID) has " + str(int(p.job_id.size())) +
          " bytes, more than " + str(int(detail::tcp::max_job_id_bytes)));
    }
  }

  static std::string describe(io what, int peer, std::string_view op) {
    const std::string who = "rank " + std::to_string(peer);
    return what == io::timed_out
               ? "deadline expired waiting for " + who + " during " + std::string(op)
               : "connection to " + who + " lost during " + std::string(op);
  }

  // A reply with status failed: what members throw instead of a result.
  static std::vector<std::byte> failure_report(int peer, const std::string& cause) {
    std::vector<std::byte> report(detail::tcp::reply_header_bytes + cause.size());
    const auto header = detail::tcp::reply_header(detail::tcp::reply_failed, peer, cause.size());
    std::ranges::copy(header, report.begin());
    std::memcpy(report.data() + header.size(), cause.data(), cause.size());
    return report;
  }

  [[noreturn]] void fail(std::string_view op, int peer, const std::string& cause) {
    failure_ = cause;
    throw error(rank_, op, peer, cause);
  }

  // Tells every member why the operation failed, so that none waits out its deadline for a reply
  // that will never come, then throws. `cut_off` is a member whose reply was interrupted: its
  // stream can carry nothing more. The report is sent without blocking: members read each reply
  // in full before their next request, so there is room for it, except when rank 0's last reply
  // to a member still fills the buffer; that member then sees a lost connection instead. The
  // write side is shut down rather than closed: a close with unread input resets the connection,
  // which can destroy the report before the member reads it.
  [[noreturn]] void fail_as_root(std::string_view op, int peer, const std::string& cause,
                                 int cut_off = no_peer) {
    const std::vector<std::byte> report = failure_report(peer, cause);
    for (int r = 1; r < world_size_; ++r) {
      if (r == cut_off || !peers_[r].valid()) continue;
      (void)::send(peers_[r].fd(), report.data(), report.size(), MSG_NOSIGNAL);
      ::shutdown(peers_[r].fd(), SHUT_WR);
    }
    fail(op, peer, cause);
  }

  socket listen_on(const params& p) const {
    std::string why;
    const std::optional<sockaddr_in> addr = detail::tcp::resolve(p.master_addr, p.master_port, why);
    if (!addr) throw error(rank_, rendezvous_op, no_peer, why);
    socket s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    // A previous job's connections may linger in TIME_WAIT on this port; they must not stop a
    // restarted job from listening.
    const int one = 1;
    if (!s.valid() || ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        ::bind(s.fd(), reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0 ||
        ::listen(s.fd(), SOMAXCONN) != 0) {
      throw error(rank_, rendezvous_op, no_peer,
                  "cannot listen on " + p.master_addr + ":" + std::to_string(p.master_port) + ": " +
                      detail::tcp::errno_text(errno));
    }
    return s;
  }

  // Registers the member a hello announces; false for a process of another job, which is told
  // why and dropped (the rendezvous goes on without it). A hello of this job that contradicts it
  // fails the rendezvous on both sides.
  bool admit(socket s, const detail::tcp::hello& hello, const std::string& from) {
    const std::uint64_t ws = hello.world_size, r = hello.rank;
    if (hello.job_id != job_id_) {
      const std::string why = "rank 0 belongs to job '" + job_id_ + "', the process at " + from +
                              " claiming RANK=" + std::to_string(r) + " to job '" + hello.job_id +
                              "'";
      const std::vector<std::byte> report = failure_report(0, "refused: " + why);
      (void)::send(s.fd(), report.data(), report.size(), MSG_NOSIGNAL);
      ::shutdown(s.fd(), SHUT_WR);
      refused_.push_back(why);
      return false;
    }
    const bool in_range = r >= 1 && r < static_cast<std::uint64_t>(world_size_);
    std::string why;
    if (ws != static_cast<std::uint64_t>(world_size_)) {
      why = "rank " + std::to_string(r) + " has WORLD_SIZE=" + std::to_string(ws) +
            " but rank 0 has WORLD_SIZE=" + std::to_string(world_size_);
    } else if (!in_range) {
      why = "a member claims RANK=" + std::to_string(r) +
            ", outside [1, WORLD_SIZE=" + std::to_string(world_size_) + ")";
    } else if (peers_[r].valid()) {
      why = "two processes claim RANK=" + std::to_string(r);
    } else {
      peers_[r] = std::move(s);
      return true;
    }
    const int peer = in_range ? static_cast<int>(r) : no_peer;
    // The rejected process is not in peers_, so fail_as_root would not tell it. Its connection is
    // new, so the report fits the empty send buffer.
    const std::vector<std::byte> report = failure_report(peer, why);
    (void)::send(s.fd(), report.data(), report.size(), MSG_NOSIGNAL);
    fail_as_root(rendezvous_op, peer, why);
  }

  // An accepted connection until its hello is complete.
  struct newcomer {
    socket sock;
    std::string from;  // address:port, for the errors
    std::array<std::byte, detail::tcp::max_hello_bytes> hello{};
    std::size_t got = 0;
  };

  // Connections still waiting for their hello's end are bounded, so that a flood of them cannot
  // exhaust rank 0's descriptors; past this the oldest is dropped.
  static constexpr std::size_t max_newcomers = 256;

  // What rank 0 turned away, for an error at the deadline: strangers, other jobs, connections
  // that never finished their hello.
  std::string refusals(const std::vector<newcomer>& pending) const {
    std::vector<std::string> all = refused_;
    for (const newcomer& n : pending)
      all.push_back("the connection from " + n.from + " sent " + std::to_string(n.got) +
                    " bytes of its hello");
    if (all.empty()) return {};
    std::string s = "; turned away: ";
    for (std::size_t i = 0; i < all.size() && i < 8; ++i) s += (i ? "; " : "") + all[i];
    if (all.size() > 8) s += "; and " + std::to_string(all.size() - 8) + " more";
    return s;
  }

  void rendezvous_as_root(const params& p, const deadline& dl) {
    const socket listener = listen_on(p);
    peers_.resize(world_size_);
    // Connections whose hello is incomplete are watched alongside the listener, so that a silent
    // stranger on the port cannot hold up the ranks behind it.
    std::vector<newcomer> newcomers;
    for (int joined = 1; joined < world_size_;) {
      std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
      for (const newcomer& n : newcomers) fds.push_back({n.sock.fd(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), detail::tcp::poll_timeout(dl)) <= 0) {
        if (dl.expired()) {
          int r = 1;
          while (peers_[r].valid()) ++r;
          fail_as_root(rendezvous_op, r,
                       describe(io::timed_out, r, rendezvous_op) + " (" + std::to_string(joined) +
                           " of " + std::to_string(world_size_) + " ranks had connected" +
                           refusals(newcomers) + ")");
        }
        continue;
      }
      // Backwards, so that erasing keeps the indices of the entries still to visit.
      for (std::size_t i = newcomers.size(); i-- > 0;) {
        if (fds[i + 1].revents == 0) continue;
        newcomer& n = newcomers[i];
        const std::size_t needed = detail::tcp::parse_hello(std::span(n.hello).first(n.got)).needed;
        const std::optional<std::size_t> got =
            detail::tcp::recv_some(n.sock.fd(), std::span(n.hello).subspan(n.got, needed - n.got));
        if (got) {
          n.got += *got;
          const detail::tcp::hello_parse h =
              detail::tcp::parse_hello(std::span(n.hello).first(n.got));
          if (h.state == detail::tcp::hello_state::incomplete) continue;
          if (h.state == detail::tcp::hello_state::stranger)
            refused_.push_back("a stranger at " + n.from + " (" + h.why + ")");
          else if (admit(std::move(n.sock), h.value, n.from))
            ++joined;
        } else {
          refused_.push_back("the connection from " + n.from + " closed after " +
                             std::to_string(n.got) + " bytes of its hello");
        }
        newcomers.erase(newcomers.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (fds[0].revents != 0) accept_all(listener, newcomers);
    }
    const auto ok = detail::tcp::reply_header(detail::tcp::reply_ok, no_peer, 0);
    for (int r = 1; r < world_size_; ++r) {
      const io sent = detail::tcp::send_all(peers_[r].fd(), ok, dl);
      if (sent != io::ok) fail_as_root(rendezvous_op, r, describe(sent, r, rendezvous_op), r);
    }
  }

  void accept_all(const socket& listener, std::vector<newcomer>& newcomers) {
    for (;;) {
      sockaddr_in peer{};
      socklen_t len = sizeof peer;
      const int fd = ::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&peer), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        detail::tcp::set_nodelay(fd);
        char ip[INET_ADDRSTRLEN] = "?";
        ::inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip);
        if (newcomers.size() == max_newcomers) {
          refused_.push_back("the connection from " + newcomers.front().from +
                             ", dropped for newer ones before it finished its hello");
          newcomers.erase(newcomers.begin());
        }
        newcomers.push_back(
            {socket(fd), std::string(ip) + ":" + std::to_string(ntohs(peer.sin_port))});
        continue;
      }
      // A connection that failed before being accepted is the connecting side's problem.
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
        return;
      }
      fail_as_root(rendezvous_op, no_peer, "accept failed: " + detail::tcp::errno_text(errno));
    }
  }

  // Rank 0 may not be listening yet (launchers start ranks in any order), so failed attempts are
  // retried until the deadline.
  void rendezvous_as_member(const params& p, const deadline& dl) {
    std::string why;
    for (;;) {
      if (const auto addr = detail::tcp::resolve(p.master_addr, p.master_port, why)) {
        root_ = detail::tcp::try_connect(*addr, dl, why);
        if (root_.valid()) break;
      }
      if (dl.expired()) {
        throw error(rank_, rendezvous_op, 0,
                    "could not reach rank 0 at " + p.master_addr + ":" +
                        std::to_string(p.master_port) + " before the deadline: " + why);
      }
      std::this_thread::sleep_for(std::min<steady::duration>(retry_interval, dl.remaining()));
    }
    const std::vector<std::byte> hello = detail::tcp::encode_hello(
        {static_cast<std::uint32_t>(world_size_), static_cast<std::uint32_t>(rank_), job_id_});
    const io sent = detail::tcp::send_all(root_.fd(), hello, dl);
    if (sent != io::ok) fail(rendezvous_op, 0, describe(sent, 0, rendezvous_op));
    receive_reply(rendezvous_op, dl, 0);
  }

  std::vector<std::byte> exchange(std::span<const std::byte> mine, const deadline& dl,
                                  std::string_view op) {
    if (!failure_.empty()) {
      throw error(rank_, op, no_peer, "unusable after an earlier failure: " + failure_);
    }
    if (world_size_ == 1) return {mine.begin(), mine.end()};
    return rank_ == 0 ? gather_as_root(mine, dl, op) : gather_as_member(mine, dl, op);
  }

  struct inbound {
    std::array<std::byte, detail::tcp::block_header_bytes> header{};
    std::size_t got = 0;
  };

  // Reads what has arrived of rank r's block into `block`, without blocking; true once complete.
  bool receive_block(int r, inbound& in, std::span<std::byte> block, std::string_view op) {
    for (;;) {
      const bool in_header = in.got < in.header.size();
      const std::span<std::byte> rest = in_header ? std::span(in.header).subspan(in.got)
                                                  : block.subspan(in.got - in.header.size());
      if (rest.empty()) return true;
      const std::optional<std::size_t> n = detail::tcp::recv_some(peers_[r].fd(), rest);
      if (!n) fail_as_root(op, r, describe(io::lost, r, op));
      if (*n == 0) return false;
      in.got += *n;
      if (in_header && in.got == in.header.size()) {
        const std::uint64_t length = detail::tcp::get_le<8>(in.header.data());
        if (length != block.size()) {
          fail_as_root(op, r,
                       "rank " + std::to_string(r) + " passed " + std::to_string(length) +
                           " bytes to " + std::string(op) + " but rank 0 passed " +
                           std::to_string(block.size()));
        }
      }
    }
  }

  std::vector<std::byte> gather_as_root(std::span<const std::byte> mine, const deadline& dl,
                                        std::string_view op) {
    const std::size_t n = mine.size();
    std::vector<std::byte> all(n * static_cast<std::size_t>(world_size_));
    std::ranges::copy(mine, all.begin());
    // Blocks are read as they arrive rather than in rank order, so that a lost rank is noticed at
    // once, whichever rank it is and whatever the others are doing.
    std::vector<inbound> in(world_size_);
    std::vector<int> waiting;
    for (int r = 1; r < world_size_; ++r) waiting.push_back(r);
    while (!waiting.empty()) {
      std::vector<pollfd> fds;
      for (const int r : waiting) fds.push_back({peers_[r].fd(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), detail::tcp::poll_timeout(dl)) <= 0) {
        if (dl.expired()) {
          const int r = waiting.front();
          fail_as_root(op, r,
                       describe(io::timed_out, r, op) + " (" +
                           std::to_string(world_size_ - static_cast<int>(waiting.size())) + " of " +
                           std::to_string(world_size_) + " ranks had sent their block)");
        }
        continue;
      }
      for (std::size_t i = 0; i < fds.size(); ++i) {
        const int r = waiting[i];
        if (fds[i].revents != 0 && receive_block(r, in[r], std::span(all).subspan(r * n, n), op)) {
          waiting[i] = 0;  // Rank 0 never waits for itself: 0 marks a finished rank.
        }
      }
      std::erase(waiting, 0);
    }
    const auto header = detail::tcp::reply_header(detail::tcp::reply_ok, no_peer, all.size());
    for (int r = 1; r < world_size_; ++r) {
      io sent = detail::tcp::send_all(peers_[r].fd(), header, dl);
      if (sent == io::ok) sent = detail::tcp::send_all(peers_[r].fd(), all, dl);
      if (sent != io::ok) fail_as_root(op, r, describe(sent, r, op), r);
    }
    return all;
  }

  std::vector<std::byte> gather_as_member(std::span<const std::byte> mine, const deadline& dl,
                                          std::string_view op) {
    std::array<std::byte, detail::tcp::block_header_bytes> header{};
    detail::tcp::put_le<8>(header.data(), mine.size());
    io sent = detail::tcp::send_all(root_.fd(), header, dl, /*watch_input=*/true);
    if (sent == io::ok) sent = detail::tcp::send_all(root_.fd(), mine, dl, /*watch_input=*/true);
    if (sent == io::timed_out) fail(op, 0, describe(sent, 0, op));
    // Rank 0 has replied early (peer_spoke), or the send failed (lost) because rank 0 reported a
    // failure and went away; either way its report may be waiting, and it names the real culprit.
    // Without one, receive_reply reports the lost connection.
    return receive_reply(op, dl, mine.size() * static_cast<std::size_t>(world_size_));
  }

  // Rank 0's reply: `expected` bytes of result, or the report of a failure elsewhere, thrown
  // here with the peer rank 0 blamed.
  std::vector<std::byte> receive_reply(std::string_view op, const deadline& dl,
                                       std::size_t expected) {
    using detail::tcp::get_le;
    std::array<std::byte, detail::tcp::reply_header_bytes> header{};
    if (const io got = detail::tcp::recv_all(root_.fd(), header, dl); got != io::ok) {
      fail(op, 0, describe(got, 0, op));
    }
    const std::uint64_t status = get_le<4>(&header[4]), length = get_le<8>(&header[12]);
    const int peer = static_cast<int>(static_cast<std::uint32_t>(get_le<4>(&header[8])));
    if (get_le<4>(&header[0]) != detail::tcp::magic ||
        (status != detail::tcp::reply_ok && status != detail::tcp::reply_failed) ||
        (status == detail::tcp::reply_ok && length != expected)) {
      fail(op, 0,
           "malformed reply from rank 0 during " + std::string(op) +
               " (is something other than an epcomm bootstrap listening on the rendezvous port, "
               "EPCOMM_MASTER_PORT or MASTER_PORT + 1?)");
    }
    std::vector<std::byte> body(length);
    if (const io got = detail::tcp::recv_all(root_.fd(), body, dl); got != io::ok) {
      fail(op, 0, describe(got, 0, op));
    }
    if (status == detail::tcp::reply_failed) {
      fail(op, peer,
           std::string(reinterpret_cast<const char*>(body.data()), body.size()) +
               " (reported by rank 0)");
    }
    return body;
  }

  int rank_;
  int world_size_;
  int local_rank_;
  int local_world_size_;
  std::string job_id_;
  std::vector<std::string> refused_;  // Rank 0: what it turned away during the rendezvous.
  socket root_;                       // Members: the connection to rank 0.
  std::vector<socket> peers_;  // Rank 0: peers_[r] is the connection to rank r; peers_[0] unused.
  std::string failure_;        // The cause of the first failure; empty while usable.
};

static_assert(bootstrap<env_bootstrap>);

}  // namespace epcomm
