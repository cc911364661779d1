// What every rank of a normal-mode call concludes from the headers all ranks
// posted (dispatch's notify round, combine's status round), written once for
// the host engines (flat and hierarchical) and the CUDA kernels. Every rank
// holds the same R headers, so every rank reaches the same verdict: either all
// go on to move payload or all fail with the same error. A verdict is a
// cuda::report (normal/report.hpp), which the kernels hand to the host and
// the host engines turn into the epcomm::error they throw (to_error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "epcomm/core/config.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/input_errors.hpp"
#include "epcomm/normal/arguments.hpp"
#include "epcomm/normal/count_matrix.hpp"
#include "epcomm/normal/report.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm {

// Whether a slot's header is of the call with `epoch` (a notify header also
// carries the magic, so that a slot never written reads as another call's).
EPCOMM_HD inline bool of_call(const wire::notify_header& h, std::uint64_t epoch) {
  return h.magic == wire::magic && h.epoch == epoch;
}
EPCOMM_HD inline bool of_call(const wire::combine_header& h, std::uint64_t epoch) {
  return h.epoch == epoch;
}

// What both rounds check first: every member's header is of this call
// (else `mismatch`, with the epochs) and accepted its input. Returns the
// first member, or -1 when there is none or a check failed (r says which).
EPCOMM_HD_TEMPLATE
template <class Slots>
EPCOMM_HD int judge_members(const Slots& slots, int world, int rank, std::uint64_t epoch,
                            cuda::failure mismatch, cuda::report& r) {
  int first = -1;
  for (int s = 0; s < world; ++s) {
    if (!slots.takes_part(s)) continue;
    if (first < 0) first = s;
    const auto& h = slots.header(s);
    if (!of_call(h, epoch)) {
      r.code = mismatch;
      r.peer = s;
      r.expected = static_cast<std::int64_t>(epoch);
      r.seen = static_cast<std::int64_t>(h.epoch);
      return -1;
    }
    if (h.state != wire::status::ok) {
      r.code = s == rank ? cuda::failure::invalid_input : cuda::failure::peer_invalid_input;
      r.peer = s == rank ? no_peer : s;
      cause_text(r.cause, wire::cause_bytes) << h.cause;
      return -1;
    }
  }
  return first;
}

// The notify round of one call as the verdict reads it. Slots has
// header(s) (rank s's wire::notify_header), count(s, r) (the tokens s sends
// to r) and takes_part(s): false for a rank masked out of the call
// (mask_lost_ranks), whose slot is not read and whose counts are zero.
// Checks, in order: every member's epoch and status, then agreement with the
// first member on the shape, then every member's receive count against the
// buffer and its worst-case bound. Leaves r.code none when all pass.
EPCOMM_HD_TEMPLATE
template <class Slots>
EPCOMM_HD void judge_notify_round(const Slots& slots, int world, int rank, std::uint64_t epoch,
                                  int max_recv_tokens, cuda::report& r) {
  using cuda::failure;
  const int first = judge_members(slots, world, rank, epoch, failure::notify_mismatch, r);
  if (first < 0) return;
  const wire::notify_header& ref = slots.header(first);
  for (int s = first + 1; s < world; ++s) {
    if (!slots.takes_part(s)) continue;
    const wire::notify_header& h = slots.header(s);
    // In header_field's order.
    const std::int32_t there[] = {h.routing != 0, h.hidden,      h.topk,
                                  h.token_id,     h.num_experts, h.routing};
    const std::int32_t on_first[] = {ref.routing != 0, ref.hidden,      ref.topk,
                                     ref.token_id,     ref.num_experts, ref.routing};
    for (int f = 0; f < 6; ++f) {
      if (there[f] != on_first[f]) {
        r.code = failure::disagreement;
        r.peer = s;
        r.field = static_cast<cuda::header_field>(f);
        r.seen = there[f];
        r.expected = on_first[f];
        r.reference = first;
        return;
      }
    }
  }
  for (int dst = 0; dst < world; ++dst) {
    if (!slots.takes_part(dst)) continue;  // nothing is sent to it
    long long total = 0;
    for (int s = 0; s < world; ++s) total += slots.count(s, dst);
    const int bound = slots.header(dst).recv_bound;
    if (total > max_recv_tokens || (bound > 0 && total > bound)) {
      const bool capacity = total > max_recv_tokens;
      r.code = capacity ? failure::over_capacity : failure::over_bound;
      r.peer = dst;
      r.seen = total;
      r.expected = capacity ? max_recv_tokens : bound;
      return;
    }
  }
}

