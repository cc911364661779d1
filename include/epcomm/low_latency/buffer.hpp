// epcomm::low_latency_buffer: low-latency (decode / rollout) dispatch and
// combine. This is the host engine: the calling thread is the producer. Over
// a peer-mapped transport it stores records straight into peers' buffers; over
// an RMA transport it stages them in its own registered buffer (the plan's
// send_* regions; combine rows are put from combine_send itself) and hands
// put / put_signal descriptors to a proxy thread (proxy::engine), one ring
// per parity. Both paths move the same bytes to the same offsets with the same
// counted signals; writes to this rank itself are stores on both. Wire layout
// and signals: low_latency/wire.hpp; overview: docs/low_latency.md.
// Over an RMA transport, destruction is collective in one respect: it waits
// (bounded) for every peer's release of this rank's last dispatches.
//
// Protocol per call (no count exchange, no notify phase):
//   dispatch  send:    wait until every receiver released this parity's
//                      previous dispatch; write each (token, top-k slot) as a
//                      record into slot i of region (local expert, source) on
//                      the expert's rank; then, per region, a count word and
//                      one signal add.
//             receive: per source, wait for its signals, read the count words
//                      and pack the records into recv_x; then release the
//                      region to every source.
//   combine   send:    write each expert output row into slot (token, top-k
//                      slot) of its source's combine region; then, per source,
//                      a count word and one signal add.
//             receive: wait for every expert rank, check its row count, and
//                      reduce the top-k rows with the weights in fp32.
// Both calls can stop after the send phase and return a hook that runs the
// receive phase later (overlap). Dispatches alternate between two parities; a
// combine uses its dispatch's parity. A parity takes a new call only after its
// previous receive phases ran (a local check): so at most two calls are in
// flight per rank. The combine region needs no release signal: an expert rank
// combines into parity p again only after receiving a newer dispatch on p,
// which its sources send only after finishing their combine on p.
//
// Invalid input (too many tokens, expert id out of range, an expert named
// more often than its region has slots, sizes that disagree, a stale handle)
// is found before any record moves. Without a
// notify phase the peers learn it from the count words: the rejecting rank
// writes a reject record and marks every count word it owes "rejected"
// instead of sending records, then completes its own receive phase (peers'
// signals arrive promptly) and throws. Every peer throws from its receive
// phase, as soon as it reads the marker, an error naming the rejecting rank
// and its cause. Every rank thus fails promptly, epochs stay in step and the
// buffer serves the next call. Transport failures (deadline, dead peer) and
// protocol violations make the buffer unusable, except, with
// mask_lost_ranks, a peer whose process exited: it is marked lost and every
// call from then on runs without it (no records, rows, count words or signals
// to or from it), its experts' combine contributions skipped and counted in
// ll_stats::masked_contributions. Misuse that a rank can see
// alone (a third call in flight, a hook run twice, a second combine of one
// dispatch) throws on that rank before anything is sent.
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "epcomm/core/call_guard.hpp"
#include "epcomm/core/combine_reduce.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/layout.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/host/fault_injection.hpp"
#include "epcomm/host/link.hpp"
#include "epcomm/host/lost_ranks.hpp"
#include "epcomm/host/require_peer_mapped.hpp"
#include "epcomm/low_latency/arguments.hpp"
#include "epcomm/low_latency/parity_calls.hpp"
#include "epcomm/low_latency/receive_hook.hpp"
#include "epcomm/low_latency/report.hpp"
#include "epcomm/low_latency/rma.hpp"
#include "epcomm/low_latency/validation.hpp"
#include "epcomm/low_latency/verdict.hpp"
#include "epcomm/low_latency/wire.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm {

// Wire is what a dispatch moves when not told; More are further wires the
// same buffer serves, each call choosing its own (DeepEP's per-call use_fp8):
// low_latency_buffer<Transport, bf16, fp8_e4m3> sizes its records for the
// wider of the two, with scales.
template <transport Transport, low_latency_wire Wire = bf16, low_latency_wire... More>
requires peer_mapped_transport<Transport> || has_completion_count<Transport>
class low_latency_buffer {
  // Peer-mapped transports keep the direct-store path; RMA ones go through the proxy.
  static constexpr bool via_proxy = host_link<Transport>::via_proxy;
  static constexpr const char* dispatch_op = ll_dispatch_op;
  static constexpr const char* combine_op = ll_combine_op;
  // Masking a lost rank needs a transport that can tell a peer's exit from
  // slowness (only an exited process is certain never to write again) and,
  // over RMA, one that lets the proxy go on without the peer: it meets the
  // loss first, with puts to the lost rank still queued.
  static constexpr bool can_mask_lost_ranks =
      via_proxy ? has_lost_peer_masking<Transport> : has_peer_exit<Transport>;

 public:
  using wire_type = Wire;
  using dispatch_result = ll_dispatch_result<Wire>;

