// What the low-latency kernels tell the host about a call that did not go
// through, in enough detail to build the epcomm::error the host engine
// (low_latency/buffer.hpp) throws in the same situation, word for word. A kernel
// never hangs and never traps: it fills this record and returns.
//
// Plain integers and a char array: the record lives in device memory, is
// copied to pinned host memory as bytes, and compiles without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "epcomm/core/config.hpp"
#include "epcomm/core/enum_names.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/core/wire_basics.hpp"
#include "epcomm/low_latency/wire.hpp"
#include "epcomm/proxy/device_report_errors.hpp"

namespace epcomm::cuda {

enum class ll_failure : std::int32_t {
  none = 0,
  deadline,       // a wait expired: peer, what, expected, seen
  invalid_input,  // this rank rejected its own input: cause
  peer_rejected,  // peer rejected the call: peer, cause
  // Protocol violations (the host engine's "protocol mismatch: ..."):
  count_epoch,    // peer's count word has epoch `seen`, `expected` wanted
  reject_epoch,   // peer's reject record has epoch `seen`, `expected` wanted
  count_range,    // peer announced `seen` records, at most `expected` fit
  record_source,  // record `index` of peer's region names (src_rank, src_token, src_slot)
  rows_mismatch,  // peer returned `seen` rows, `expected` were dispatched there
  // Peer dispatched wire `seen` where this rank dispatched `expected`
  // (token_traits ids): the call fails, the buffer serves the next.
  wire_mismatch,
  // Rank src_rank gave up on a breaking failure it blamed on `peer` (itself
  // when the two are equal) and told this rank: the abort relay.
  peer_aborted,
  // Over an RMA transport: a proxy channel call returned `seen`, a
  // proxy::channel_status other than ok.
  proxy,
  // Without mask_lost_ranks: peer's process exited while this rank waited
  // for `what` from it (the exit watch, cuda/exit_watch.hpp).
  peer_exited,
};

// What an expired wait was waiting for; the texts are the host engine's.
enum class ll_waited_for : std::int32_t { release = 0, dispatch_records, combined_rows };

enum class ll_op : std::int32_t { dispatch = 0, combine = 1 };

inline constexpr auto ll_waited_for_names = names_for<ll_waited_for, ll_waited_for::combined_rows>(
    "release of the previous dispatch region", "dispatch records", "combined rows");

inline constexpr const char* ll_waited_for_text(ll_waited_for w) { return ll_waited_for_names(w); }

// The operation names of the host engine.
inline constexpr const char* ll_op_text(ll_op op) {
  return op == ll_op::dispatch ? "low-latency dispatch" : "low-latency combine";
}

struct ll_report {
  ll_failure code;
  std::int32_t peer;  // rank the failure is attributed to, or no_peer
  ll_waited_for what;
  ll_op op;
  std::int64_t expected;
  std::int64_t seen;
  std::int32_t index;  // record_source: the record's slot in its region
  std::int32_t src_rank, src_token, src_slot;
  std::int32_t broken;            // sticky: set with the first breaking failure, never cleared
  char cause[wire::cause_bytes];  // NUL-terminated; invalid_input / peer_rejected
};

static_assert(std::is_trivially_copyable_v<ll_report> && std::is_standard_layout_v<ll_report>);

// A rejection is a verdict every rank reached in one completed exchange: the
// buffer serves the next call. A deadline or a protocol violation leaves
// peers anywhere in the protocol: the buffer cannot be used again, as in the
// host engine (whose `guarded` marks it broken).
EPCOMM_HD constexpr bool ll_breaks_buffer(ll_failure f) {
  return f != ll_failure::none && f != ll_failure::invalid_input &&
         f != ll_failure::peer_rejected && f != ll_failure::wire_mismatch;
}

// The epcomm::error the host engine throws for the same situation.
inline error to_error(const ll_report& r, int rank) {
  const auto n = [](std::int64_t v) { return std::to_string(v); };
  const std::string op = ll_op_text(r.op);
  const std::string cause(r.cause, ::strnlen(r.cause, sizeof r.cause));
  const std::string mismatch = "protocol mismatch: ";
  switch (r.code) {
    case ll_failure::none:
      break;
    case ll_failure::deadline:
      return error(rank, op, r.peer,
                   std::string("deadline expired waiting for ") + ll_waited_for_text(r.what) +
                       ": expected " + n(r.expected) + ", saw " + n(r.seen));
    case ll_failure::invalid_input:
      return error(rank, op, no_peer, "invalid input: " + cause);
    case ll_failure::peer_rejected:
      return error(rank, op, r.peer, "that rank rejected the call: " + cause);
    case ll_failure::count_epoch:
      return error(rank, op, r.peer,
                   mismatch + "count word of epoch " + n(r.seen) + ", expected " + n(r.expected));
    case ll_failure::reject_epoch:
      return error(
          rank, op, r.peer,
          mismatch + "reject record of epoch " + n(r.seen) + ", expected " + n(r.expected));
    case ll_failure::count_range:
      return error(rank, op, r.peer,
                   mismatch + n(r.seen) + " records announced, at most " + n(r.expected) + " fit");
    case ll_failure::record_source:
      return error(rank, op, r.peer,
                   mismatch + "record " + n(r.index) + " names rank " + n(r.src_rank) + ", token " +
                       n(r.src_token) + ", top-k slot " + n(r.src_slot));
    case ll_failure::rows_mismatch:
      return error(rank, op, r.peer,
                   mismatch + n(r.seen) + " rows returned, " + n(r.expected) + " dispatched there");
    case ll_failure::wire_mismatch:
      return error(rank, op, r.peer,
                   "that rank dispatched " + std::string(token_type_name(r.seen)) +
                       " records, this rank " + std::string(token_type_name(r.expected)));
    case ll_failure::peer_aborted:
      return proxy::device_saw_abort(rank, op, r.src_rank, r.peer, ll_waited_for_text(r.what));
    case ll_failure::proxy:
      return proxy::device_channel_failed(rank, op, r.seen);
    case ll_failure::peer_exited:
      return proxy::device_saw_exit(rank, op, r.peer, ll_waited_for_text(r.what));
  }
  return proxy::unknown_device_failure(rank, op, r.peer, static_cast<std::int32_t>(r.code));
}

}  // namespace epcomm::cuda