// The combine status round: headers(s) is rank s's wire::combine_header.
// Every member's epoch and status, then whether all combine along handles of
// one dispatch, pass weights alike and y of one element type.
EPCOMM_HD_TEMPLATE
template <class Slots>
EPCOMM_HD void judge_combine_round(const Slots& slots, int world, int rank, std::uint64_t epoch,
                                   cuda::report& r) {
  using cuda::failure;
  const int first = judge_members(slots, world, rank, epoch, failure::combine_mismatch, r);
  const auto disagree = [&](int s, cuda::header_field f, std::int32_t seen, std::int32_t expected) {
    r.code = failure::disagreement;
    r.peer = s;
    r.field = f;
    r.seen = seen;
    r.expected = expected;
    r.reference = first;
  };
  for (int s = first + 1; first >= 0 && s < world; ++s) {
    if (!slots.takes_part(s)) continue;
    const wire::combine_header& h = slots.header(s);
    const wire::combine_header& ref = slots.header(first);
    if (h.routing != ref.routing)
      return disagree(s, cuda::header_field::handle_routing, h.routing, ref.routing);
    if (h.with_weights != ref.with_weights) {
      r.code = failure::weights_mismatch;
      r.peer = s;
      return;
    }
    if (h.out_id != ref.out_id)
      return disagree(s, cuda::header_field::out_id, h.out_id, ref.out_id);
  }
}

// ---- The host engines: records gathered into vectors ----------------------

// Whether rank s takes part in a call: every rank unless `members` (one flag
// per rank, identical on every rank) leaves some out (mask_lost_ranks).
inline bool takes_part(const std::vector<bool>& members, int s) {
  return members.empty() || members[s];
}

// A notify record is anything with a wire::notify_header `header` and
// `tokens_per_rank` (R counts). Throws the verdict's error, if any.
template <class Record>
void judge_notify(int rank, std::uint64_t epoch, int max_recv_tokens,
                  const std::vector<Record>& all, const std::vector<bool>& members = {}) {
  struct slots {
    const std::vector<Record>& all;
    const std::vector<bool>& members;
    const wire::notify_header& header(int s) const { return all[s].header; }
    long long count(int s, int r) const { return all[s].tokens_per_rank[r]; }
    bool takes_part(int s) const { return epcomm::takes_part(members, s); }
  };
  cuda::report r{};
  judge_notify_round(slots{all, members}, static_cast<int>(all.size()), rank, epoch,
                     max_recv_tokens, r);
  if (r.code != cuda::failure::none) throw cuda::to_error(r, rank, "dispatch");
}

inline void judge_combine_status(int rank, std::uint64_t epoch,
                                 const std::vector<wire::combine_header>& all,
                                 const std::vector<bool>& members = {}) {
  struct slots {
    const std::vector<wire::combine_header>& all;
    const std::vector<bool>& members;
    const wire::combine_header& header(int s) const { return all[s]; }
    bool takes_part(int s) const { return epcomm::takes_part(members, s); }
  };
  cuda::report r{};
  judge_combine_round(slots{all, members}, static_cast<int>(all.size()), rank, epoch, r);
  if (r.code != cuda::failure::none) throw cuda::to_error(r, rank, "combine");
}

