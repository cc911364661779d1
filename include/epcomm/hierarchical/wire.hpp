// The wire format of hierarchical normal mode (hierarchical/buffer.hpp): what lives
// where in the two symmetric buffers a rank owns, one registered with its
// node's peer-mapped transport, one with its rail's transport (the ranks with
// its local index on every node), and which signal slot means what. Like
// normal/wire.hpp, plain integers only, so that a device producer can use it.
//
// Regions of the node buffer keep the flat buffer's receive layout, so the
// results are the same views over the same arrays; the rail buffer carries
// what crosses nodes: records, relayed rows and partial sums.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm::wire::hier {

// Counted signals, one counter per (kind, source member of the group), +1 per
// call. Node transport: members are the node's ranks by local index.
enum class node_signal : int {
  notify = 0,          // the sender copied its rail's notify records here
  data = 1,            // the sender stored every row it owes this rank
  combine_ready = 2,   // the sender copied its rail's combine statuses here
  combine_staged = 3,  // the sender's y rows are in its buffer, readable
  count
};
// Rail transport: members are the rail's ranks by node index.
enum class rail_signal : int {
  notify = 0,           // the sender's notify record landed
  data = 1,             // the sender's rows for this node landed
  combine_ready = 2,    // the sender's combine status (and masks) landed
  combine_partial = 3,  // the partial sums this rank's tokens got on the sender's node landed
  count
};

template <class Kind>
EPCOMM_HD constexpr std::size_t signal_slot(Kind kind, int source, int members) {
  return static_cast<std::size_t>(kind) * members + source;
}
template <class Kind>
EPCOMM_HD constexpr std::size_t signal_slots(int members) {
  return static_cast<std::size_t>(Kind::count) * members;
}

// The record every rank gathers from every rank in the notify phase:
// notify_header, then int32 tokens_per_rank[R], tokens_per_node[N] (a token
// counts once per node however many of its ranks it reaches) and
// tokens_per_expert[E].
EPCOMM_HD constexpr std::size_t notify_record_bytes(const capacity& c, int nodes) {
  return sizeof(notify_header) + sizeof(std::int32_t) * (c.world_size + nodes + c.num_experts);
}

// 64-bit words of the mask that tells a forwarder which ranks of its node
// (bit = local index) one relayed token reached.
EPCOMM_HD constexpr int mask_words(int ranks_per_node) { return (ranks_per_node + 63) / 64; }

// Bytes of one token row, relayed to a forwarder or stored at its final
// rank: the token, its scales, its top-k ids (global when relayed, local when
// final) and weights, and its source index.
EPCOMM_HD constexpr std::size_t token_row_bytes(int hidden, int topk, int token_bytes,
                                                bool has_scales) {
  return static_cast<std::size_t>(hidden) * token_bytes +
         (has_scales ? static_cast<std::size_t>(hidden / 128) * sizeof(float) : 0) +
         static_cast<std::size_t>(topk) * (sizeof(std::int64_t) + sizeof(float)) +
         sizeof(std::int32_t);
}

// Bytes of one partial sum sent back across nodes: fp32 channels, plus fp32
// weights when the call combines weights.
EPCOMM_HD constexpr std::size_t partial_row_bytes(int hidden, int topk, bool with_weights) {
  return static_cast<std::size_t>(hidden) * sizeof(float) +
         (with_weights ? static_cast<std::size_t>(topk) * sizeof(float) : 0);
}

// The node transport's buffer.
struct node_plan {
  std::size_t notify;  // R records of notify_slot_bytes, slot = world rank of the source
  std::size_t notify_slot_bytes;
  std::size_t combine_status;  // R combine_headers, slot = world rank of the source
  std::size_t combine_status_slot_bytes;
  std::size_t recv_x;         // [max_recv_tokens][max_hidden] tokens
  std::size_t recv_scales;    // [max_recv_tokens][max_hidden/128] float
  std::size_t recv_topk_idx;  // [max_recv_tokens][max_topk] int64, local ids
  std::size_t recv_weights;   // [max_recv_tokens][max_topk] float
  std::size_t recv_src_idx;   // [max_recv_tokens] int32
  // This rank's combine input, in receive order, where the ranks of its node
  // read it to reduce: [max_recv_tokens][max_hidden] combine elements and
  // [max_recv_tokens][max_topk] float.
  std::size_t staged_y;
  std::size_t staged_weights;
  std::size_t total;
};

// The arrays of a run of relayed rows, in this order.
struct relay_rows {
  std::size_t x;
  std::size_t scales;
  // Global expert ids, [max_topk] per row; in a dispatch from a cached
  // handle, which relays no ids, the row's mask of the node's ranks it
  // reaches ([mask_words] uint64) in their place.
  std::size_t topk_idx;
  std::size_t weights;
  std::size_t src_idx;
};