  // Completes a dispatch's receive phase; returned by low_latency_dispatch_send.
  template <class W>
  using dispatch_hook_for =
      receive_hook<low_latency_buffer, ll_dispatch_result<W>, int, std::uint64_t>;
  using dispatch_hook = dispatch_hook_for<Wire>;
  // Completes a combine's receive phase: returns out[T][H], valid until the
  // next combine on the same parity.
  using combine_hook = receive_hook<low_latency_buffer, std::span<const bf16>, int, std::uint64_t>;

  // Collective: every rank of `boot` constructs its buffer with the same config.
  template <bootstrap B>
  low_latency_buffer(B& boot, const low_latency_config& cfg) requires transport_for<Transport, B>
      : rank_(boot.rank()),
        world_(boot.world_size()),
        timeout_(effective_timeout(cfg.timeout)),
        round_scale_(cfg.round_scale),
        mask_lost_ranks_(cfg.mask_lost_ranks),
        shape_(agree_ll_shape<Wire, More...>(boot, cfg, setup_timeout_of(cfg), {},
                                             can_mask_lost_ranks)),
        plan_(wire::ll::plan_buffer(shape_, via_proxy)),
        // One proxy channel per parity, so that reusing a parity's staging
        // waits only for that parity's puts.
        link_(
            [&] {
              return Transport(boot, plan_.total, wire::ll::signal_slots(shape_),
                               deadline::after(setup_timeout_of(cfg)));
            },
            wire::ll::parities),
        next_slot_(shape_.num_experts),
        rows_to_rank_(world_),
        lost_(world_, false),
        scratch_(wire::ll::record_bytes(shape_)) {
    token_rows_.reserve(static_cast<std::size_t>(shape_.max_topk));
    row_weights_.reserve(static_cast<std::size_t>(shape_.max_topk));
    if constexpr (!via_proxy)
      require_peer_mapped(link_.transport(), rank_, world_, "low_latency_buffer",
                          "low-latency mode over this transport needs every rank on one node");
    if constexpr (via_proxy && can_mask_lost_ranks)
      if (mask_lost_ranks_) link_.transport().mask_lost_peers();
    stats_.recv_tokens_per_expert.assign(shape_.local_experts(), 0);
    stats_.dispatch_wait.assign(world_, {});
    stats_.combine_wait.assign(world_, {});
  }

  // Over an RMA transport a peer's writes to this rank are all awaited by this
  // rank, except the release signals of the last dispatch on each parity (a
  // source waits for them only at its next dispatch there). Waiting for them
  // here keeps this rank from closing its endpoint while they are in flight,
  // which would leave the peer's teardown to wait them out. Skipped after a
  // failure or abort; bounded by the timeout. (A dispatch whose receive hook
  // never ran was never released by this rank itself.)
  ~low_latency_buffer() {
    if constexpr (via_proxy) {
      if (guard_.broken() || aborted_.load(std::memory_order_acquire)) return;
      try {
        const deadline dl = deadline::after(timeout_);
        for (int p = 0; p < wire::ll::parities; ++p)
          if (const std::uint64_t epoch = parity_[p].dispatches; epoch > 0)
            for (int r = 0; r < world_; ++r)
              if (!lost_[r] && (r != rank_ || !parity_[p].dispatch_pending))
                link_.transport().wait(
                    wire::ll::released_signal(shape_, p, r), epoch, dl,
                    {"low_latency_buffer teardown", r, "release of the last dispatch"});
      } catch (const error&) {
        // A peer failed or left meanwhile: the transport's teardown is bounded.
      }
    }
  }

