// The customization points' contracts: real types model their concepts, and
// types that break one requirement each are rejected. Compile-time only: this
// translation unit is built with the suite, and a broken contract breaks the build.
#include "epcomm/bootstrap/env.hpp"
#include "epcomm/bootstrap/local.hpp"
#include "epcomm/transport/concepts.hpp"
#include "epcomm/shm/transport.hpp"

using namespace epcomm;

namespace broken {

// Everything a transport needs, to derive near-misses from.
struct base_transport {
  int rank() const { return 0; }
  int world_size() const { return 1; }
  std::span<std::byte> local_buffer() { return {}; }
  void signal_add(int, std::size_t, std::uint64_t) {}
  void wait(std::size_t, std::uint64_t, deadline, wait_site) {}
  void barrier(deadline) {}
};

struct no_wait {
  int rank() const { return 0; }
  int world_size() const { return 1; }
  std::span<std::byte> local_buffer() { return {}; }
  void signal_add(int, std::size_t, std::uint64_t) {}
  void barrier(deadline) {}
};

struct rank_not_int : base_transport {
  long rank() const { return 0; }
};

struct peer_mapped_without_query : base_transport {
  std::byte* peer_ptr(int, std::size_t) { return nullptr; }
};

struct peer_mapped : base_transport {
  std::byte* peer_ptr(int, std::size_t) { return nullptr; }
  bool is_peer_mapped(int) const { return true; }
};

struct rma_without_flush : base_transport {
  void put(int, std::size_t, std::size_t, std::size_t) {}
  void put_signal(int, std::size_t, std::size_t, std::size_t, std::size_t, std::uint64_t) {}
  void progress() {}
};

struct rma : rma_without_flush {
  void flush(int) {}
};

struct gather_returns_void {
  int rank() const { return 0; }
  int world_size() const { return 1; }
  int local_rank() const { return 0; }
  int local_world_size() const { return 1; }
  void all_gather(std::span<const std::byte>, deadline) {}
  void barrier(deadline) {}
};

}  // namespace broken

static_assert(peer_mapped_transport<shm::transport>);
static_assert(!rma_transport<shm::transport>);
static_assert(transport_for<shm::transport, local_bootstrap>);
static_assert(transport_for<shm::transport, env_bootstrap>);
static_assert(bootstrap<local_bootstrap>);
static_assert(bootstrap<env_bootstrap>);

static_assert(transport<broken::base_transport>);
static_assert(!transport<broken::no_wait>);
static_assert(!transport<broken::rank_not_int>);
static_assert(!peer_mapped_transport<broken::base_transport>);
static_assert(!peer_mapped_transport<broken::peer_mapped_without_query>);
static_assert(peer_mapped_transport<broken::peer_mapped>);
static_assert(!rma_transport<broken::rma_without_flush>);
static_assert(rma_transport<broken::rma>);
static_assert(!bootstrap<broken::gather_returns_void>);
static_assert(!transport_for<broken::peer_mapped, local_bootstrap>);  // not constructible from one
