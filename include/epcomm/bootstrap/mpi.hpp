// A bootstrap over an MPI communicator, for jobs that mpirun, srun or another MPI launcher
// starts. all_gather and barrier are MPI's non-blocking collectives (MPI_Iallgather,
// MPI_Ibarrier) polled with MPI_Test, so every wait ends at its deadline even though MPI itself
// has no timeouts. The node a rank runs on is MPI's shared-memory domain
// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED).
//
// Link epcomm::mpi (it brings MPI::MPI_CXX). MPI must be initialised before a bootstrap is
// constructed, and the bootstrap must be destroyed before MPI_Finalize when that is possible; one
// destroyed after MPI_Finalize releases nothing (MPI has already released it).
#pragma once

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/spin_wait.hpp"

namespace epcomm {
namespace detail::mpi {

// The rank an error names before MPI has told this process its rank.
inline constexpr int unknown_rank = -1;

// One collective in flight: the request and every buffer MPI may still touch.
struct operation {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Comm new_comm = MPI_COMM_NULL;  // written by MPI_Comm_idup
  std::vector<std::byte> send;
  std::vector<std::byte> recv;
};

// MPI cannot cancel a collective (MPI_Cancel and MPI_Request_free are erroneous on one), and a
// late rank may still complete it at any time. A collective abandoned at its deadline therefore
// keeps its buffers until the process ends; this list, never destroyed, owns them.
inline void abandon(std::unique_ptr<operation> op) {
  static std::mutex lock;
  static auto* abandoned = new std::vector<std::unique_ptr<operation>>;
  const std::lock_guard<std::mutex> hold(lock);
  abandoned->push_back(std::move(op));
}

inline std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

inline bool mpi_usable() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  return initialised != 0 && finalised == 0;
}

}  // namespace detail::mpi