// The handle of accepted dispatch number `origin` of the call `shape`: the
// full count matrix from the records and this rank's own placement of its
// tokens.
template <class Record>
dispatch_handle make_dispatch_handle(const handle_shape& shape, std::uint64_t origin,
                                     const std::vector<Record>& all,
                                     const std::vector<int>& send_pos) {
  const int world = shape.world_size;
  dispatch_handle h;
  static_cast<handle_shape&>(h) = shape;
  h.count_matrix.resize(static_cast<std::size_t>(world) * world);
  for (int s = 0; s < world; ++s)
    for (int r = 0; r < world; ++r) h.count_matrix[s * world + r] = all[s].tokens_per_rank[r];
  h.num_recv_tokens = h.recv_offset(world, shape.rank);
  h.send_pos = send_pos;
  h.origin = origin;
  return h;
}

// ---- The kernels: the R slots of a region in this rank's buffer ------------

namespace cuda {

// Slot `source` of a notify region: the header, then int32 tokens_per_rank[R],
// then int32 tokens_per_local_expert[E/R] for the region owner's experts.
EPCOMM_HD inline const wire::notify_header* notify_header_at(const std::byte* region,
                                                             std::size_t slot_bytes, int source) {
  return reinterpret_cast<const wire::notify_header*>(region + slot_bytes * source);
}
EPCOMM_HD inline const std::int32_t* notify_counts_at(const std::byte* region,
                                                      std::size_t slot_bytes, int source) {
  return reinterpret_cast<const std::int32_t*>(region + slot_bytes * source +
                                               sizeof(wire::notify_header));
}

// Slots spaced slot_bytes apart from `region`; every rank takes part. The
// counts follow each header, or, for a dispatch from a cached handle, whose
// slots hold headers only, come from the handle's count matrix [R][R].
struct region_slots {
  const std::byte* region;
  std::size_t slot_bytes;
  const std::int32_t* matrix;  // null: the counts in the slots
  int world;
  EPCOMM_HD const wire::notify_header& header(int s) const {
    return *notify_header_at(region, slot_bytes, s);
  }
  EPCOMM_HD long long count(int s, int r) const {
    return matrix != nullptr ? matrix[s * world + r] : notify_counts_at(region, slot_bytes, s)[r];
  }
  EPCOMM_HD bool takes_part(int) const { return true; }
};

struct combine_region_slots {
  const std::byte* region;
  std::size_t slot_bytes;
  EPCOMM_HD const wire::combine_header& header(int s) const {
    return *reinterpret_cast<const wire::combine_header*>(region + slot_bytes * s);
  }
  EPCOMM_HD bool takes_part(int) const { return true; }
};

// Judges the R notify slots this rank received for dispatch call `epoch`;
// `matrix`: the count matrix of a cached dispatch's handle (see region_slots).
EPCOMM_HD inline void judge_notify(const std::byte* region, std::size_t slot_bytes, int world,
                                   int rank, std::uint64_t epoch, int max_recv_tokens, report& r,
                                   const std::int32_t* matrix = nullptr) {
  judge_notify_round(region_slots{region, slot_bytes, matrix, world}, world, rank, epoch,
                     max_recv_tokens, r);
}

// counts[s * R + r] = tokens rank s sends to rank r, from the R notify slots;
// only meaningful once judge_notify accepted them.
EPCOMM_HD inline void gather_count_matrix(const std::byte* region, std::size_t slot_bytes,
                                          int world, std::int32_t* counts) {
  for (int s = 0; s < world; ++s) {
    const std::int32_t* c = notify_counts_at(region, slot_bytes, s);
    for (int r = 0; r < world; ++r) counts[s * world + r] = c[r];
  }
}

// Judges the R combine headers this rank received for combine call `epoch`.
EPCOMM_HD inline void judge_combine(const std::byte* region, std::size_t slot_bytes, int world,
                                    int rank, std::uint64_t epoch, report& r) {
  judge_combine_round(combine_region_slots{region, slot_bytes}, world, rank, epoch, r);
}

}  // namespace cuda
}  // namespace epcomm