// The rail transport's buffer. Blocks are indexed by node: the source node of
// what lands here, or the destination node of what is staged.
struct rail_plan {
  std::size_t notify;  // N records, slot = source node
  std::size_t notify_slot_bytes;
  // N slots, slot = source node: combine_header, then (at status_masks) a
  // uint64 count and uint64 masks[count][mask_words], one per token of the
  // source that reached this node, in token order.
  std::size_t status;
  std::size_t status_slot_bytes;
  std::size_t status_masks;  // offset of the count and masks within a status slot
  // Relayed rows, [N][max_tokens_per_rank] rows, block = source node; within a
  // block, the source's tokens that reach this node, in token order.
  relay_rows relay;
  // Partial sums, [N][max_tokens_per_rank] fp32 rows, block = the node that
  // reduced them (this rank's own node included, reduced here). They share
  // memory with the relayed rows: relays are read within dispatch, partial
  // sums land only once every rank has entered combine.
  std::size_t partial_x;
  std::size_t partial_weights;
  // Staging for RMA transports (zero unless planned with staging).
  std::size_t send_notify;  // one record, the same for every destination
  std::size_t send_status;  // N status slots, one per destination node
  // Relayed rows by destination node, max_relay_rows rows; partial sums by
  // destination source rank, (N - 1) * max_tokens_per_rank rows. They share
  // memory, like the flat plan's dispatch and combine staging.
  relay_rows send_relay;
  std::size_t send_partial_x;
  std::size_t send_partial_weights;
  std::size_t total;
};

// Rows a rank stages for other nodes in one dispatch: each token reaches at
// most min(topk, N - 1) other nodes.
EPCOMM_HD constexpr std::size_t max_relay_rows(const capacity& c, int nodes) {
  const int others = nodes - 1;
  return static_cast<std::size_t>(c.max_tokens_per_rank) *
         static_cast<std::size_t>(c.max_topk < others ? c.max_topk : others);
}

EPCOMM_HD constexpr node_plan plan_node(const capacity& c, int nodes) {
  node_plan p{};
  const std::size_t n = static_cast<std::size_t>(c.max_recv_tokens);
  const std::size_t h = static_cast<std::size_t>(c.max_hidden);
  const std::size_t k = static_cast<std::size_t>(c.max_topk);
  carver regions;
  take_exchange_regions(p, regions, c, align_up(notify_record_bytes(c, nodes), 64), n);
  p.staged_y = regions.take(n * h * c.combine_bytes);
  p.staged_weights = regions.take(n * k * sizeof(float));
  p.total = regions.at();
  return p;
}

EPCOMM_HD constexpr rail_plan plan_rail(const capacity& c, int nodes, int ranks_per_node,
                                        bool staging) {
  rail_plan p{};
  const std::size_t t = static_cast<std::size_t>(c.max_tokens_per_rank);
  const std::size_t blocks = static_cast<std::size_t>(nodes) * t;  // rows of N blocks
  const std::size_t h = static_cast<std::size_t>(c.max_hidden);
  const std::size_t k = static_cast<std::size_t>(c.max_topk);
  const std::size_t scales = c.has_scales ? h / 128 : 0;
  const std::size_t words = static_cast<std::size_t>(mask_words(ranks_per_node));
  const std::size_t ids = k > words ? k : words;  // 8-byte ids or mask words per relayed row
  carver regions;
  const auto take_relay_rows = [&](std::size_t rows) {
    relay_rows r{};
    r.x = regions.take(rows * h * c.token_bytes);
    r.scales = regions.take(rows * scales * sizeof(float));
    r.topk_idx = regions.take(rows * ids * sizeof(std::int64_t));
    r.weights = regions.take(rows * k * sizeof(float));
    r.src_idx = regions.take(rows * sizeof(std::int32_t));
    return r;
  };
  p.notify_slot_bytes = align_up(notify_record_bytes(c, nodes), 64);
  p.notify = regions.take(p.notify_slot_bytes * nodes);
  p.status_masks = align_up(sizeof(combine_header), 64);
  p.status_slot_bytes = align_up(p.status_masks + (1 + t * words) * sizeof(std::uint64_t), 64);
  p.status = regions.take(p.status_slot_bytes * nodes);
  const std::size_t shared_at = regions.at();
  p.relay = take_relay_rows(blocks);
  std::size_t end = regions.at();
  regions.back_to(shared_at);
  p.partial_x = regions.take(blocks * h * sizeof(float));
  p.partial_weights = regions.take(blocks * k * sizeof(float));
  regions.past(end);
  if (staging) {
    p.send_notify = regions.take(p.notify_slot_bytes);
    p.send_status = regions.take(p.status_slot_bytes * nodes);
    const std::size_t relay = max_relay_rows(c, nodes);
    const std::size_t partial = static_cast<std::size_t>(nodes - 1) * t;
    const std::size_t rows_at = regions.at();
    p.send_relay = take_relay_rows(relay);
    end = regions.at();
    regions.back_to(rows_at);
    p.send_partial_x = regions.take(partial * h * sizeof(float));
    p.send_partial_weights = regions.take(partial * k * sizeof(float));
    regions.past(end);
  }
  p.total = regions.at();
  return p;
}

}  // namespace epcomm::wire::hier
