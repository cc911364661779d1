// NVLink / CUDA IPC transport: every rank allocates its symmetric buffer in
// device memory, publishes a handle to it through the bootstrap, and maps its
// peers' buffers into its own address space; kernels then store straight into
// peers' buffers (NVLink between GPUs, or plain device memory when several
// ranks share one GPU) and signal through 64-bit counters that also live in
// device memory, at the head of each allocation.
//
// Two ways to share the memory (options::memory):
//   ipc     cudaIpcGetMemHandle / cudaIpcOpenMemHandle: ranks of the same node
//           (the bootstrap's local group) are mapped, other ranks are not;
//   fabric  CUDA fabric handles (fabric_memory.hpp): every rank of the job is
//           mapped, for NVLink domains that span hosts.
// Either way the ranks are separate processes: a process cannot open its own
// IPC handle, so ranks as threads of one process are not supported.
//
// The memory is device memory, so this transport does not model
// peer_mapped_transport (the host engine stores through peer_ptr); it models
// device_transport, whose users are kernels (epcomm/cuda/).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/cuda_check.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/spin_wait.hpp"
#include "epcomm/core/wire_basics.hpp"
#include "epcomm/nvlink_ipc/fabric_memory.hpp"
#include "epcomm/transport/concepts.hpp"
#include "epcomm/transport/peer_table.hpp"
#include "epcomm/transport/process_identity.hpp"

namespace epcomm::nvlink_ipc {

enum class memory_kind : std::int32_t { ipc = 0, fabric = 1 };

struct options {
  // Unset: EPCOMM_NVLINK_MEMORY (ipc or fabric) if set, else ipc, so a job
  // picks the multi-node path without recompiling. Every rank must end up
  // with the same kind (checked).
  std::optional<memory_kind> memory;
};

class transport {
 public:
  // Collective over `boot`: every rank passes the same `bytes` and
  // `signal_slots`, with the CUDA device it will use already current.
  template <bootstrap B>
  transport(B& boot, std::size_t bytes, std::size_t signal_slots, deadline dl, options opt = {})
      : rank_(boot.rank()),
        world_(boot.world_size()),
        node_size_(boot.local_world_size()),
        user_slots_(signal_slots),
        signal_bytes_(wire::align_up((signal_slots + world_) * sizeof(std::uint64_t), 4096)),
        bytes_(bytes),
        memory_(resolve(opt.memory, boot.rank())),
        table_{},
        open_(world_, false),
        processes_(world_) {
    table_.rank = rank_;
    table_.world_size = world_;
    try {
      set_up(boot, dl);
    } catch (...) {
      release();
      throw;
    }
  }

  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  ~transport() { release(); }

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int device() const { return device_; }
  memory_kind memory() const { return memory_; }
  std::size_t signal_slots() const { return user_slots_; }

  std::span<std::byte> local_device_buffer() { return {table_.buffer[rank_], bytes_}; }
  std::byte* peer_device_ptr(int peer, std::size_t offset) { return table_.buffer[peer] + offset; }
  bool is_peer_mapped(int peer) const { return table_.buffer[peer] != nullptr; }

  // True when `peer`'s process is known to be gone: a rank on this host, in
  // this pid namespace (transport/process_identity.hpp). A kernel cannot ask;
  // the low-latency device buffer's exit watch does, for mask_lost_ranks.
  bool peer_exited(int peer) const {
    return peer >= 0 && peer < world_ && peer != rank_ && proxy::exited(processes_[peer], self_);
  }

  // The pointer table kernels receive: buffers and signals of every mapped rank.
  cuda::peer_table device_handle() const { return table_; }

  // Every mapped rank has arrived. Host-driven through the transport's own
  // counters (one writer per counter, so storing the epoch is counting):
  // for bring-up and teardown, not for the data path.
  void barrier(deadline dl) {
    const std::uint64_t epoch = ++barrier_epoch_;
    for (int p = 0; p < world_; ++p)
      if (is_peer_mapped(p))
        cuda::check_cuda(cudaMemcpyAsync(table_.signals[p] + user_slots_ + rank_, &epoch,
                                         sizeof epoch, cudaMemcpyHostToDevice, stream_),
                         rank_, "barrier", p, "cudaMemcpyAsync(barrier signal)");
    cuda::check_cuda(cudaStreamSynchronize(stream_), rank_, "barrier", no_peer,
                     "cudaStreamSynchronize");
    std::vector<std::uint64_t> seen(world_);
    int late = no_peer;
    auto arrived = [&] {
      cuda::check_cuda(cudaMemcpy(seen.data(), table_.signals[rank_] + user_slots_,
                                  sizeof(std::uint64_t) * world_, cudaMemcpyDeviceToHost),
                       rank_, "barrier", no_peer, "cudaMemcpy(barrier signals)");
      for (int p = 0; p < world_; ++p) {
        if (is_peer_mapped(p) && seen[p] < epoch) {
          late = p;
          return false;
        }
      }
      return true;
    };
    if (!epcomm::detail::spin_wait(arrived, dl, [] {}))
      throw error(rank_, "barrier", late,
                  "deadline expired waiting for barrier arrival: expected " +
                      std::to_string(epoch) + ", saw " + std::to_string(seen[late]));
  }

