// The wire format of low-latency mode: what lives where in every rank's
// symmetric buffer, what a token record looks like, and which signal slot
// means what. The host engine (low_latency/buffer.hpp) and a CUDA port read it from
// here; everything is plain integers and structs so it is usable on device.
//
// Buffer: two parities, identical in layout, alternated by consecutive
// dispatches; a combine uses the parity of the dispatch it answers. Each
// parity holds
//   written by peers:  dispatch count words [E_local][R], combine count words
//                      [R], reject records [2][R], the dispatch receive region
//                      [E_local][R][max_tokens] records, and the combine
//                      receive region [max_tokens][max_topk][H] bf16;
//   local only:        the packed dispatch outputs, the combine send buffer
//                      (the zero-copy view) and the combine output.
//
// Signals: 64-bit counters that only ever grow; never reset. Per parity:
//   dispatch(p, e, s)  at the receiver, +1 per dispatch from source s, after
//                      its records and the (p, e, s) count word;
//   released(p, r)     at each source, +1 when receiver r has finished reading
//                      its parity-p dispatch region, so the source may write
//                      it again;
//   combine(p, r)      at the source, +1 per combine from expert rank r, after
//                      its rows and the (p, r) count word.
// The n-th call on a parity waits for "counter >= n" (its epoch). A stale
// signal from an older call can never satisfy a newer wait, and a newer one
// cannot arrive early: a source writes parity p again only after every
// receiver released it. The count travels in a count word, not in the signal,
// so one add per call completes the region whatever order bytes land in: an
// RMA transport puts the records, then the count word with put_signal, whose
// signal the transport delivers only once every earlier write to that peer
// has landed (by completion, never by write order: EFA reorders writes); a
// peer-mapped one stores them and signals with release semantics.
//
// Over an RMA transport each parity also holds staging regions, planned only
// then and after all of the above, so the peer-mapped layout is unchanged:
// what this rank lays out in its own registered buffer for the proxy to put.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/core/wire_basics.hpp"
#include "epcomm/low_latency/scale_layout.hpp"

namespace epcomm::wire::ll {

inline constexpr int parities = 2;
inline constexpr int scale_block = 128;  // channels per fp8 scale

enum class state : std::uint8_t { ok = 0, rejected = 1 };

// Where a received token came from: enough for combine to send the expert's
// output back to slot (token, topk_slot) of rank `rank`.
struct source {
  std::int32_t rank;
  std::int32_t token;
  std::int32_t topk_slot;
};

// Rows [begin, begin + count) of a local expert's packed output came from one
// source rank.
struct range {
  std::int32_t begin;
  std::int32_t count;
};

// Published by a source for one region (dispatch: per (local expert, source)
// at the receiver; combine: per expert rank at the source) before its signal.
// `epoch` lets the reader check it is this call's word; `wire` that the
// region holds what the reader expects: a buffer serving both wires lays a
// call's records out in that call's wire, so a receiver that dispatched bf16
// must not read a peer's fp8 records as bf16 ones.
struct count_word {
  std::uint64_t epoch;
  std::int32_t count;  // records (dispatch) or rows (combine) written
  state status;        // rejected: no records; the reject record says why
  std::uint8_t wire;   // token_traits id: the records' wire, or bf16 for combine rows
  std::uint16_t pad = 0;
};
static_assert(sizeof(count_word) == 16);

// Why a rank rejected a call, written before the count words that say so.
// 16-byte aligned: kernels copy it with 16-byte vectors, from shared memory too.
struct alignas(16) reject_record {
  std::uint64_t epoch;
  char cause[cause_bytes];  // NUL-terminated
};

enum class reject_kind : int { dispatch = 0, combine = 1 };

// A token record: header, payload, then (fp8) one float scale per 128
// channels, padded to 16 bytes so a kernel copies it with 16-byte vectors and
// an RMA transport moves it with one put.
struct record_header {
  source src;
  std::int32_t pad;
};
static_assert(sizeof(record_header) == 16);

// The sizes a buffer is built with; identical on every rank (checked). A
// buffer serving both wires is built with wire_bytes 2 and scales, a record
// as wide as either wire's; each call reads and writes its regions in its own
// wire's layout (call_shape), which fits within.
struct shape {
  int world_size;
  int num_experts;
  int hidden;
  int max_topk;
  int max_tokens_per_rank;
  int wire_bytes;   // bytes per channel on the wire: 2 (bf16) or 1 (fp8)
  bool has_scales;  // fp8 wire: scales follow the payload
  ll_scale_layout scale_layout = ll_scale_layout::row_major;  // of recv_x_scales