  low_latency_buffer(const low_latency_buffer&) = delete;
  low_latency_buffer& operator=(const low_latency_buffer&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const wire::ll::shape& shape() const { return shape_; }
  Transport& transport() { return link_.transport(); }

  // Gives up on the group: this buffer refuses further calls and, through the
  // transport's abort(), waiters in any thread of this rank and peers waiting
  // for it throw promptly instead of at their deadlines (a transport without
  // abort() leaves them to their deadlines). Safe from any thread, also after
  // a failure.
  void abort() {
    aborted_.store(true, std::memory_order_release);
    link_.abort();
  }
  const ll_stats& stats() const { return stats_; }
  void reset_stats() {
    std::ranges::fill(stats_.recv_tokens_per_expert, 0);
    std::ranges::fill(stats_.dispatch_wait, std::chrono::nanoseconds{});
    std::ranges::fill(stats_.combine_wait, std::chrono::nanoseconds{});
    stats_.masked_contributions = 0;
  }

  // The ranks masked so far, ascending (mask_lost_ranks; empty otherwise).
  std::vector<int> lost_ranks() const { return lost_rank_list(lost_); }

  // Moves the tokens on wire W (any served one). Every rank of a call must
  // dispatch the same wire: a rank meeting another wire's records fails
  // naming the sender, without reading them, and the buffer serves the next
  // call.
  template <one_of<Wire, More...> W = Wire>
  ll_dispatch_result<W> low_latency_dispatch(const ll_dispatch_input& in) {
    return low_latency_dispatch_send<W>(in)();
  }

  // The send phase only; run the returned hook before the next dispatch on
  // this parity (the one after next).
  template <one_of<Wire, More...> W = Wire>
  dispatch_hook_for<W> low_latency_dispatch_send(const ll_dispatch_input& in) {
    ensure_usable(dispatch_op);
    const int p = next_parity_;
    parity_state& st = parity_[p];
    const std::uint64_t epoch = st.open_dispatch(rank_, p);
    next_parity_ ^= 1;
    const deadline dl = deadline::after(timeout_);
    const std::string cause = validate(in, wire::ll::call_shape<W>(shape_));
    guarded([&] {
      fault::inject(fault::point::low_latency, rank_, dispatch_op, [this] { link_.abort(); });
      if (epoch > 1)
        for (int r = 0; r < world_; ++r)
          wait_for_peer(wire::ll::released_signal(shape_, p, r), epoch - 1, dl,
                        {dispatch_op, r, "release of the previous dispatch region"});
      // RMA: every put that read this parity's staging and combine_send (the
      // previous dispatch and combine on it) must be complete before they
      // are written again, here or by the caller once this dispatch returns.
      link_.quiet(p, dl);
      if (cause.empty())
        send_records<W>(p, epoch, in, dl);
      else
        send_rejection(p, epoch, cause, wire::ll::reject_kind::dispatch, token_traits<W>::id, dl);
    });
    st.dispatch_sent(cause.empty(), in.num_tokens, in.topk);
    if (!cause.empty()) receive_dispatch<W>(p, epoch);  // throws after draining this epoch
    return dispatch_hook_for<W>(this, &low_latency_buffer::receive_dispatch<W>, p, epoch);
  }

  // Where expert outputs for `h` can be written so that combine reads them in
  // place: [E_local][R * max_tokens][H], aligned with recv_x. Pass it as y.
  std::span<bf16> combine_send_buffer(const ll_handle& h) {
    check_ll_handle_parity(rank_, combine_op, h.parity);
    return {local<bf16>(h.parity, plan_.combine_send), rows_total() * shape_.hidden};
  }

  std::span<const bf16> low_latency_combine(const ll_combine_input& in, const ll_handle& h) {
    return low_latency_combine_send(in, h)();
  }

  // The send phase only; run the returned hook before the next dispatch on
  // this parity.
  combine_hook low_latency_combine_send(const ll_combine_input& in, const ll_handle& h) {
    ensure_usable(combine_op);
    check_ll_handle_parity(rank_, combine_op, h.parity);
    const int p = h.parity;
    parity_state& st = parity_[p];
    const std::uint64_t epoch = st.open_combine(rank_, p);
    const std::string cause = validate(in, h);
    const deadline dl = deadline::after(timeout_);
    guarded([&] {
      if (cause.empty()) {
        // Kept for the receive phase, so the caller's spans need not outlive
        // this call.
        float* weights = local<float>(p, plan_.combine_weights);
        for (int t = 0; t < h.num_tokens; ++t)
          for (int j = 0; j < h.topk; ++j)
            weights[wire::ll::combine_row(shape_, t, j)] =
                in.topk_weights[static_cast<std::size_t>(t) * h.topk + j];
        return_rows(p, epoch, in.y, dl);
      } else {
        send_rejection(p, epoch, cause, wire::ll::reject_kind::combine, token_traits<bf16>::id, dl);
      }
    });
    st.combine_pending = true;
    st.combine_ok = cause.empty();
    if (!cause.empty()) receive_combine(p, epoch);  // throws after draining this epoch
    return combine_hook(this, &low_latency_buffer::receive_combine, p, epoch);
  }

 private:
  // What the receive phase of a combine needs besides the shared bookkeeping.
  struct parity_state : ll_parity_calls {
    bool combine_ok = false;  // this rank's own combine input was accepted
  };

  std::size_t rows_total() const {
    return static_cast<std::size_t>(shape_.local_experts()) * shape_.rows_per_expert();
  }

  // A local region of parity p, typed.
  template <class T>
  T* local(int p, std::size_t offset) {
    return reinterpret_cast<T*>(link_.local(wire::ll::parity_base(plan_, p) + offset));
  }

  // Writes `bytes` from `from` to where `to` says: stored when this rank
  // stores into that peer (host_link::direct), else put by the proxy from
  // `to.local`, where the caller staged the same bytes.
  void write(int p, const wire::ll::rma_write& to, const void* from, const deadline& dl) {
    if (link_.direct(to.peer))
      std::memcpy(link_.direct_ptr(to.peer, to.remote), from, to.bytes);
    else
      link_.put(p, to.peer, to.local, to.remote, to.bytes, dl);
  }

  void ensure_usable(const char* op) const {
    guard_.check(rank_, op, aborted_.load(std::memory_order_acquire) || link_.aborted());
  }

  // A transport failure (deadline, lost peer) or a protocol violation
  // breaks the buffer and aborts the transport (core/call_guard.hpp).
  template <class F>
  void guarded(F&& f) {
    guard_.run(std::forward<F>(f), [this](int culprit) { link_.abort(culprit); });
  }

  // See host/lost_ranks.hpp: false for a peer lost before or found lost now.
  bool wait_for_peer(std::size_t slot, std::uint64_t expected, const deadline& dl,
                     const wait_site& site) {
    return wait_or_mark_lost(link_.transport(), mask_lost_ranks_, lost_, slot, expected, dl, site);
  }

  bool expert_lost(std::int64_t e) const { return lost_[e / shape_.local_experts()]; }

  // A peer's wire bytes break the protocol: the record the kernels fill in the
  // same situation, worded once for both (low_latency/report.hpp).
  [[noreturn]] void protocol_error(const char* op, cuda::ll_failure code, int peer,
                                   std::int64_t expected, std::int64_t seen,
                                   std::int64_t record = 0, wire::ll::source names = {}) const {
    cuda::ll_report r{};
    r.code = code;
    r.peer = peer;
    r.op = std::string_view(op) == dispatch_op ? cuda::ll_op::dispatch : cuda::ll_op::combine;
    r.expected = expected;
    r.seen = seen;
    r.index = static_cast<std::int32_t>(record);
    r.src_rank = names.rank;
    r.src_token = names.token;
    r.src_slot = names.topk_slot;
    throw cuda::to_error(r, rank_);
  }

  // `call`: the buffer's shape with the call's wire (wire::ll::call_shape).
  std::string validate(const ll_dispatch_input& in, const wire::ll::shape& call) {
    const std::size_t h = static_cast<std::size_t>(shape_.hidden);
    if (std::string cause = check_ll_counts(call, in.num_tokens, in.topk); !cause.empty())
      return cause;
    const std::size_t t = static_cast<std::size_t>(in.num_tokens);
    const std::size_t k = static_cast<std::size_t>(in.topk);
    if (in.x.size() != t * h)
      return input_error_text(describe_wrong_size, "x", static_cast<long long>(in.x.size()),
                              "elements", "T*H", static_cast<long long>(t * h));
    if (in.topk_idx.size() != t * k)
      return input_error_text(describe_wrong_size, "topk_idx",
                              static_cast<long long>(in.topk_idx.size()), "ids", "T*K",
                              static_cast<long long>(t * k));
    if (auto bad = find_invalid_expert(in.topk_idx, in.topk, shape_.num_experts)) return *bad;
    // Region (expert, this rank) has max_tokens_per_rank slots; only tokens
    // that name an expert twice can overflow it.
    std::ranges::fill(next_slot_, 0);
    for (const std::int64_t e : in.topk_idx)
      if (e >= 0 && ++next_slot_[e] > shape_.max_tokens_per_rank)
        return input_error_text(describe_expert_overflow, static_cast<long long>(e),
                                shape_.max_tokens_per_rank);
    return {};
  }

  std::string validate(const ll_combine_input& in, const ll_handle& h) {
    const parity_state& st = parity_[h.parity];
    if (std::string cause = check_ll_handle({h.parity, h.epoch, st.dispatches, st.dispatch_accepted,
                                             h.num_tokens, h.topk, st.num_tokens, st.topk});
        !cause.empty())
      return cause;
    const std::size_t rows = rows_total() * shape_.hidden;
    if (in.y.size() != rows)
      return "y holds " + std::to_string(in.y.size()) +
             " elements, expected E_local*R*max*H = " + std::to_string(rows);
    const std::size_t tk = static_cast<std::size_t>(h.num_tokens) * h.topk;
    if (in.topk_idx.size() != tk || in.topk_weights.size() != tk)
      return "topk_idx / topk_weights hold " + std::to_string(in.topk_idx.size()) + " / " +
             std::to_string(in.topk_weights.size()) +
             " values, expected T*K = " + std::to_string(tk);
    const std::int64_t* sent = local<std::int64_t>(h.parity, plan_.sent_topk_idx);
    for (int t = 0; t < h.num_tokens; ++t)
      for (int j = 0; j < h.topk; ++j)
        if (in.topk_idx[static_cast<std::size_t>(t) * h.topk + j] !=
            sent[wire::ll::combine_row(shape_, t, j)])
          return "topk_idx[" + std::to_string(t) + "][" + std::to_string(j) +
                 "] differs from the dispatched id";
    return {};
  }

  template <class W>
  void send_records(int p, std::uint64_t epoch, const ll_dispatch_input& in, const deadline& dl) {
    const wire::ll::shape cs = wire::ll::call_shape<W>(shape_);
    const int k = in.topk;
    const std::size_t payload = wire::ll::payload_bytes(cs);
    const std::size_t scales = sizeof(float) * cs.scales_per_token();
    std::int64_t* sent = local<std::int64_t>(p, plan_.sent_topk_idx);
    std::ranges::fill(next_slot_, 0);
    for (int t = 0; t < in.num_tokens; ++t) {
      const bf16* row = in.x.data() + static_cast<std::size_t>(t) * shape_.hidden;
      // The record is staged once per token: fp8 casts the row once, however
      // many experts it goes to.
      const std::byte* body = reinterpret_cast<const std::byte*>(row);
      if constexpr (token_traits<W>::has_scales) {
        quantize_fp8_row(
            row, shape_.hidden,
            reinterpret_cast<fp8_e4m3*>(scratch_.data() + sizeof(wire::ll::record_header)),
            reinterpret_cast<float*>(scratch_.data() + wire::ll::scales_offset(cs)), round_scale_);
        body = scratch_.data() + sizeof(wire::ll::record_header);
      }
      for (int j = 0; j < k; ++j) {
        const std::int64_t e = in.topk_idx[static_cast<std::size_t>(t) * k + j];
        sent[wire::ll::combine_row(shape_, t, j)] = e;
        if (e < 0 || expert_lost(e)) continue;  // a lost rank's rows are not delivered
        const int slot = next_slot_[e]++;
        const wire::ll::record_header hdr{{rank_, t, j}, 0};
        std::byte* rec = outgoing_record(cs, static_cast<int>(e), slot, p);
        std::memcpy(rec, &hdr, sizeof hdr);
        std::memcpy(rec + sizeof hdr, body, payload);
        if (scales != 0)
          std::memcpy(rec + wire::ll::scales_offset(cs),
                      scratch_.data() + wire::ll::scales_offset(cs), scales);
      }
    }
    for (int e = 0; e < shape_.num_experts; ++e)
      if (!expert_lost(e))
        publish_dispatch_count(
            cs, e, p, {epoch, next_slot_[e], wire::ll::state::ok, token_traits<W>::id}, dl);
  }

  // Where this rank writes record `slot` for expert e in the call's layout
  // `cs`: straight into region (e's local index, this rank) on e's rank, or
  // (RMA) into its staging, by destination expert, for the proxy to put with
  // the count word.
  std::byte* outgoing_record(const wire::ll::shape& cs, int e, int slot, int p) {
    const wire::ll::rma_write region = wire::ll::records_write(cs, plan_, p, rank_, e, 0);
    const std::size_t at = static_cast<std::size_t>(slot) * wire::ll::record_bytes(cs);
    if (link_.direct(region.peer)) return link_.direct_ptr(region.peer, region.remote + at);
    return link_.local(region.local + at);
  }

  // Count word (and, over RMA, the staged records before it, laid out as `cs`
  // says) of region (expert e, this rank), then its signal.
  void publish_dispatch_count(const wire::ll::shape& cs, int e, int p,
                              const wire::ll::count_word& w, const deadline& dl) {
    if constexpr (via_proxy) {
      const wire::ll::rma_write recs = wire::ll::records_write(cs, plan_, p, rank_, e, w.count);
      if (!link_.direct(recs.peer) && w.count > 0)
        link_.put(p, recs.peer, recs.local, recs.remote, recs.bytes, dl);
    }
    publish_count(p, wire::ll::dispatch_count_write(shape_, plan_, p, rank_, e), w, dl);
  }

  void publish_combine_count(int src, int p, const wire::ll::count_word& w, const deadline& dl) {
    publish_count(p, wire::ll::combine_count_write(shape_, plan_, p, rank_, src), w, dl);
  }

  // Count word `w` to where `to` says in its peer's buffer, then one add to
  // its signal; over RMA, staged where `to` says and put with the signal.
  void publish_count(int p, const wire::ll::rma_write& to, const wire::ll::count_word& w,
                     const deadline& dl) {
    std::memcpy(link_.outgoing(to.peer, to.remote, to.local), &w, sizeof w);
    link_.put_signal(p, to.peer, to.local, to.remote, to.bytes, to.slot, dl);
  }

  // Tells every peer, through the count words this rank owes it, that this
  // call is rejected and why. No record moves.
  void send_rejection(int p, std::uint64_t epoch, const std::string& cause,
                      wire::ll::reject_kind kind, std::uint8_t wire_id, const deadline& dl) {
    wire::ll::reject_record rec{};
    rec.epoch = epoch;
    std::strncpy(rec.cause, cause.c_str(), sizeof(rec.cause) - 1);
    if constexpr (via_proxy)
      std::memcpy(link_.local(wire::ll::reject_write(shape_, plan_, p, rank_, kind, rank_).local),
                  &rec, sizeof rec);
    const wire::ll::count_word w{epoch, 0, wire::ll::state::rejected, wire_id};
    for (int r = 0; r < world_; ++r) {
      if (lost_[r]) continue;
      write(p, wire::ll::reject_write(shape_, plan_, p, rank_, kind, r), &rec, dl);
      if (kind == wire::ll::reject_kind::dispatch)
        for (int le = 0; le < shape_.local_experts(); ++le)
          publish_dispatch_count(shape_, r * shape_.local_experts() + le, p, w, dl);
      else
        publish_combine_count(r, p, w, dl);
    }
  }

  std::string reject_cause(int p, int sender, wire::ll::reject_kind kind, std::uint64_t epoch,
                           const char* op) {
    const auto* rec = local<const wire::ll::reject_record>(p, plan_.rejects) +
                      static_cast<std::size_t>(kind) * world_ + sender;
    if (rec->epoch != epoch)
      protocol_error(op, cuda::ll_failure::reject_epoch, sender, static_cast<std::int64_t>(epoch),
                     static_cast<std::int64_t>(rec->epoch));
    return std::string(rec->cause, strnlen(rec->cause, sizeof rec->cause));
  }

  // The error every rank throws for a call some rank rejected: a rank whose own
  // input was bad reports its cause, the others name the first rejecting rank.
  // Reads the reject record, so it must run before this rank releases the
  // region (a peer may then reject its next call and overwrite the record).
  error rejection(const char* op, int p, std::uint64_t epoch, wire::ll::reject_kind kind,
                  bool self_ok, int rejecting) {
    const int culprit = self_ok ? rejecting : rank_;
    const std::string cause = reject_cause(p, culprit, kind, epoch, op);
    if (!self_ok) return error(rank_, op, no_peer, "invalid input: " + cause);
    return error(rank_, op, culprit, "that rank rejected the call: " + cause);
  }

  // Copies the n records of region (local expert le, source s) into rows
  // [begin, begin + n) of le's packed outputs, on wire W.
  template <class W>
  void unpack(int p, int le, int s, int n, int begin) {
    const wire::ll::shape cs = wire::ll::call_shape<W>(shape_);
    const std::size_t rb = wire::ll::record_bytes(cs);
    const std::size_t h = static_cast<std::size_t>(shape_.hidden);
    const std::size_t first =
        static_cast<std::size_t>(le) * shape_.rows_per_expert() + static_cast<std::size_t>(begin);
    const std::byte* rec = local<const std::byte>(p, plan_.dispatch_recv) +
                           wire::ll::record_offset(cs, plan_, le, s, 0);
    W* x = local<W>(p, plan_.recv_x) + first * h;
    wire::ll::source* src = local<wire::ll::source>(p, plan_.recv_src) + first;
    for (int i = 0; i < n; ++i, rec += rb) {
      wire::ll::record_header hdr;
      std::memcpy(&hdr, rec, sizeof hdr);
      // Combine writes into the source's buffer at (token, topk slot): a
      // header out of range must never get that far.
      if (hdr.src.rank != s || hdr.src.token < 0 || hdr.src.token >= shape_.max_tokens_per_rank ||
          hdr.src.topk_slot < 0 || hdr.src.topk_slot >= shape_.max_topk)
        protocol_error(dispatch_op, cuda::ll_failure::record_source, s, 0, 0, i, hdr.src);
      std::memcpy(x + i * h, rec + sizeof hdr, h * sizeof(W));
      if constexpr (token_traits<W>::has_scales)
        wire::ll::store_scales(cs, local<std::byte>(p, plan_.recv_scales), le, begin + i,
                               rec + wire::ll::scales_offset(cs), 0, 1);
      src[i] = hdr.src;
    }
  }

  template <class W>
  ll_dispatch_result<W> receive_dispatch(int p, std::uint64_t epoch) {
    ensure_usable(dispatch_op);
    parity_state& st = parity_[p];
    st.expect_dispatch_pending(rank_, epoch);
    const deadline dl = deadline::after(timeout_);
    const int el = shape_.local_experts();
    const int max = shape_.max_tokens_per_rank;
    const auto* counts = local<const wire::ll::count_word>(p, plan_.dispatch_counts);
    auto* ranges = local<wire::ll::range>(p, plan_.recv_range);
    auto* recv_count = local<std::int32_t>(p, plan_.recv_count);
    std::fill_n(recv_count, el, 0);
    int rejecting = -1;
    std::optional<cuda::ll_report> other_wire;  // the first source that dispatched another wire
    std::optional<error> failure;
    guarded([&] {
      // Source by source, so that a source's records are packed while later
      // sources are still arriving, and so that its offsets are known.
      for (int s = 0; s < world_; ++s) {
        const auto start = steady::now();
        bool arrived = true;
        for (int le = 0; le < el && arrived; ++le)
          arrived = wait_for_peer(wire::ll::dispatch_signal(shape_, p, le, s), epoch, dl,
                                  {dispatch_op, s, "dispatch records"});
        stats_.dispatch_wait[s] += steady::now() - start;
        if (!arrived) {  // lost: nothing of its is read, even records that landed
          for (int le = 0; le < el; ++le)
            ranges[static_cast<std::size_t>(le) * world_ + s] = {recv_count[le], 0};
          continue;
        }
        for (int le = 0; le < el; ++le) {
          const wire::ll::count_word w = counts[static_cast<std::size_t>(le) * world_ + s];
          if (w.epoch != epoch)
            protocol_error(dispatch_op, cuda::ll_failure::count_epoch, s,
                           static_cast<std::int64_t>(epoch), static_cast<std::int64_t>(w.epoch));
          if (w.status == wire::ll::state::rejected) {
            if (rejecting < 0) rejecting = s;
            continue;
          }
          if (w.wire != token_traits<W>::id) {  // records laid out otherwise: not read
            if (!other_wire) {
              other_wire.emplace();
              cuda::wire_mismatch_report(*other_wire, s, token_traits<W>::id, w.wire);
            }
            continue;
          }
          if (w.count < 0 || w.count > max)
            protocol_error(dispatch_op, cuda::ll_failure::count_range, s, max, w.count);
          if (rejecting >= 0 || other_wire || !st.dispatch_accepted)
            continue;  // the call fails: drain
          ranges[static_cast<std::size_t>(le) * world_ + s] = {recv_count[le], w.count};
          unpack<W>(p, le, s, w.count, recv_count[le]);
          recv_count[le] += w.count;
        }
      }
      if (!st.dispatch_accepted || rejecting >= 0) {
        failure.emplace(rejection(dispatch_op, p, epoch, wire::ll::reject_kind::dispatch,
                                  st.dispatch_accepted, rejecting));
      } else if (other_wire) {
        other_wire->op = cuda::ll_op::dispatch;
        failure.emplace(cuda::to_error(*other_wire, rank_));
      }
      // Every record of this parity has been read: sources may write it again.
      for (int r = 0; r < world_; ++r)
        if (!lost_[r]) link_.signal(p, r, wire::ll::released_signal(shape_, p, rank_), dl);
    });
    st.dispatch_pending = false;
    if (failure) {
      st.dispatch_accepted = false;  // no handle of this epoch may be combined
      throw *failure;
    }
    for (int le = 0; le < el; ++le) stats_.recv_tokens_per_expert[le] += recv_count[le];
    const std::size_t rows = rows_total();
    ll_dispatch_result<W> res;
    res.recv_x = {local<const W>(p, plan_.recv_x), rows * shape_.hidden};
    if constexpr (token_traits<W>::has_scales) {
      const std::size_t words = wire::ll::recv_scales_words(shape_);
      if (shape_.scale_layout == ll_scale_layout::ue8m0)
        res.recv_x_scales_ue8m0 = {local<const std::int32_t>(p, plan_.recv_scales), words};
      else
        res.recv_x_scales = {local<const float>(p, plan_.recv_scales), words};
    }
    res.recv_count = {recv_count, static_cast<std::size_t>(el)};
    res.recv_src = {local<const wire::ll::source>(p, plan_.recv_src), rows};
    res.recv_range = {ranges, static_cast<std::size_t>(el) * world_};
    res.handle = {p, epoch, st.num_tokens, st.topk};
    return res;
  }

  // Sends every received row's expert output back to slot (token, top-k slot)
  // of its source, then a count word per source.
  void return_rows(int p, std::uint64_t epoch, std::span<const bf16> y, const deadline& dl) {
    const std::size_t h = static_cast<std::size_t>(shape_.hidden);
    const auto* src = local<const wire::ll::source>(p, plan_.recv_src);
    const auto* recv_count = local<const std::int32_t>(p, plan_.recv_count);
    if constexpr (via_proxy) stage_combine_rows(p, y);
    std::ranges::fill(rows_to_rank_, 0);
    for (int le = 0; le < shape_.local_experts(); ++le) {
      const std::size_t first = static_cast<std::size_t>(le) * shape_.rows_per_expert();
      for (std::size_t row = first; row < first + recv_count[le]; ++row) {
        const wire::ll::source& s = src[row];
        if (lost_[s.rank]) continue;
        write(p, wire::ll::combine_row_write(shape_, plan_, p, row, s), y.data() + row * h, dl);
        ++rows_to_rank_[s.rank];
      }
    }
    for (int s = 0; s < world_; ++s)
      if (!lost_[s])
        publish_combine_count(
            s, p, {epoch, rows_to_rank_[s], wire::ll::state::ok, token_traits<bf16>::id}, dl);
  }

  // RMA path: the proxy puts combine rows from combine_send, where the caller
  // may already have written them (zero copy); otherwise each local expert's
  // valid rows are copied there, in one block.
  void stage_combine_rows(int p, std::span<const bf16> y) {
    bf16* send = local<bf16>(p, plan_.combine_send);
    if (y.data() == send) return;
    const std::size_t h = static_cast<std::size_t>(shape_.hidden);
    const auto* recv_count = local<const std::int32_t>(p, plan_.recv_count);
    const auto begin = reinterpret_cast<std::uintptr_t>(send);
    const auto y_begin = reinterpret_cast<std::uintptr_t>(y.data());
    if (y_begin < begin + y.size_bytes() && begin < y_begin + y.size_bytes()) {
      // y overlaps combine_send without being it: one move keeps every row intact.
      std::memmove(send, y.data(), y.size_bytes());
      return;
    }
    for (int le = 0; le < shape_.local_experts(); ++le) {
      const std::size_t first = static_cast<std::size_t>(le) * shape_.rows_per_expert() * h;
      std::memcpy(send + first, y.data() + first, recv_count[le] * h * sizeof(bf16));
    }
  }

  std::span<const bf16> receive_combine(int p, std::uint64_t epoch) {
    ensure_usable(combine_op);
    parity_state& st = parity_[p];
    st.expect_combine_pending(rank_, epoch);
    const deadline dl = deadline::after(timeout_);
    const int t_count = st.num_tokens;
    const int k = st.topk;
    const int per_rank = shape_.local_experts();
    const auto* sent = local<const std::int64_t>(p, plan_.sent_topk_idx);
    // Rows each expert rank owes this rank: one per routed (token, top-k slot).
    std::ranges::fill(rows_to_rank_, 0);
    for (int t = 0; t < t_count; ++t)
      for (int j = 0; j < k; ++j)
        if (const std::int64_t e = sent[wire::ll::combine_row(shape_, t, j)]; e >= 0)
          ++rows_to_rank_[e / per_rank];
    const auto* counts = local<const wire::ll::count_word>(p, plan_.combine_counts);
    int rejecting = -1;
    guarded([&] {
      for (int r = 0; r < world_; ++r) {
        const auto start = steady::now();
        const bool arrived = wait_for_peer(wire::ll::combine_signal(shape_, p, r), epoch, dl,
                                           {combine_op, r, "combined rows"});
        stats_.combine_wait[r] += steady::now() - start;
        if (!arrived) continue;  // lost: reduce skips its rows
        const wire::ll::count_word w = counts[r];
        if (w.epoch != epoch)
          protocol_error(combine_op, cuda::ll_failure::count_epoch, r,
                         static_cast<std::int64_t>(epoch), static_cast<std::int64_t>(w.epoch));
        if (w.status == wire::ll::state::rejected) {
          if (rejecting < 0) rejecting = r;
        } else if (st.combine_ok && w.count != rows_to_rank_[r]) {
          protocol_error(combine_op, cuda::ll_failure::rows_mismatch, r, rows_to_rank_[r], w.count);
        }
      }
    });
    st.combine_pending = false;
    if (!st.combine_ok || rejecting >= 0) {
      std::optional<error> failure;
      guarded([&] {
        failure.emplace(rejection(combine_op, p, epoch, wire::ll::reject_kind::combine,
                                  st.combine_ok, rejecting));
      });
      throw *failure;
    }
    reduce(p, t_count, k);
    return {local<const bf16>(p, plan_.combine_out),
            static_cast<std::size_t>(t_count) * shape_.hidden};
  }

  // out[t] = sum over routed slots j of weight[t][j] * row(t, j), in fp32 and
  // in slot order, rounded to bf16 once; a slot whose expert's rank is lost
  // is left out (and counted), as if its weight were 0.
  void reduce(int p, int t_count, int k) {
    const std::size_t h = static_cast<std::size_t>(shape_.hidden);
    const auto* sent = local<const std::int64_t>(p, plan_.sent_topk_idx);
    const auto* weights = local<const float>(p, plan_.combine_weights);
    const auto* rows = local<const bf16>(p, plan_.combine_recv);
    bf16* out = local<bf16>(p, plan_.combine_out);
    for (int t = 0; t < t_count; ++t) {
      token_rows_.clear();
      row_weights_.clear();
      for (int j = 0; j < k; ++j) {
        const std::size_t slot = wire::ll::combine_row(shape_, t, j);
        if (sent[slot] < 0) continue;
        if (expert_lost(sent[slot])) {
          ++stats_.masked_contributions;
          continue;
        }
        token_rows_.push_back(rows + slot * h);
        row_weights_.push_back(weights[slot]);
      }
      reduce_token_weighted<bf16, bf16>(out + static_cast<std::size_t>(t) * h, h, token_rows_,
                                        row_weights_.data());
    }
  }

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  bool round_scale_;
  bool mask_lost_ranks_;
  wire::ll::shape shape_;
  wire::ll::plan plan_;
  host_link<Transport> link_;
  parity_state parity_[wire::ll::parities];
  int next_parity_ = 0;
  // Per-call scratch, sized once here so that no call allocates.
  std::vector<int> next_slot_;           // [E] records written to each expert
  std::vector<int> rows_to_rank_;        // [R] combine rows per rank
  std::vector<bool> lost_;               // [R] masked: its process exited (mask_lost_ranks)
  std::vector<std::byte> scratch_;       // one staged record
  std::vector<const bf16*> token_rows_;  // one token's rows in the reduction, [<= K]
  std::vector<float> row_weights_;       // and their weights
  ll_stats stats_;
  call_guard guard_;
  std::atomic<bool> aborted_{false};  // abort() was called, maybe from another thread
};

}  // namespace epcomm