 private:
  static memory_kind resolve(std::optional<memory_kind> chosen, int rank) {
    if (chosen) return *chosen;
    const char* s = std::getenv("EPCOMM_NVLINK_MEMORY");
    if (s == nullptr || std::strcmp(s, "ipc") == 0) return memory_kind::ipc;
    if (std::strcmp(s, "fabric") == 0) return memory_kind::fabric;
    throw error(rank, "nvlink_ipc setup", no_peer,
                std::string("EPCOMM_NVLINK_MEMORY must be ipc or fabric, not '") + s + "'");
  }

  // What each rank publishes: its handle and enough to check that all agree.
  struct announcement {
    cudaIpcMemHandle_t ipc;
    unsigned char fabric[64];
    std::uint64_t length;
    std::int32_t memory;
    std::int32_t ok;  // 0: this rank failed; `cause` says why
    char cause[wire::cause_bytes];
    proxy::process_identity process;
  };

  // After mapping: whether each rank could map every peer it should.
  struct mapped_status {
    std::int32_t ok;
    std::int32_t peer;  // the peer it could not map
    char cause[wire::cause_bytes];
  };

  static void set_cause(char (&out)[wire::cause_bytes], const char* what) {
    std::strncpy(out, what, sizeof out - 1);
    out[sizeof out - 1] = '\0';
  }

  template <bootstrap B>
  void set_up(B& boot, deadline dl) {
    if (world_ > cuda::peer_table::max_ranks)
      throw error(rank_, "nvlink_ipc setup", no_peer,
                  "world_size " + std::to_string(world_) + " exceeds the device pointer table's " +
                      std::to_string(cuda::peer_table::max_ranks) + " ranks");

    // A rank that fails here still joins the exchange, marked failed, so its
    // peers stop at once with its reason instead of waiting out a deadline.
    announcement mine{};
    mine.length = signal_bytes_ + bytes_;
    mine.memory = static_cast<std::int32_t>(memory_);
    mine.process = self_;
    std::exception_ptr local_failure;
    try {
      allocate_own(mine);
      mine.ok = 1;
    } catch (const error& e) {
      local_failure = std::current_exception();
      set_cause(mine.cause, e.cause().c_str());
    }
    const auto bytes = boot.all_gather(std::as_bytes(std::span(&mine, 1)), dl);
    std::vector<announcement> all(world_);
    std::memcpy(all.data(), bytes.data(), bytes.size());
    if (local_failure) std::rethrow_exception(local_failure);
    for (int p = 0; p < world_; ++p) {
      processes_[p] = all[p].process;
      if (!all[p].ok)
        throw error(rank_, "nvlink_ipc setup", p,
                    std::string("that rank could not set up its buffer: ") + all[p].cause);
      if (all[p].memory != mine.memory)
        throw error(rank_, "nvlink_ipc setup", p,
                    "memory kinds disagree (EPCOMM_NVLINK_MEMORY must match on every rank)");
      if (all[p].length != mine.length)
        throw error(rank_, "nvlink_ipc setup", p,
                    "buffer sizes disagree: " + std::to_string(all[p].length) + " bytes there, " +
                        std::to_string(mine.length) + " here");
    }

    mapped_status status{1, no_peer, {}};
    try {
      map_peers(all);
    } catch (const error& e) {
      local_failure = std::current_exception();
      status = {0, e.peer(), {}};
      set_cause(status.cause, e.cause().c_str());
    }
    const auto verdicts = boot.all_gather(std::as_bytes(std::span(&status, 1)), dl);
    std::vector<mapped_status> each(world_);
    std::memcpy(each.data(), verdicts.data(), verdicts.size());
    if (local_failure) std::rethrow_exception(local_failure);
    for (int p = 0; p < world_; ++p)
      if (!each[p].ok)
        throw error(
            rank_, "nvlink_ipc setup", p,
            "that rank could not map rank " + std::to_string(each[p].peer) + ": " + each[p].cause);
  }

