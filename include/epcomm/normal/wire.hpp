// The wire format of normal mode: what lives where in every rank's symmetric
// buffer and which signal slot means what. Host engine and CUDA kernels both
// read it from here; everything is plain integers so it is usable on device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/core/wire_basics.hpp"

namespace epcomm::wire {

inline constexpr std::uint32_t magic = 0x31435045;  // "EPC1"

// Signals are 64-bit counters, one per (kind, source rank); a source adds 1
// per operation, so a receiver waits for "counter >= epoch". Counting, never
// "the last byte arrived", keeps this valid on fabrics that reorder writes.
// combine_read: a source has reduced the rows an in-place combine left in
// this rank's buffer, which may be overwritten from then on. window_free
// (a buffer with a receive window, normal/window.hpp): the receiver has
// copied the rows of a round out of its window, which the sender may fill
// again; data and combine_data then count rounds, not calls.
enum class signal_kind : int {
  notify = 0,
  data = 1,
  combine_ready = 2,
  combine_data = 3,
  combine_read = 4,
  window_free = 5,
  count
};

EPCOMM_HD constexpr std::size_t signal_slot(signal_kind kind, int source, int world_size) {
  return static_cast<std::size_t>(kind) * world_size + source;
}
EPCOMM_HD constexpr std::size_t signal_slots(int world_size) {
  return static_cast<std::size_t>(signal_kind::count) * world_size;
}

enum class status : std::int32_t { ok = 0, invalid_input = 1 };

// What a rank tells every peer before any payload moves (the "notify" phase):
// its shape, whether its input is valid, and its counts. Followed in the slot
// by int32 tokens_per_rank[R] and int32 tokens_per_local_expert[E/R] (for the
// experts of the slot's owner).
struct notify_header {
  std::uint32_t magic;
  status state;
  std::uint64_t epoch;
  std::int32_t num_tokens;
  std::int32_t hidden;
  std::int32_t topk;
  std::int32_t num_experts;
  std::int32_t token_id;    // token_traits<Token>::id
  std::int32_t recv_bound;  // the sender's own worst-case receive bound, 0 = none
  std::int32_t routing;     // dispatch from a cached handle: its routing_fingerprint, else 0
  char cause[cause_bytes];  // NUL-terminated, set when state != ok
};

// Posted by each rank before it receives combine rows, so that a rank whose
// combine input is bad stops every peer before any row moves.
struct combine_header {
  std::uint64_t epoch;
  status state;
  std::int32_t with_weights;  // every rank passes topk_weights or none does
  std::int32_t in_place;      // y is this rank's combine_y: sources read the rows there
  // token_traits id of y's elements, which every rank must share; 0 from an
  // engine that serves one combine type (nothing to disagree on).
  std::int32_t out_id;
  // routing_fingerprint of the handle (its count matrix and origin): every
  // rank must combine along its handle of the same dispatch, or rows would go to wrong places
  // (or, under a byte budget, ranks would run different numbers of rounds).
  std::int32_t routing;
  char cause[cause_bytes];
};

// Capacities a buffer is built with; identical on every rank.
struct capacity {
  int world_size;
  int num_experts;
  int max_hidden;
  int max_topk;
  int max_tokens_per_rank;
  int max_recv_tokens;   // rows a rank can receive in dispatch
  int max_combine_rows;  // rows a rank can receive back in combine
  int token_bytes;       // bytes per element of dispatched tokens
  int combine_bytes;     // bytes per element of combined rows
  bool has_scales;       // fp8 tokens carry one fp32 scale per 128 channels
  // 0: the regions hold a whole call (max_recv_tokens, max_combine_rows).
  // Else a byte budget bounds the buffer (normal/window.hpp): they hold
  // window_rows rows per peer, and larger calls move in rounds.
  int window_rows;

