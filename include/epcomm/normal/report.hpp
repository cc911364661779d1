// What the CUDA kernels tell the host about one call: whether it went through,
// and if not, why, in enough detail to build the same epcomm::error the host
// engine throws for the same situation. A kernel never hangs and never traps:
// it fills this record and returns, and the host turns it into an exception.
//
// Plain integers and a char array, so the record lives in device memory, is
// copied to pinned host memory as bytes, and compiles without CUDA.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "epcomm/core/enum_names.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/proxy/device_report_errors.hpp"

namespace epcomm::cuda {

enum class failure : std::int32_t {
  none = 0,
  deadline,            // a wait expired: peer, what, expected, seen
  notify_mismatch,     // a notify header from another call: peer, expected/seen epoch
  combine_mismatch,    // a combine header from another call: peer, expected/seen epoch
  invalid_input,       // this rank's input was rejected: cause
  peer_invalid_input,  // peer's input was rejected: peer, cause
  disagreement,        // peer's `field` differs: seen there, expected on rank `reference`
  over_capacity,       // peer would receive `seen` rows, its buffer holds `expected`
  over_bound,          // peer would receive `seen` rows, its worst_case_recv_tokens is `expected`
  weights_mismatch,    // peer passes topk_weights to combine and rank 0 does not, or vice versa
  peer_aborted,        // `reporter` gave up blaming `peer` and told this rank (abort_link.hpp)
  proxy,               // over an RMA transport: a channel call returned `seen` (channel_status)
  peer_exited,         // peer's process exited while this rank waited for `what` (exit_watch.hpp)
};

// What a wait that expired was waiting for; the text matches the host
// engine's wait sites so both paths print the same error.
enum class waited_for : std::int32_t {
  notify_counts = 0,
  token_rows,
  agreement_to_reject,
  combine_readiness,
  combined_rows,
  barrier_arrival,
};

inline constexpr auto waited_for_names = names_for<waited_for, waited_for::barrier_arrival>(
    "notify counts", "token rows", "agreement to reject the call", "combine readiness",
    "combined rows", "barrier arrival");

inline constexpr const char* waited_for_text(waited_for w) { return waited_for_names(w); }

// Notify-header fields that every rank must agree on.
// The notify header's come first, in the order judge_notify_round compares them.
enum class header_field : std::int32_t {
  // 1 for a dispatch from a cached handle (routing != 0), 0 for an ordinary
  // one: compared first, so that ranks making different kinds of call are
  // told so rather than that their topk differs.
  dispatch_kind = 0,
  hidden,
  topk,
  token_id,
  num_experts,
  routing,
  out_id,          // the combine header's
  handle_routing,  // the combine header's routing
};

inline constexpr auto header_field_names = names_for<header_field, header_field::handle_routing>(
    "",  // dispatch_kind: the values say it (to_error)
    "hidden", "topk", "token type", "num_experts",
    "the cached handle's routing (fingerprint of its dispatch: number and counts)",
    "y's element type", "the handle's routing (fingerprint of its dispatch: number and counts)");

inline constexpr const char* header_field_text(header_field f) { return header_field_names(f); }

struct report {
  failure code;
  std::int32_t peer;   // rank the failure is attributed to, or no_peer
  waited_for what;     // deadline only
  header_field field;  // disagreement only
  std::int64_t expected;
  std::int64_t seen;
  std::int32_t num_recv_tokens;   // rows this rank receives in the dispatch (set by notify)
  std::int32_t broken;            // sticky: set with the first breaking failure, never cleared
  std::int32_t reporter;          // peer_aborted only: the rank that relayed it
  std::int32_t reference;         // disagreement only: the rank compared with (the first member)
  char cause[wire::cause_bytes];  // NUL-terminated; invalid_input / peer_invalid_input
};

static_assert(std::is_trivially_copyable_v<report> && std::is_standard_layout_v<report>);

// A deadline (or a peer's abort, relayed) means peers may be anywhere in the
// protocol: the buffer that saw it cannot be used again. Every other failure
// is a verdict all ranks reached together after a completed round, so the
// next call is safe.
inline bool breaks_buffer(const report& r) {
  return r.code == failure::deadline || r.code == failure::peer_aborted ||
         r.code == failure::proxy || r.code == failure::peer_exited;
}

// The epcomm::error the host engine throws for the same situation.
inline error to_error(const report& r, int rank, const std::string& op) {
  const auto n = [](std::int64_t v) { return std::to_string(v); };
  const std::string cause(r.cause, ::strnlen(r.cause, sizeof r.cause));
  switch (r.code) {
    case failure::none:
      break;
    case failure::deadline:
      return error(rank, op, r.peer,
                   std::string("deadline expired waiting for ") + waited_for_text(r.what) +
                       ": expected " + n(r.expected) + ", saw " + n(r.seen));
    case failure::notify_mismatch:
      return error(rank, op, r.peer,
                   "protocol mismatch: notify epoch " + n(r.seen) + ", expected " + n(r.expected));
    case failure::combine_mismatch:
      return error(rank, op, r.peer,
                   "protocol mismatch: combine epoch " + n(r.seen) + ", expected " + n(r.expected));
    case failure::invalid_input:
      return error(rank, op, no_peer, "invalid input: " + cause);
    case failure::peer_invalid_input:
      return error(rank, op, r.peer, "invalid input on that rank: " + cause);
    case failure::disagreement: {
      // Types travel as their wire ids; the error names them.
      const bool is_type = r.field == header_field::token_id || r.field == header_field::out_id;
      const bool is_kind = r.field == header_field::dispatch_kind;
      const auto value = [&](std::int64_t v) {
        if (is_kind)
          return std::string(v != 0 ? "a dispatch from a cached handle"
                                    : "a dispatch with top-k routing");
        return is_type ? std::string(token_type_name(v)) : n(v);
      };
      const std::string field = is_kind ? "" : std::string(header_field_text(r.field)) + " ";
      return error(rank, op, r.peer,
                   field + value(r.seen) + " on that rank disagrees with " + value(r.expected) +
                       " on rank " + n(r.reference));
    }
    case failure::over_capacity:
      return error(rank, op, r.peer,
                   "that rank would receive " + n(r.seen) +
                       " tokens, more than its buffer holds (max_recv_tokens " + n(r.expected) +
                       ")");
    case failure::over_bound:
      return error(rank, op, r.peer,
                   "that rank would receive " + n(r.seen) +
                       " tokens, more than its worst_case_recv_tokens " + n(r.expected));
    case failure::weights_mismatch:
      return error(rank, op, r.peer,
                   "topk_weights given on some ranks only (every rank passes them or none)");
    case failure::peer_aborted:
      return proxy::device_saw_abort(rank, op, r.reporter, r.peer, waited_for_text(r.what));
    case failure::proxy:
      return proxy::device_channel_failed(rank, op, r.seen);
    case failure::peer_exited:
      return proxy::device_saw_exit(rank, op, r.peer, waited_for_text(r.what));
  }
  return proxy::unknown_device_failure(rank, op, r.peer, static_cast<std::int32_t>(r.code));
}

}  // namespace epcomm::cuda