  void allocate_own(announcement& mine) {
    const auto check = [this](cudaError_t s, const char* call) {
      cuda::check_cuda(s, rank_, "nvlink_ipc setup", no_peer, call);
    };
    check(cudaGetDevice(&device_), "cudaGetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    void* base = nullptr;
    if (memory_ == memory_kind::fabric) {
#if CUDART_VERSION >= 12050
      if (!detail::fabric_mapping::supported(rank_, device_))
        throw error(rank_, "nvlink_ipc setup", no_peer,
                    "device " + std::to_string(device_) + " cannot export fabric handles");
      CUmemFabricHandle handle{};
      own_fabric_ = detail::fabric_mapping::allocate(rank_, device_, mine.length, &handle);
      static_assert(sizeof handle.data == sizeof mine.fabric);
      std::memcpy(mine.fabric, handle.data, sizeof mine.fabric);
      base = own_fabric_.data();
#else
      throw error(rank_, "nvlink_ipc setup", no_peer,
                  "fabric memory needs epcomm built with CUDA 12.5 or newer");
#endif
    } else {
      check(cudaMalloc(&base, mine.length), "cudaMalloc(symmetric buffer)");
      own_malloc_ = base;
      check(cudaIpcGetMemHandle(&mine.ipc, base), "cudaIpcGetMemHandle");
    }
    // Zero before anyone can know the address: counters start at 0 and no
    // stale header can pass for a current one.
    check(cudaMemsetAsync(base, 0, mine.length, stream_), "cudaMemsetAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    set_table(rank_, static_cast<std::byte*>(base));
  }

  void map_peers(const std::vector<announcement>& all) {
    const int node = rank_ / node_size_;
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      if (memory_ == memory_kind::fabric) {
#if CUDART_VERSION >= 12050
        CUmemFabricHandle handle{};
        std::memcpy(handle.data, all[p].fabric, sizeof handle.data);
        peer_fabric_.push_back(
            detail::fabric_mapping::import(rank_, device_, p, handle, all[p].length));
        set_table(p, peer_fabric_.back().data());
#endif
      } else if (p / node_size_ == node) {
        void* base = nullptr;
        cuda::check_cuda(cudaIpcOpenMemHandle(&base, all[p].ipc, cudaIpcMemLazyEnablePeerAccess),
                         rank_, "nvlink_ipc setup", p, "cudaIpcOpenMemHandle");
        open_[p] = true;
        set_table(p, static_cast<std::byte*>(base));
      }
    }
  }

  void set_table(int p, std::byte* base) {
    table_.signals[p] = reinterpret_cast<std::uint64_t*>(base);
    table_.buffer[p] = base + signal_bytes_;
  }

  // Runs after the last call on this buffer completed on every rank (each
  // call ends by waiting for every peer's final signal), so no peer still
  // writes here.
  void release() noexcept {
    for (int p = 0; p < world_; ++p) {
      if (open_[p]) cudaIpcCloseMemHandle(table_.signals[p]);
      open_[p] = false;
    }
#if CUDART_VERSION >= 12050
    peer_fabric_.clear();
    own_fabric_ = {};
#endif
    if (own_malloc_ != nullptr) cudaFree(own_malloc_);
    own_malloc_ = nullptr;
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
    for (int p = 0; p < world_; ++p) table_.buffer[p] = nullptr, table_.signals[p] = nullptr;
  }

  int rank_;
  int world_;
  int node_size_;
  std::size_t user_slots_;
  std::size_t signal_bytes_;
  std::size_t bytes_;
  memory_kind memory_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  cuda::peer_table table_;
  std::vector<bool> open_;  // peers mapped with cudaIpcOpenMemHandle
  const proxy::process_identity self_ = proxy::this_process();
  std::vector<proxy::process_identity> processes_;  // every rank's, from the set-up exchange
  void* own_malloc_ = nullptr;
#if CUDART_VERSION >= 12050
  detail::fabric_mapping own_fabric_;
  std::vector<detail::fabric_mapping> peer_fabric_;
#endif
  std::uint64_t barrier_epoch_ = 0;
};

static_assert(device_transport<transport>);
// Device memory: the host engine must not be handed this transport.
static_assert(!peer_mapped_transport<transport>);

}  // namespace epcomm::nvlink_ipc
