// The per-peer copy: the bytes an op sends, moved over the transport's raw link and nothing else
// (no layout, no count exchange, no signals, no metadata), with the same bytes per peer as
// epcomm moves, measured in the same run and the same interleaved loop. A yardstick of what the
// link costs, not a bound: the copy is cold and one per peer, where epcomm may write a token to
// several ranks from cache (memory_bound.hpp has the bound).
//
// A peer-mapped link is a plain memcpy per peer, from a buffer of this rank's into the peer's
// mapped segment: one thread per rank, every rank at once, as epcomm's host engine copies.
// An RMA link (libfabric, UCX) is a put per peer from this rank's registered buffer, then one
// counted signal and a flush per peer; every rank waits for its own operations and for every
// peer's signal (waiting also drives progress on fabrics that need it), then for every peer to
// be done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/spin_wait.hpp"
#include "epcomm/proxy/engine.hpp"
#include "epcomm/transport/concepts.hpp"
#include "traffic.hpp"

namespace epcomm::bench {

template <class Transport>
class raw_link;

template <peer_mapped_transport Transport>
class raw_link<Transport> {
 public:
  // Collective: every rank passes the same `bytes`, the most any rank sends or receives.
  template <bootstrap B>
  raw_link(B& boot, std::size_t bytes)
      : transport_(boot, bytes, 0, deadline::after(effective_timeout(default_timeout))),
        source_(bytes) {
    // Written once, so the copies read real pages rather than the shared zero page.
    for (std::size_t i = 0; i < source_.size(); ++i) source_[i] = static_cast<std::byte>(i * 131);
  }

  void copy(std::span<const transfer> plan) {
    for (const transfer& t : plan)
      std::memcpy(transport_.peer_ptr(t.peer, t.dst_offset), source_.data() + t.src_offset,
                  t.bytes);
  }

 private:
  Transport transport_;
  std::vector<std::byte> source_;
};

// Peer-mapped transports take the memcpy link even if they also offer RMA.
template <class T>
concept rma_only_transport = has_completion_count<T> && !peer_mapped_transport<T>;

template <rma_only_transport Transport>
class raw_link<Transport> {
 public:
  // Collective: every rank passes the same `bytes`, the most any rank sends or receives. The
  // registered buffer holds the source (first half) and the destination (second half).
  template <bootstrap B>
  raw_link(B& boot, std::size_t bytes)
      : world_(boot.world_size()),
        half_(bytes),
        transport_(boot, 2 * bytes, 2 * static_cast<std::size_t>(world_),
                   deadline::after(effective_timeout(default_timeout))),
        issued_(transport_.completed()) {
    const std::span<std::byte> source = transport_.local_buffer().first(half_);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 131);
  }

  // Signal slots: [0, R) count the rounds in which rank s's puts to this rank have landed,
  // [R, 2R) the rounds in which rank s has finished. A fabric with manual progress may need a
  // peer to keep progressing until this rank's flush completes (UCX emulates atomics over
  // shared memory with messages the target executes), so no rank leaves before every rank is
  // done; the "done" signals themselves complete during the next round.
  void copy(std::span<const transfer> plan) {
    ++round_;
    const int rank = transport_.rank();
    for (const transfer& t : plan) {
      if (t.bytes == 0) continue;
      transport_.put(t.peer, t.src_offset, half_ + t.dst_offset, t.bytes);
      ++issued_;
    }
    for (int p = 0; p < world_; ++p) {
      transport_.signal_add(p, slot(data_slots, rank), 1);
      transport_.flush(p);
      issued_ += 2;
    }
    const deadline dl = deadline::after(effective_timeout(default_timeout));
    const std::uint64_t mine = issued_;
    const auto complete = [&] {
      transport_.progress();
      return transport_.completed() >= mine;
    };
    if (!detail::spin_wait(complete, dl, [] {}))
      throw error(rank, "raw link", no_peer, "deadline expired waiting for this rank's puts");
    for (int p = 0; p < world_; ++p)
      transport_.wait(slot(data_slots, p), round_, dl, {"raw link", p, "raw puts"});
    for (int p = 0; p < world_; ++p) {
      transport_.signal_add(p, slot(done_slots, rank), 1);
      ++issued_;
    }
    for (int p = 0; p < world_; ++p)
      transport_.wait(slot(done_slots, p), round_, dl, {"raw link", p, "the end of its round"});
  }

 private:
  static constexpr int data_slots = 0;
  static constexpr int done_slots = 1;

  std::size_t slot(int kind, int rank) const {
    return static_cast<std::size_t>(kind) * world_ + static_cast<std::size_t>(rank);
  }

  int world_;
  std::size_t half_;
  Transport transport_;
  std::uint64_t issued_;  // operations issued, numbered as the transport numbers them
  std::uint64_t round_ = 0;
};

}  // namespace epcomm::bench