// Not thread-safe: one thread at a time may call all_gather/barrier. A deadline that expires,
// or an MPI error, makes every later call throw (the abandoned collective may still be matched
// by late ranks, so the communicator can no longer be trusted to pair calls). Blocks of
// different sizes are not such a failure: every rank sees the sizes, every rank throws the same
// error, and the bootstrap stays usable. A moved-from mpi_bootstrap may only be destroyed or
// assigned to.
class mpi_bootstrap {
 public:
  // Collective over `comm`: every rank of it constructs its bootstrap, within `timeout`
  // (EPCOMM_TIMEOUT_MS overrides it). The bootstrap works on its own duplicate of `comm`, whose
  // MPI errors are returned rather than fatal; an error in the duplication itself still goes to
  // `comm`'s error handler (MPI's default aborts the job). Ranks of one node must be consecutive
  // and every node must hold as many ranks (mpirun's default --map-by slot/core does that):
  // transports number nodes rank / local_world_size().
  explicit mpi_bootstrap(MPI_Comm comm = MPI_COMM_WORLD,
                         std::chrono::milliseconds timeout = default_timeout) {
    if (!detail::mpi::mpi_usable())
      throw error(detail::mpi::unknown_rank, setup_op, no_peer,
                  "MPI is not initialised (call MPI_Init first) or already finalised");
    if (comm == MPI_COMM_NULL)
      throw error(detail::mpi::unknown_rank, setup_op, no_peer,
                  "the communicator is MPI_COMM_NULL");
    int inter = 0;
    MPI_Comm_test_inter(comm, &inter);
    if (inter != 0)
      throw error(detail::mpi::unknown_rank, setup_op, no_peer,
                  "the communicator is an inter-communicator; pass an intra-communicator");
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &world_size_);
    const deadline dl = deadline::after(effective_timeout(timeout));
    try {
      duplicate(comm, dl);
      find_node(dl);
    } catch (...) {
      release();
      throw;
    }
  }

  mpi_bootstrap(mpi_bootstrap&& other) noexcept { *this = std::move(other); }
  mpi_bootstrap& operator=(mpi_bootstrap&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = other.rank_;
      world_size_ = other.world_size_;
      local_rank_ = other.local_rank_;
      local_world_size_ = other.local_world_size_;
      failure_ = std::move(other.failure_);
    }
    return *this;
  }
  mpi_bootstrap(const mpi_bootstrap&) = delete;
  mpi_bootstrap& operator=(const mpi_bootstrap&) = delete;
  ~mpi_bootstrap() { release(); }

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_world_size() const { return local_world_size_; }

  // Two rounds: the block sizes first, so that ranks passing different sizes get an error
  // rather than MPI's undefined behaviour, then the blocks.
  std::vector<std::byte> all_gather(std::span<const std::byte> mine, deadline dl) {
    constexpr std::string_view op = "bootstrap all_gather";
    ensure_usable(op);
    if (mine.size() > static_cast<std::size_t>(INT_MAX))
      throw error(rank_, op, no_peer,
                  "block of " + std::to_string(mine.size()) +
                      " bytes exceeds MPI's largest count (" + std::to_string(INT_MAX) + ")");
    const std::vector<std::uint64_t> sizes = gather_sizes(mine.size(), dl, op);
    for (int r = 0; r < world_size_; ++r)
      if (sizes[r] != sizes[0])
        throw error(rank_, op, r,
                    "block sizes disagree: rank " + std::to_string(r) + " passes " +
                        std::to_string(sizes[r]) + " bytes, rank 0 passes " +
                        std::to_string(sizes[0]));
    if (mine.empty()) return {};

    // Copies, not views: if the deadline expires, MPI may read and write them after we return.
    auto gather = std::make_unique<detail::mpi::operation>();
    gather->send.assign(mine.begin(), mine.end());
    gather->recv.resize(mine.size() * static_cast<std::size_t>(world_size_));
    const int count = static_cast<int>(mine.size());
    call(MPI_Iallgather(gather->send.data(), count, MPI_BYTE, gather->recv.data(), count, MPI_BYTE,
                        comm_, &gather->request),
         op, "MPI_Iallgather");
    gather = await(std::move(gather), dl, op, "every rank's block");
    return std::move(gather->recv);
  }

  void barrier(deadline dl) {
    constexpr std::string_view op = "bootstrap barrier";
    ensure_usable(op);
    auto b = std::make_unique<detail::mpi::operation>();
    call(MPI_Ibarrier(comm_, &b->request), op, "MPI_Ibarrier");
    await(std::move(b), dl, op, "every rank to enter the barrier");
  }

 private:
  static constexpr std::string_view setup_op = "bootstrap setup";

  void duplicate(MPI_Comm comm, const deadline& dl) {
    auto dup = std::make_unique<detail::mpi::operation>();
    call(MPI_Comm_idup(comm, &dup->new_comm, &dup->request), setup_op, "MPI_Comm_idup");
    dup = await(std::move(dup), dl, setup_op, "every rank to construct its bootstrap");
    comm_ = dup->new_comm;
    call(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), setup_op, "MPI_Comm_set_errhandler");
  }

  // The duplication has completed, so every rank has arrived: the split below (MPI has no
  // non-blocking one) waits only for ranks that are known to be running.
  void find_node(const deadline& dl) {
    MPI_Comm node = MPI_COMM_NULL;
    call(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), setup_op,
         "MPI_Comm_split_type");
    struct placement {
      std::int32_t local_rank, local_size, first_rank;  // first_rank: lowest rank of the node
    } mine{};
    MPI_Group node_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    const int zero = 0;
    int rc = MPI_Comm_rank(node, &mine.local_rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(node, &mine.local_size);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(node, &node_group);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(comm_, &group);
    if (rc == MPI_SUCCESS)
      rc = MPI_Group_translate_ranks(node_group, 1, &zero, group, &mine.first_rank);
    if (node_group != MPI_GROUP_NULL) MPI_Group_free(&node_group);
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    MPI_Comm_free(&node);
    call(rc, setup_op, "querying the node communicator");

    const auto bytes = all_gather(std::as_bytes(std::span(&mine, 1)), dl);
    std::vector<placement> all(static_cast<std::size_t>(world_size_));
    std::memcpy(all.data(), bytes.data(), bytes.size());
    const int per_node = all[0].local_size;
    for (int r = 0; r < world_size_; ++r) {
      const placement& p = all[static_cast<std::size_t>(r)];
      if (p.local_size != per_node || p.first_rank != r / per_node * per_node ||
          p.local_rank != r % per_node)
        throw error(rank_, setup_op, r,
                    "ranks are not placed in equal blocks of consecutive ranks per node (rank " +
                        std::to_string(r) + " is local rank " + std::to_string(p.local_rank) +
                        " of " + std::to_string(p.local_size) + " on the node of rank " +
                        std::to_string(p.first_rank) + ", rank 0's node holds " +
                        std::to_string(per_node) +
                        "); start the job with the same number of ranks on every node, placed "
                        "by slot (mpirun --map-by slot)");
    }
    local_rank_ = mine.local_rank;
    local_world_size_ = per_node;
  }

  std::vector<std::uint64_t> gather_sizes(std::size_t bytes, const deadline& dl,
                                          std::string_view op) {
    auto sizes = std::make_unique<detail::mpi::operation>();
    const std::uint64_t mine = bytes;
    sizes->send.resize(sizeof mine);
    std::memcpy(sizes->send.data(), &mine, sizeof mine);
    sizes->recv.resize(sizeof mine * static_cast<std::size_t>(world_size_));
    call(MPI_Iallgather(sizes->send.data(), sizeof mine, MPI_BYTE, sizes->recv.data(), sizeof mine,
                        MPI_BYTE, comm_, &sizes->request),
         op, "MPI_Iallgather");
    sizes = await(std::move(sizes), dl, op, "every rank's block size");
    std::vector<std::uint64_t> all(static_cast<std::size_t>(world_size_));
    std::memcpy(all.data(), sizes->recv.data(), sizes->recv.size());
    return all;
  }

  // Polls the operation until it completes (returned, for its results) or dl expires (thrown;
  // the operation is abandoned, see detail::mpi::abandon). MPI_Test is also what makes progress.
  std::unique_ptr<detail::mpi::operation> await(std::unique_ptr<detail::mpi::operation> operation,
                                                const deadline& dl, std::string_view op,
                                                const char* what) {
    int done = 0;
    int rc = MPI_SUCCESS;
    auto ready = [&] {
      rc = MPI_Test(&operation->request, &done, MPI_STATUS_IGNORE);
      return rc != MPI_SUCCESS || done != 0;
    };
    const bool in_time = detail::spin_wait(ready, dl, [] {});
    if (in_time && rc == MPI_SUCCESS) return operation;
    detail::mpi::abandon(std::move(operation));
    if (!in_time)
      fail(op, std::string("deadline expired waiting for ") + what +
                   " (MPI cannot cancel a collective; this bootstrap is unusable from now on)");
    fail(op, std::string("MPI_Test failed: ") + detail::mpi::error_text(rc));
  }

  void call(int rc, std::string_view op, const char* what) {
    if (rc != MPI_SUCCESS) fail(op, std::string(what) + " failed: " + detail::mpi::error_text(rc));
  }

  [[noreturn]] void fail(std::string_view op, const std::string& cause) {
    failure_ = cause;
    throw error(rank_, op, no_peer, cause);
  }

  void ensure_usable(std::string_view op) const {
    if (failure_)
      throw error(rank_, op, no_peer, "unusable after an earlier failure: " + *failure_);
  }

  // MPI_Comm_free only marks the communicator: MPI frees it once abandoned operations on it end.
  void release() {
    if (comm_ != MPI_COMM_NULL && detail::mpi::mpi_usable()) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = detail::mpi::unknown_rank;
  int world_size_ = 0;
  int local_rank_ = 0;
  int local_world_size_ = 0;
  std::optional<std::string> failure_;
};

static_assert(bootstrap<mpi_bootstrap>);

}  // namespace epcomm
