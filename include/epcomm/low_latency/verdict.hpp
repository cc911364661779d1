// The decisions a low-latency receive phase takes from the count words and
// reject records its peers wrote, written once for the host tests and the
// CUDA kernels. The order of checks and the attributed peer follow the host
// engine (low_latency/buffer.hpp): on the same wire bytes both reach the same verdict.
//
// The host engine reads the words one by one, source-major. A kernel reads
// them in parallel, so the decision is split in two: classify_* judges one
// word, and the verdict is taken from the first protocol violation (in the
// host engine's order) and the first rejecting rank, however they were found.
#pragma once

#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/core/wire_basics.hpp"
#include "epcomm/low_latency/report.hpp"
#include "epcomm/low_latency/wire.hpp"

namespace epcomm::cuda {

enum class ll_word : std::int32_t {
  ok = 0,
  rejected,      // the sender rejected the call; its reject record says why
  wrong_epoch,   // protocol: a word from another call
  out_of_range,  // protocol: more records than a region holds
  wrong_rows,    // protocol: not the rows this rank dispatched to the sender
  // The sender dispatched another wire than this rank (a buffer serving
  // both): its records are not read, and the call fails on every rank, as a
  // rejection does, with the buffer still usable.
  wrong_wire,
};

EPCOMM_HD constexpr bool is_protocol_violation(ll_word w) {
  return w != ll_word::ok && w != ll_word::rejected && w != ll_word::wrong_wire;
}

// A dispatch count word of call `epoch` for a receiver dispatching wire
// `wire` (token_traits id): at most max_tokens records fit a region.
EPCOMM_HD constexpr ll_word classify_dispatch_word(const wire::ll::count_word& w,
                                                   std::uint64_t epoch, int max_tokens,
                                                   std::uint8_t wire) {
  if (w.epoch != epoch) return ll_word::wrong_epoch;
  if (w.status == wire::ll::state::rejected) return ll_word::rejected;
  if (w.wire != wire) return ll_word::wrong_wire;
  if (w.count < 0 || w.count > max_tokens) return ll_word::out_of_range;
  return ll_word::ok;
}

// A combine count word of call `epoch` from an expert rank owed
// `expected_rows` rows; the row count is only checked when this rank's own
// combine input was accepted (self_ok), as the host engine does.
EPCOMM_HD constexpr ll_word classify_combine_word(const wire::ll::count_word& w,
                                                  std::uint64_t epoch, bool self_ok,
                                                  int expected_rows) {
  if (w.epoch != epoch) return ll_word::wrong_epoch;
  if (w.status == wire::ll::state::rejected) return ll_word::rejected;
  if (self_ok && w.count != expected_rows) return ll_word::wrong_rows;
  return ll_word::ok;
}

// What a scan of count words found: the first protocol violation in the host
// engine's order (its index, -1 for none), the first rejecting rank and the
// first word of another wire (its index).
struct ll_scan {
  int first_violation = -1;
  int first_rejecting = -1;
  int first_other_wire = -1;
};

// Sequential accumulation, for callers that read words in order.
EPCOMM_HD constexpr void note_word(ll_scan& scan, int index, int sender, ll_word w) {
  if (is_protocol_violation(w) && scan.first_violation < 0) scan.first_violation = index;
  if (w == ll_word::rejected && scan.first_rejecting < 0) scan.first_rejecting = sender;
  if (w == ll_word::wrong_wire && scan.first_other_wire < 0) scan.first_other_wire = index;
}

EPCOMM_HD inline void copy_cause(char* out, const char* in) {
  int i = 0;
  for (; i + 1 < wire::cause_bytes && in[i] != '\0'; ++i) out[i] = in[i];
  out[i] = '\0';
}

// The report for a protocol violation `w` found in `word`, sent by `peer`.
// `bound` is max_tokens (out_of_range) or the expected row count (wrong_rows).
EPCOMM_HD inline void violation_report(ll_report& r, ll_word w, const wire::ll::count_word& word,
                                       int peer, std::uint64_t epoch, int bound) {
  r.peer = peer;
  switch (w) {
    case ll_word::wrong_epoch:
      r.code = ll_failure::count_epoch;
      r.expected = static_cast<std::int64_t>(epoch);
      r.seen = static_cast<std::int64_t>(word.epoch);
      break;
    case ll_word::out_of_range:
      r.code = ll_failure::count_range;
      r.expected = bound;
      r.seen = word.count;
      break;
    case ll_word::wrong_rows:
      r.code = ll_failure::rows_mismatch;
      r.expected = bound;
      r.seen = word.count;
      break;
    case ll_word::ok:
    case ll_word::rejected:
    case ll_word::wrong_wire:  // not a violation: wire_mismatch_report
      break;
  }
}

// The report of a call that some rank rejected: this rank's own cause when
// its input was bad (self_ok false), else the first rejecting rank's, read
// from the culprit's reject record (which must be of this call).
EPCOMM_HD inline void rejection_report(ll_report& r, const wire::ll::reject_record& culprit_record,
                                       std::uint64_t epoch, bool self_ok, int rank,
                                       int first_rejecting) {
  const int culprit = self_ok ? first_rejecting : rank;
  r.peer = culprit;
  if (culprit_record.epoch != epoch) {
    r.code = ll_failure::reject_epoch;
    r.expected = static_cast<std::int64_t>(epoch);
    r.seen = static_cast<std::int64_t>(culprit_record.epoch);
    return;
  }
  r.code = self_ok ? ll_failure::peer_rejected : ll_failure::invalid_input;
  if (!self_ok) r.peer = no_peer;
  copy_cause(r.cause, culprit_record.cause);
}

// Whether a scan ends the call with an error at all.
EPCOMM_HD constexpr bool call_failed(const ll_scan& scan, bool self_ok) {
  return scan.first_violation >= 0 || scan.first_rejecting >= 0 || scan.first_other_wire >= 0 ||
         !self_ok;
}

// The report of a dispatch whose sender `peer` moved wire `seen` where this
// rank moved `expected` (token_traits ids).
EPCOMM_HD inline void wire_mismatch_report(ll_report& r, int peer, std::uint8_t expected,
                                           std::uint8_t seen) {
  r.code = ll_failure::wire_mismatch;
  r.peer = peer;
  r.expected = expected;
  r.seen = seen;
}

// The verdict of a dispatch receive phase of wire `wire`: words [E_local][R]
// of parity p, rejects [2][R] of the same parity. r.code stays none when the
// call went through. `scan` may come from a parallel reading of the same
// words. Rejections come before another wire: a rejecting rank's words say
// nothing of its records.
EPCOMM_HD inline void dispatch_verdict(const ll_scan& scan, const wire::ll::count_word* words,
                                       const wire::ll::reject_record* rejects, int local_experts,
                                       int world, int rank, std::uint64_t epoch, int max_tokens,
                                       std::uint8_t wire, bool self_ok, ll_report& r) {
  r.op = ll_op::dispatch;
  // Index order is the host engine's: source-major, then local expert.
  const auto word_at = [&](int index) -> const wire::ll::count_word& {
    return words[(index % local_experts) * world + index / local_experts];
  };
  if (scan.first_violation >= 0) {
    const wire::ll::count_word& w = word_at(scan.first_violation);
    violation_report(r, classify_dispatch_word(w, epoch, max_tokens, wire), w,
                     scan.first_violation / local_experts, epoch, max_tokens);
    return;
  }
  if (scan.first_rejecting < 0 && self_ok) {
    if (scan.first_other_wire >= 0)
      wire_mismatch_report(r, scan.first_other_wire / local_experts, wire,
                           word_at(scan.first_other_wire).wire);
    return;
  }
  const int culprit = self_ok ? scan.first_rejecting : rank;
  rejection_report(r, rejects[static_cast<int>(wire::ll::reject_kind::dispatch) * world + culprit],
                   epoch, self_ok, rank, scan.first_rejecting);
}

// The same for a combine receive phase: words [R], one per expert rank;
// expected_rows[r] is what this rank dispatched to r.
EPCOMM_HD inline void combine_verdict(const ll_scan& scan, const wire::ll::count_word* words,
                                      const wire::ll::reject_record* rejects, int world, int rank,
                                      std::uint64_t epoch, bool self_ok, const int* expected_rows,
                                      ll_report& r) {
  r.op = ll_op::combine;
  if (scan.first_violation >= 0) {
    const int s = scan.first_violation;
    const wire::ll::count_word& w = words[s];
    violation_report(r, classify_combine_word(w, epoch, self_ok, expected_rows[s]), w, s, epoch,
                     expected_rows[s]);
    return;
  }
  if (scan.first_rejecting < 0 && self_ok) return;
  const int culprit = self_ok ? scan.first_rejecting : rank;
  rejection_report(r, rejects[static_cast<int>(wire::ll::reject_kind::combine) * world + culprit],
                   epoch, self_ok, rank, scan.first_rejecting);
}

// Sequential scans, in the host engine's order (used on the host; the kernels
// compute the same ll_scan in parallel).
EPCOMM_HD inline ll_scan scan_dispatch_words(const wire::ll::count_word* words, int local_experts,
                                             int world, std::uint64_t epoch, int max_tokens,
                                             std::uint8_t wire) {
  ll_scan scan;
  for (int s = 0; s < world; ++s)
    for (int le = 0; le < local_experts; ++le)
      note_word(scan, s * local_experts + le, s,
                classify_dispatch_word(words[le * world + s], epoch, max_tokens, wire));
  return scan;
}

EPCOMM_HD inline ll_scan scan_combine_words(const wire::ll::count_word* words, int world,
                                            std::uint64_t epoch, bool self_ok,
                                            const int* expected_rows) {
  ll_scan scan;
  for (int s = 0; s < world; ++s)
    note_word(scan, s, s, classify_combine_word(words[s], epoch, self_ok, expected_rows[s]));
  return scan;
}

// Rows each expert rank owes this rank in combine: one per routed (token,
// top-k slot) of what it dispatched, sent[T][max_topk] (first `topk` used).
EPCOMM_HD inline void rows_per_expert_rank(const std::int64_t* sent, int tokens, int topk,
                                           int max_topk, int per_rank, int world, int* rows) {
  for (int r = 0; r < world; ++r) rows[r] = 0;
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < topk; ++j)
      if (const std::int64_t e = sent[t * max_topk + j]; e >= 0) ++rows[e / per_rank];
}

}  // namespace epcomm::cuda
