// The writes of low-latency mode over an RMA transport: which bytes of this
// rank's buffer (its staging regions, or combine_send) a proxy puts where in
// a peer's buffer, and which signal each count word carries. The host engine
// (low_latency/buffer.hpp) and the device path's kernels (low_latency/route.hpp)
// both issue exactly these, so that a peer cannot tell which one sent them.
//
// Offsets are from the start of the symmetric buffer, parity included, as a
// proxy descriptor names them. Plain integer arithmetic, usable on device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/low_latency/wire.hpp"

namespace epcomm::wire::ll {

// One put: `bytes` from `local` in this rank's buffer to `remote` in the
// peer's; `slot` is the signal a put_signal adds 1 to once it has landed.
struct rma_write {
  int peer;
  std::size_t local;
  std::size_t remote;
  std::size_t bytes;
  std::size_t slot;
};

// Staged record `slot` for global expert e, where the proxy reads it.
EPCOMM_HD constexpr std::size_t staged_record(const shape& s, const plan& pl, int parity, int e,
                                              int slot) {
  return parity_base(pl, parity) + pl.send_records +
         (static_cast<std::size_t>(e) * s.max_tokens_per_rank + slot) * record_bytes(s);
}

// The first `count` staged records for expert e, into region (e's local
// index, this rank) of e's rank.
EPCOMM_HD constexpr rma_write records_write(const shape& s, const plan& pl, int parity, int rank,
                                            int e, int count) {
  const int per_rank = s.local_experts();
  return {e / per_rank, staged_record(s, pl, parity, e, 0),
          parity_base(pl, parity) + pl.dispatch_recv + record_offset(s, pl, e % per_rank, rank, 0),
          static_cast<std::size_t>(count) * record_bytes(s), 0};
}

// Count word of region (expert e, this rank), staged by destination expert,
// with the dispatch signal of that region.
EPCOMM_HD constexpr rma_write dispatch_count_write(const shape& s, const plan& pl, int parity,
                                                   int rank, int e) {
  const int per_rank = s.local_experts();
  const int le = e % per_rank;
  const std::size_t base = parity_base(pl, parity);
  return {e / per_rank,
          base + pl.send_dispatch_counts + static_cast<std::size_t>(e) * sizeof(count_word),
          base + pl.dispatch_counts +
              (static_cast<std::size_t>(le) * s.world_size + rank) * sizeof(count_word),
          sizeof(count_word), dispatch_signal(s, parity, le, rank)};
}

// Count word this expert rank owes source `src` in combine, staged by
// source, with the combine signal of this rank there.
EPCOMM_HD constexpr rma_write combine_count_write(const shape& s, const plan& pl, int parity,
                                                  int rank, int src) {
  const std::size_t base = parity_base(pl, parity);
  return {src, base + pl.send_combine_counts + static_cast<std::size_t>(src) * sizeof(count_word),
          base + pl.combine_counts + static_cast<std::size_t>(rank) * sizeof(count_word),
          sizeof(count_word), combine_signal(s, parity, rank)};
}

// This rank's reject record of `kind`, staged once, into its slot at `peer`.
EPCOMM_HD constexpr rma_write reject_write(const shape& s, const plan& pl, int parity, int rank,
                                           reject_kind kind, int peer) {
  const std::size_t base = parity_base(pl, parity);
  const std::size_t k = static_cast<std::size_t>(kind);
  return {peer, base + pl.send_rejects + k * sizeof(reject_record),
          base + pl.rejects + (k * s.world_size + rank) * sizeof(reject_record),
          sizeof(reject_record), 0};
}

// Expert output for packed row `row` (over all local experts), put from
// combine_send into slot (token, top-k slot) of its source's combine region.
EPCOMM_HD constexpr rma_write combine_row_write(const shape& s, const plan& pl, int parity,
                                                std::size_t row, const source& from) {
  const std::size_t row_bytes = static_cast<std::size_t>(s.hidden) * 2;  // bf16
  const std::size_t base = parity_base(pl, parity);
  return {from.rank, base + pl.combine_send + row * row_bytes,
          base + pl.combine_recv + combine_row(s, from.token, from.topk_slot) * row_bytes,
          row_bytes, 0};
}

}  // namespace epcomm::wire::ll