  EPCOMM_HD constexpr int local_experts() const { return num_experts / world_size; }
  // Rows of one local expert's packed output: every source's whole region.
  EPCOMM_HD constexpr int rows_per_expert() const { return world_size * max_tokens_per_rank; }
  EPCOMM_HD constexpr int scales_per_token() const { return has_scales ? hidden / scale_block : 0; }
};

// The shape one call lays its records and outputs out with: the buffer's,
// with the call's wire. Region offsets still come from the buffer's plan.
template <class Wire>
EPCOMM_HD constexpr shape call_shape(shape s) {
  s.wire_bytes = static_cast<int>(sizeof(Wire));
  s.has_scales = token_traits<Wire>::has_scales;
  return s;
}

// recv_x_scales in the shape's layout (low_latency/scale_layout.hpp): 32-bit
// words per token (floats, or four exponent bytes for ue8m0), and the stride
// between consecutive tokens' words of one group in the token-major layouts.
EPCOMM_HD constexpr int scale_words_per_token(const shape& s) {
  return s.scale_layout == ll_scale_layout::ue8m0 ? (s.scales_per_token() + 3) / 4
                                                  : s.scales_per_token();
}
EPCOMM_HD constexpr std::size_t scale_token_stride(const shape& s) {
  const auto rows = static_cast<std::size_t>(s.rows_per_expert());
  return s.scale_layout == ll_scale_layout::row_major ? rows : align_up(rows, 4);
}
EPCOMM_HD constexpr std::size_t recv_scales_words(const shape& s) {
  return static_cast<std::size_t>(s.local_experts()) * scale_token_stride(s) *
         scale_words_per_token(s);
}

// The biased exponent of a power-of-two scale: its UE8M0 encoding.
EPCOMM_HD constexpr std::uint32_t ue8m0_of(float pow2_scale) {
  return (detail::bit_cast<std::uint32_t>(pow2_scale) >> 23) & 0xFFu;
}

// Writes words first, first + step, ... of packed row `row` of local expert
// `le` into the recv_x_scales region at `region`, from the token's scales as
// its record carries them (one float per 128 channels). The host engine calls
// it with (0, 1), a kernel's warp with (lane, 32): one definition of the layout.
EPCOMM_HD inline void store_scales(const shape& s, std::byte* region, int le, int row,
                                   const std::byte* scales, int first, int step) {
  const int groups = s.scales_per_token();
  const int words = scale_words_per_token(s);
  const std::size_t stride = scale_token_stride(s);
  const std::size_t expert = static_cast<std::size_t>(le) * stride * words;
  auto* out = reinterpret_cast<std::uint32_t*>(region) + expert;
  const auto* in = reinterpret_cast<const float*>(scales);  // 16-byte aligned in a record
  for (int w = first; w < words; w += step) {
    switch (s.scale_layout) {
      case ll_scale_layout::row_major:
        out[static_cast<std::size_t>(row) * words + w] = detail::bit_cast<std::uint32_t>(in[w]);
        break;
      case ll_scale_layout::token_major:
        out[w * stride + row] = detail::bit_cast<std::uint32_t>(in[w]);
        break;
      case ll_scale_layout::ue8m0: {
        std::uint32_t packed = 0;
        for (int k = 0; k < 4 && 4 * w + k < groups; ++k)
          packed |= ue8m0_of(in[4 * w + k]) << (8 * k);
        out[w * stride + row] = packed;
        break;
      }
    }
  }
}

EPCOMM_HD constexpr std::size_t payload_bytes(const shape& s) {
  return static_cast<std::size_t>(s.hidden) * s.wire_bytes;
}
EPCOMM_HD constexpr std::size_t scales_offset(const shape& s) {
  return sizeof(record_header) + payload_bytes(s);
}
EPCOMM_HD constexpr std::size_t record_bytes(const shape& s) {
  return align_up(scales_offset(s) + sizeof(float) * s.scales_per_token(), 16);
}

// Offsets within one parity; parity p starts at p * parity_bytes.
struct plan {
  // Written by peers.
  std::size_t dispatch_counts;  // [E_local][R] count_word, by (local expert, source)
  std::size_t combine_counts;   // [R] count_word, by expert rank
  std::size_t rejects;          // [2][R] reject_record, by (reject_kind, sender)
  std::size_t dispatch_recv;    // [E_local][R] regions of max_tokens records (record_offset)
  std::size_t combine_recv;     // [max_tokens][max_topk][H] bf16, by (token, topk slot)
  // Local: never touched by peers.
  std::size_t combine_send;     // [E_local][R * max_tokens][H] bf16, aligned with recv_x
  std::size_t recv_x;           // [E_local][R * max_tokens][H] wire elements, packed
  std::size_t recv_scales;      // fp8: recv_scales_words(s) 32-bit words, in s.scale_layout
  std::size_t recv_src;         // [E_local][R * max_tokens] source
  std::size_t recv_range;       // [E_local][R] range
  std::size_t recv_count;       // [E_local] int32
  std::size_t sent_topk_idx;    // [max_tokens][max_topk] int64: what this rank dispatched
  std::size_t combine_weights;  // [max_tokens][max_topk] float: this combine's weights
  std::size_t combine_out;      // [max_tokens][H] bf16
  // Staging, RMA transports only (zero otherwise); never touched by peers.
  // Combine rows need none: they are put from combine_send.
  std::size_t send_records;          // [E][max_tokens] records, by destination expert
  std::size_t send_dispatch_counts;  // [E] count_word, by destination expert
  std::size_t send_combine_counts;   // [R] count_word, by source rank
  std::size_t send_rejects;          // [2] reject_record, by reject_kind
  // One (local expert, source) region of dispatch_recv: max_tokens records
  // of the buffer's widest wire, whatever wire a call uses (record_offset).
  std::size_t record_region_bytes;
  std::size_t parity_bytes;
  std::size_t total;
};

EPCOMM_HD constexpr plan plan_buffer(const shape& s, bool staging = false) {
  plan p{};
  const std::size_t el = static_cast<std::size_t>(s.local_experts());
  const std::size_t r = static_cast<std::size_t>(s.world_size);
  const std::size_t t = static_cast<std::size_t>(s.max_tokens_per_rank);
  const std::size_t k = static_cast<std::size_t>(s.max_topk);
  const std::size_t h = static_cast<std::size_t>(s.hidden);
  const std::size_t rows = el * r * t;  // packed output rows over all local experts
  carver regions;
  p.dispatch_counts = regions.take(el * r * sizeof(count_word));
  p.combine_counts = regions.take(r * sizeof(count_word));
  p.rejects = regions.take(2 * r * sizeof(reject_record));
  p.record_region_bytes = t * record_bytes(s);
  p.dispatch_recv = regions.take(el * r * p.record_region_bytes);
  p.combine_recv = regions.take(t * k * h * 2);
  p.combine_send = regions.take(rows * h * 2);
  p.recv_x = regions.take(rows * h * s.wire_bytes);
  p.recv_scales = regions.take(recv_scales_words(s) * sizeof(std::uint32_t));
  p.recv_src = regions.take(rows * sizeof(source));
  p.recv_range = regions.take(el * r * sizeof(range));
  p.recv_count = regions.take(el * sizeof(std::int32_t));
  p.sent_topk_idx = regions.take(t * k * sizeof(std::int64_t));
  p.combine_weights = regions.take(t * k * sizeof(float));
  p.combine_out = regions.take(t * h * 2);
  if (staging) {
    const std::size_t e = static_cast<std::size_t>(s.num_experts);
    p.send_records = regions.take(e * t * record_bytes(s));
    p.send_dispatch_counts = regions.take(e * sizeof(count_word));
    p.send_combine_counts = regions.take(r * sizeof(count_word));
    p.send_rejects = regions.take(2 * sizeof(reject_record));
  }
  p.parity_bytes = regions.at();
  p.total = regions.at() * parities;
  return p;
}

EPCOMM_HD constexpr std::size_t parity_base(const plan& p, int parity) {
  return static_cast<std::size_t>(parity) * p.parity_bytes;
}

// Where record `slot` of region (local expert, source) starts in
// dispatch_recv, for a call on the wire of `cs` (call_shape). Regions are the
// buffer's, so that ranks that disagree on a call's wire (a call every rank
// then rejects) still write disjoint bytes; slots are the call's.
EPCOMM_HD constexpr std::size_t record_offset(const shape& cs, const plan& pl, int local_expert,
                                              int src, int slot) {
  return (static_cast<std::size_t>(local_expert) * cs.world_size + src) * pl.record_region_bytes +
         static_cast<std::size_t>(slot) * record_bytes(cs);
}

// Row of the combine receive region that (token, topk slot) owns.
EPCOMM_HD constexpr std::size_t combine_row(const shape& s, int token, int topk_slot) {
  return static_cast<std::size_t>(token) * s.max_topk + topk_slot;
}

// Signal slots: per parity, [E_local][R] dispatch, then [R] released, then
// [R] combine.
EPCOMM_HD constexpr std::size_t signals_per_parity(const shape& s) {
  return static_cast<std::size_t>(s.local_experts() + 2) * s.world_size;
}
EPCOMM_HD constexpr std::size_t signal_slots(const shape& s) {
  return signals_per_parity(s) * parities;
}
EPCOMM_HD constexpr std::size_t dispatch_signal(const shape& s, int parity, int local_expert,
                                                int src) {
  return parity * signals_per_parity(s) + static_cast<std::size_t>(local_expert) * s.world_size +
         src;
}
EPCOMM_HD constexpr std::size_t released_signal(const shape& s, int parity, int receiver) {
  return parity * signals_per_parity(s) +
         static_cast<std::size_t>(s.local_experts()) * s.world_size + receiver;
}
EPCOMM_HD constexpr std::size_t combine_signal(const shape& s, int parity, int expert_rank) {
  return parity * signals_per_parity(s) +
         static_cast<std::size_t>(s.local_experts() + 1) * s.world_size + expert_rank;
}

}  // namespace epcomm::wire::ll