  friend bool operator==(const capacity&, const capacity&) = default;
};

// Byte offsets of every array in the symmetric buffer. Arrays are laid out as
// structure of arrays sized by capacity; within an array, rows are packed with
// the call's actual hidden / topk, so a receiver's arrays are dense [N][H].
struct region_plan {
  std::size_t notify;  // R slots of notify_slot_bytes
  std::size_t notify_slot_bytes;
  std::size_t combine_status;  // R slots of sizeof(combine_header), aligned
  std::size_t combine_status_slot_bytes;
  // [signal_kind::count] uint64, written by this rank in its own buffer:
  // the last call whose round of that kind it has finished writing to every
  // peer, stored before the round's signals. Peer-mapped transports read a
  // lost peer's words here to settle, identically on every rank, which
  // rounds it completed (mask_lost_ranks; see normal/buffer.hpp).
  std::size_t progress;
  std::size_t recv_x;           // [max_recv_tokens][max_hidden] tokens
  std::size_t recv_scales;      // [max_recv_tokens][max_hidden/128] float
  std::size_t recv_topk_idx;    // [max_recv_tokens][max_topk] int64
  std::size_t recv_weights;     // [max_recv_tokens][max_topk] float
  std::size_t recv_src_idx;     // [max_recv_tokens] int32
  std::size_t combine_x;        // [max_combine_rows][max_hidden] combine elements
  std::size_t combine_weights;  // [max_combine_rows][max_topk] float
  // Expert outputs of an in-place combine (zero unless planned for
  // peer-mapped transports): [max_recv_tokens][max_hidden] combine elements
  // in receive order, read by the sources where they are.
  std::size_t combine_y;
  // Staging for RMA transports (zero unless planned with staging): what this
  // rank lays out in its own registered buffer for the proxy to put. The
  // send_* rows are dispatch's and the send_combine_* rows combine's; they
  // share one area, since a call stages only once the previous one's puts
  // are complete.
  std::size_t send_notify;           // R slots of notify_slot_bytes, one per destination
  std::size_t send_combine_status;   // one combine_status slot, the same for every peer
  std::size_t send_x;                // [max_combine_rows][max_hidden] tokens, by destination
  std::size_t send_scales;           // [max_combine_rows][max_hidden/128] float
  std::size_t send_topk_idx;         // [max_combine_rows][max_topk] int64
  std::size_t send_weights;          // [max_combine_rows][max_topk] float
  std::size_t send_src_idx;          // [max_combine_rows] int32
  std::size_t send_combine_x;        // [max_recv_tokens][max_hidden] combine elements
  std::size_t send_combine_weights;  // [max_recv_tokens][max_topk] float
  // The caller's tokens, written there through dispatch_send_buffer and put
  // from there: [max_tokens_per_rank][max_hidden] tokens, its own area.
  std::size_t send_tokens;
  std::size_t total;
};

// The arrays of `n` received rows (recv_x, recv_scales, recv_topk_idx,
// recv_weights, recv_src_idx), in this order: normal mode's plan and the
// hierarchical engine's node plan (hierarchical/wire.hpp) lay them out alike.
template <class Plan>
EPCOMM_HD constexpr void take_received_rows(Plan& p, carver& regions, const capacity& c,
                                            std::size_t n) {
  const std::size_t h = static_cast<std::size_t>(c.max_hidden);
  const std::size_t k = static_cast<std::size_t>(c.max_topk);
  p.recv_x = regions.take(n * h * c.token_bytes);
  p.recv_scales = regions.take(c.has_scales ? n * (h / 128) * sizeof(float) : 0);
  p.recv_topk_idx = regions.take(n * k * sizeof(std::int64_t));
  p.recv_weights = regions.take(n * k * sizeof(float));
  p.recv_src_idx = regions.take(n * sizeof(std::int32_t));
}

// What every plan of an exchange among c.world_size ranks starts with, in
// this order: a notify slot of `notify_slot_bytes` and a combine status slot
// per rank, then `n` received rows (take_received_rows).
template <class Plan>
EPCOMM_HD constexpr void take_exchange_regions(Plan& p, carver& regions, const capacity& c,
                                               std::size_t notify_slot_bytes, std::size_t n) {
  const std::size_t ranks = static_cast<std::size_t>(c.world_size);
  p.notify_slot_bytes = notify_slot_bytes;
  p.notify = regions.take(notify_slot_bytes * ranks);
  p.combine_status_slot_bytes = align_up(sizeof(combine_header), 64);
  p.combine_status = regions.take(p.combine_status_slot_bytes * ranks);
  take_received_rows(p, regions, c, n);
}

// With a window (c.window_rows > 0) the receive, combine and staging rows are
// R windows of window_rows rows, one per peer, and there is neither an
// in-place combine region nor send_tokens: rows then reach their place in
// rounds, through host memory the engine owns (normal/window.hpp).
EPCOMM_HD constexpr region_plan plan_regions(const capacity& c, bool staging = false,
                                             bool in_place_combine = false) {
  region_plan p{};
  const bool windowed = c.window_rows > 0;
  const std::size_t window = static_cast<std::size_t>(c.world_size) * c.window_rows;
  const std::size_t n = windowed ? window : static_cast<std::size_t>(c.max_recv_tokens);
  const std::size_t rows = windowed ? window : static_cast<std::size_t>(c.max_combine_rows);
  const std::size_t h = static_cast<std::size_t>(c.max_hidden);
  const std::size_t k = static_cast<std::size_t>(c.max_topk);
  const std::size_t local_experts = static_cast<std::size_t>(c.num_experts / c.world_size);
  carver regions;
  take_exchange_regions(
      p, regions, c,
      align_up(sizeof(notify_header) + sizeof(std::int32_t) * (c.world_size + local_experts), 64),
      n);
  p.combine_x = regions.take(rows * h * c.combine_bytes);
  p.combine_weights = regions.take(rows * k * sizeof(float));
  if (in_place_combine && !windowed) p.combine_y = regions.take(n * h * c.combine_bytes);
  if (staging) {
    p.send_notify = regions.take(p.notify_slot_bytes * c.world_size);
    p.send_combine_status = regions.take(p.combine_status_slot_bytes);
    const std::size_t rows_at = regions.at();
    p.send_x = regions.take(rows * h * c.token_bytes);
    p.send_scales = regions.take(c.has_scales ? rows * (h / 128) * sizeof(float) : 0);
    p.send_topk_idx = regions.take(rows * k * sizeof(std::int64_t));
    p.send_weights = regions.take(rows * k * sizeof(float));
    p.send_src_idx = regions.take(rows * sizeof(std::int32_t));
    const std::size_t dispatch_end = regions.at();
    regions.back_to(rows_at);
    p.send_combine_x = regions.take(n * h * c.combine_bytes);
    p.send_combine_weights = regions.take(n * k * sizeof(float));
    regions.past(dispatch_end);
    if (!windowed)
      p.send_tokens =
          regions.take(static_cast<std::size_t>(c.max_tokens_per_rank) * h * c.token_bytes);
  }
  // Last, so that no other array moves for it.
  p.progress = regions.take(sizeof(std::uint64_t) * static_cast<std::size_t>(signal_kind::count));
  p.total = regions.at();
  return p;
}

}  // namespace epcomm::wire
