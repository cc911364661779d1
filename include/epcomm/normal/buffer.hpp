// epcomm::buffer: normal-mode dispatch and combine, templated on the transport
// and the token types it serves. This is the host engine: the calling thread is the
// producer. Over a peer-mapped transport it stores rows straight into peers'
// buffers; over an RMA transport it stages them in its own registered buffer
// (wire::region_plan's send_* regions) and pushes the descriptors of
// normal/route.hpp, the kernels' own, to a proxy thread (host/link.hpp).
// Both paths move the same bytes to the same offsets with the same counted
// signals. Protocol per call (see docs/design.md):
//
//   dispatch  notify: every rank posts its shape, input status and counts to
//             every peer; all ranks then decide identically whether to go on,
//             so bad input fails everywhere before any payload moves.
//             data: rows go to (prefix over sources) offsets, then a counted
//             signal per (source, destination).
//             From a cached handle: the notify round carries the header
//             alone (no counts, a fingerprint of the handle's instead).
//   combine   ready: every rank posts its status and that its combine region is
//             free; rows go back in one block per (rank, source); the source
//             reduces in fp32.
//
// dispatch_async and combine_async queue a call on the buffer's
// communication thread and return a completion (normal/async_calls.hpp).
//
// Token types: buffer<T, bf16> serves bf16 calls; buffer<T, bf16, fp8_e4m3,
// float> serves all three from one set of regions, sized for the widest
// (rows of the largest element, scales if any type has them), each call's
// type taken from its arguments. A call's type is in its notify header and
// y's in its combine header, so ranks that disagree fail together. An
// argument list in braces means the first type: it has no type to deduce.
//
// mask_lost_ranks (peer-mapped transports that tell a peer's exit): a peer
// whose process exited is marked lost and calls go on without it. Receive
// offsets are prefix sums over the sources, so every survivor must count the
// same sources in a call. A rank finishes each round's writes to every peer,
// then stores the round's number in its own progress word for that kind of
// round (wire::region_plan::progress: the call's epoch, or for rows how many
// such rounds it has run, several per call in windows), then signals. A
// survivor that finds a peer gone reads that word, which can no longer
// change: the peer took part in the round if and only if it is there. Every
// survivor so reaches the same members (a lost rank's notify counts are in
// every survivor's buffer or in none that counts them) without another
// round. A lost peer's rows that never all arrived (in windows: a peer lost
// before its last round) become padding rows (topk_idx -1, weight 0,
// src_idx -1), and a token's rows from an expert rank that was lost are left
// out of its combine, counted in buffer_stats::masked_contributions.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "epcomm/core/call_guard.hpp"
#include "epcomm/core/combine_reduce.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/layout.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/core/topology.hpp"
#include "epcomm/host/call_queue.hpp"
#include "epcomm/host/fault_injection.hpp"
#include "epcomm/host/link.hpp"
#include "epcomm/host/lost_ranks.hpp"
#include "epcomm/host/require_peer_mapped.hpp"
#include "epcomm/normal/arguments.hpp"
#include "epcomm/normal/async_calls.hpp"
#include "epcomm/normal/call_headers.hpp"
#include "epcomm/normal/call_overloads.hpp"
#include "epcomm/normal/capacity_agreement.hpp"
#include "epcomm/normal/input_checks.hpp"
#include "epcomm/normal/route.hpp"
#include "epcomm/normal/verdict.hpp"
#include "epcomm/normal/window.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm {

template <transport Transport, token_type... Tokens>
requires(sizeof...(Tokens) >= 1) &&
    (peer_mapped_transport<Transport> || has_completion_count<Transport>)class buffer
    : public async_calls<buffer<Transport, Tokens...>, Tokens...>,
    public call_overloads<buffer<Transport, Tokens...>, Tokens...> {
  friend class async_calls<buffer, Tokens...>;  // queues on calls_
  // Peer-mapped transports keep the direct-store path; RMA ones go through the proxy.
  static constexpr bool via_proxy = host_link<Transport>::via_proxy;
  // Masking needs every byte to a peer stored by this rank (no proxy holding
  // puts) and a transport that tells an exited peer from a slow one.
  static constexpr bool can_mask_lost_ranks = !via_proxy && has_peer_exit<Transport>;

 public:
  // What a call in braces, dispatch_send_buffer and combine_send_buffer mean
  // when not told a type.
  using typename call_overloads<buffer, Tokens...>::first_token;
  using typename call_overloads<buffer, Tokens...>::first_combine;
  using call_overloads<buffer, Tokens...>::dispatch;
  using call_overloads<buffer, Tokens...>::combine;

  // Collective: every rank of `boot` constructs its buffer with the same config.
  template <bootstrap B>
  requires transport_for<Transport, B> buffer(B& boot, const buffer_config& cfg)
      : rank_(boot.rank()),
        world_(boot.world_size()),
        timeout_(effective_timeout(cfg.timeout)),
        cap_(agree_capacity<Tokens...>(boot, cfg, setup_timeout_of(cfg),
                                       {.mask_lost_ranks = can_mask_lost_ranks,
                                        .byte_budget = true,
                                        .staging = via_proxy,
                                        .in_place_combine = !via_proxy})),
        plan_(wire::plan_regions(cap_, via_proxy, !via_proxy)),
        link_([&] {
          return Transport(boot, plan_.total, wire::signal_slots(world_),
                           deadline::after(setup_timeout_of(cfg)));
        }),
        mask_lost_ranks_(cfg.mask_lost_ranks),
        lost_(world_, false) {
    if constexpr (!via_proxy)
      require_peer_mapped(link_.transport(), rank_, world_, "buffer",
                          "normal mode over this transport needs every rank on one node");
  }

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const wire::capacity& capacity() const { return cap_; }
  Transport& transport() { return link_.transport(); }

  // Time this rank spent blocked on each peer, cumulative: the rank whose
  // column grows fastest on every other rank is the straggler.
  const buffer_stats& stats() const { return stats_; }
  void reset_stats() { stats_ = buffer_stats{std::vector<std::chrono::nanoseconds>(world_)}; }

  // The ranks masked so far, ascending (mask_lost_ranks; empty otherwise).
  std::vector<int> lost_ranks() const { return lost_rank_list(lost_); }

  // Gives up on the group: waiters in any thread of this rank and peers
  // waiting for it throw promptly instead of at their deadlines, and this
  // buffer refuses further calls. Safe from any thread, also after a failure.
  void abort() { link_.abort(); }

  // Where the tokens of the next dispatch can be written ([num_tokens][hidden])
  // so that a dispatch given exactly this span as x copies none of them. Over
  // an RMA transport this is registered memory: rows are put from where they
  // are, a run of consecutive tokens bound for one rank as one write, instead
  // of being staged per destination first. Over a peer-mapped transport
  // dispatch stores rows into the peers' buffers from wherever x is, and this
  // is plain memory of the buffer's. Only the caller writes it; dispatch
  // returns once nothing reads it any more. With a window (max_buffer_bytes)
  // it is host memory for this call, valid until the next such call, and
  // the rows are staged like any others.
  template <one_of<Tokens...> Token = first_token>
  std::span<Token> dispatch_send_buffer(int num_tokens, int hidden) {
    calls_.drain();
    if (num_tokens < 0 || num_tokens > cap_.max_tokens_per_rank || hidden < 1 ||
        hidden > cap_.max_hidden)
      throw error(rank_, "dispatch_send_buffer", no_peer,
                  "invalid input: " + std::to_string(num_tokens) + " tokens of hidden " +
                      std::to_string(hidden) + " exceed the buffer's " +
                      std::to_string(cap_.max_tokens_per_rank) +
                      " tokens of hidden <= " + std::to_string(cap_.max_hidden));
    // With a window, host memory for this call's tokens alone: the budget
    // bounds the buffer, and max_tokens_per_rank may be far beyond a call.
    const std::size_t tokens =
        windowed() ? static_cast<std::size_t>(num_tokens) * hidden
                   : static_cast<std::size_t>(cap_.max_tokens_per_rank) * cap_.max_hidden;
    if (!via_proxy || windowed())
      send_tokens_.resize((tokens * cap_.token_bytes + sizeof(float) - 1) / sizeof(float));
    return {dispatch_send_area<Token>(), static_cast<std::size_t>(num_tokens) * hidden};
  }

  template <one_of<Tokens...> Token>
  dispatch_result<Token> dispatch(const dispatch_input<Token>& in,
                                  const dispatch_options& opt = {}) {
    const call_start call = start_call("dispatch", dispatch_epoch_);
    const std::string cause = check_dispatch_input(in, opt, cap_);
    const topology topo{world_, world_, cap_.num_experts, in.hidden, in.topk};
    const layout lay = cause.empty() ? make_layout(topo, in.topk_idx, in.num_tokens) : layout{};

    std::vector<bool> members(world_);
    guarded([&] {
      inject(fault::point::before_notify, "dispatch");
      wire::notify_header hdr = notify_header_of<Token>(cause, call.epoch, in.num_tokens, in.hidden,
                                                        in.topk, cap_.num_experts);
      hdr.recv_bound = opt.worst_case_recv_tokens;
      post_notify(hdr, &lay, call.epoch, call.dl);
      for (int s = 0; s < world_; ++s)
        members[s] = await_round(wire::signal_kind::notify, s, call.epoch, call.dl,
                                 {"dispatch", s, "notify counts"});
    });
    const auto peers = read_notify(members);
    settle_on_failure(
        [&] { judge_notify(rank_, call.epoch, cap_.max_recv_tokens, peers, members); },
        wire::signal_kind::data, data_signals_, call.dl, "dispatch");

    dispatch_result<Token> res;
    res.handle = make_dispatch_handle({world_, rank_, in.num_tokens, in.hidden, in.topk},
                                      call.epoch, peers, lay.send_pos);
    const std::vector<bool> rows_came =
        move_rows(in, lay, res.handle, topo,
                  std::max(res.handle.num_recv_tokens, opt.worst_case_recv_tokens), call.dl);
    fill_result(res, in, opt, peers, rows_came);
    return res;
  }

  // DeepEP's dispatch(handle=...): new rows along the routing of the dispatch
  // that returned `h` (a backward pass's gradients, the next micro-step's
  // tokens), every rank passing its handle of that same dispatch. No layout
  // and no count exchange: the notify round carries the header alone, with a
  // fingerprint of the handle's count matrix that must match on every rank.
  // The result holds recv_x (recv_x_scales for fp8) and recv_src_idx in the
  // handle's receive order, and `h` as its handle; no top-k ids, weights or
  // per-expert counts (the handle's dispatch returned those).
  template <one_of<Tokens...> Token>
  dispatch_result<Token> dispatch(const cached_dispatch_input<Token>& in,
                                  const dispatch_handle& h) {
    const call_start call = start_call("dispatch", dispatch_epoch_);
    const std::string cause = check_cached_dispatch_input(in, h, rank_, cap_);
    const bool ok = cause.empty();
    std::vector<bool> members(world_);
    guarded([&] {
      inject(fault::point::before_notify, "dispatch");
      post_notify(cached_notify_header_of<Token>(cause, call.epoch, cap_.num_experts, h), nullptr,
                  call.epoch, call.dl);
      for (int s = 0; s < world_; ++s)
        members[s] = await_round(wire::signal_kind::notify, s, call.epoch, call.dl,
                                 {"dispatch", s, "notify header"});
    });
    // A rejected handle may be malformed: its counts are not read (the verdict
    // stops at the input's status before it looks at counts).
    const auto peers = read_notify(members, ok ? &h : nullptr);
    settle_on_failure(
        [&] { judge_notify(rank_, call.epoch, cap_.max_recv_tokens, peers, members); },
        wire::signal_kind::data, data_signals_, call.dl, "dispatch");

    dispatch_result<Token> res;
    res.handle = h;
    const dispatch_input<Token> rows{h.num_tokens, h.hidden, 0, in.x, in.x_scales, {}, {}};
    layout lay;
    lay.num_tokens = h.num_tokens;
    lay.world_size = world_;
    lay.send_pos = h.send_pos;
    const std::vector<bool> rows_came =
        move_rows(rows, lay, h, topology{world_, world_, cap_.num_experts, h.hidden, 0},
                  h.num_recv_tokens, call.dl);
    fill_result(res, rows, {}, peers, rows_came);
    res.num_recv_tokens_per_expert.clear();
    return res;
  }

  // Where the expert outputs for `h` can be written ([num_recv_tokens][hidden],
  // receive order) so that a combine given exactly this span as y copies
  // nothing. Over a peer-mapped transport the sources then reduce the rows
  // straight from this rank's buffer, and that combine returns once every
  // source has read them; over an RMA transport the rows are put from where
  // they are (the staging area) instead of being staged first. Either way the
  // rows must stay untouched until that combine returns. With a window
  // (max_buffer_bytes) it is host memory for this handle's rows, valid until
  // the next such call, and combine moves them like any others.
  template <one_of<combine_type_t<Tokens>...> Out = first_combine>
  std::span<Out> combine_send_buffer(const dispatch_handle& h) {
    calls_.drain();
    if (h.world_size != world_ || h.rank != rank_ || h.hidden < 1 || h.hidden > cap_.max_hidden ||
        h.num_recv_tokens < 0 || h.num_recv_tokens > cap_.max_recv_tokens)
      throw error(rank_, "combine_send_buffer", no_peer,
                  "invalid input: the handle does not come from this buffer's dispatch");
    const std::size_t n = static_cast<std::size_t>(h.num_recv_tokens) * h.hidden;
    if (windowed()) {  // host memory for this handle's rows (there is no region)
      send_y_.resize((n * sizeof(Out) + sizeof(float) - 1) / sizeof(float));
      return {reinterpret_cast<Out*>(send_y_.data()), n};
    }
    return {combine_y<Out>(), n};
  }

  // Writes out_x[T][H] (and out_weights[T][K] when in.topk_weights is given)
  // without allocating. Out is y's element type: any of the served tokens'
  // combine types, whatever type the handle's dispatch moved.
  template <one_of<combine_type_t<Tokens>...> Out>
  void combine(const combine_input<Out>& in, const dispatch_handle& h,
               std::type_identity_t<std::span<Out>> out_x, std::span<float> out_weights = {}) {
    const call_start call = start_call("combine", combine_epoch_);
    const std::string cause = check_combine_input<Out>(in, h, out_x, out_weights, rank_, cap_);
    // With a window the rows always move: there is no region to leave them in.
    const bool in_place = !windowed() && left_in_place(in, h);

    std::vector<bool> members(world_);
    guarded([&] {
      // Over RMA the rows are pushed either way: sources need not know.
      wire::combine_header hdr =
          combine_header_of<Out>(cause, call.epoch, in.topk_weights.has_value(), h);
      hdr.in_place = in_place && !via_proxy ? 1 : 0;
      post_combine_status(hdr, call.dl);
      for (int s = 0; s < world_; ++s)
        members[s] = await_round(wire::signal_kind::combine_ready, s, call.epoch, call.dl,
                                 {"combine", s, "combine readiness"});
    });
    std::vector<wire::combine_header> status;
    settle_on_failure([&] { status = check_combine_status(call.epoch, members); },
                      wire::signal_kind::combine_data, combine_signals_, call.dl, "combine");
    std::vector<bool> returned(world_, true);
    guarded([&] {
      if (windowed()) {
        returned = return_rows_in_rounds(in, h, call.dl);
        return;
      }
      inject(fault::point::mid_combine, "combine");
      const std::uint64_t round = ++combine_signals_;
      if constexpr (via_proxy)
        put_combine_rows(in, h, in_place, call.dl);
      else
        return_rows(in, h, in_place, round, call.dl);
      for (int r = 0; r < world_; ++r)
        returned[r] = await_round(wire::signal_kind::combine_data, r, round, call.dl,
                                  {"combine", r, "combined rows"});
    });
    reduce(in, h, status, returned, out_x, out_weights);
    if constexpr (via_proxy)
      guarded([&] { quiet_staging(call.dl); });  // the caller may write the next y there now
    else
      release_in_place_rows(status, in_place, call.dl);
  }

 private:
  static constexpr int producer_channel = 0;  // the calling thread

  struct peer_notify {
    wire::notify_header header;
    std::vector<int> tokens_per_rank;          // [R]
    std::vector<int> tokens_per_local_expert;  // [E/R] of this rank's experts
  };

  std::size_t slot(wire::signal_kind kind, int source) const {
    return wire::signal_slot(kind, source, world_);
  }

  // RMA path: the proxy, behind the route's pusher interface.
  auto route(const deadline& dl) { return link_.writer(producer_channel, dl); }

  // RMA path: before staging overwrites the send regions, every put that
  // read them must be complete.
  void quiet_staging(const deadline& dl) { link_.quiet(producer_channel, dl); }

  std::byte* local(std::size_t offset) { return link_.local(offset); }

  // A synchronous call runs after the asynchronous ones queued before it.
  call_start start_call(const char* op, std::uint64_t& epochs) {
    calls_.drain();
    return guard_.start(rank_, op, link_.aborted(), epochs, timeout_);
  }

  // See core/call_guard.hpp: a failed call breaks the buffer and aborts the group.
  template <class F>
  void guarded(F&& f) {
    guard_.run(std::forward<F>(f), [this](int culprit) { link_.abort(culprit); });
  }

  // Waits for `peer`'s round `kind` of call `epoch`. True once it came;
  // with mask_lost_ranks, a peer whose process is gone (found now or
  // before) is marked lost instead, and the answer is whether it finished
  // the round before it went: its progress word, final by then, so every
  // survivor answers alike. Any other failure throws.
  bool await_round(wire::signal_kind kind, int peer, std::uint64_t epoch, const deadline& dl,
                   const wait_site& site) {
    if (!lost_[peer]) {
      const auto start = steady::now();
      const bool came = wait_or_mark_lost(link_.transport(), mask_lost_ranks_, lost_,
                                          slot(kind, peer), epoch, dl, site);
      stats_.wait_per_peer[peer] += steady::now() - start;
      if (came) return true;
    }
    if constexpr (can_mask_lost_ranks)
      return std::atomic_ref(progress_word(peer, kind)).load(std::memory_order_acquire) >= epoch;
    else
      return false;  // unreachable: nothing is marked lost without masking
  }

  std::uint64_t& progress_word(int r, wire::signal_kind kind) {
    return peer_array<std::uint64_t>(r, plan_.progress)[static_cast<int>(kind)];
  }

  // Peer-mapped path, once this rank's writes of round `kind` of call
  // `epoch` to every peer are done: stores the progress word lost-peer
  // settlement reads (see await_round), then adds 1 to the round's counter
  // at every peer not lost.
  void end_round(wire::signal_kind kind, std::uint64_t epoch, const deadline& dl) {
    std::atomic_ref(progress_word(rank_, kind)).store(epoch, std::memory_order_release);
    for (int p = 0; p < world_; ++p)
      if (!lost_[p]) link_.signal(producer_channel, p, slot(kind, rank_), dl);
  }

  void inject(fault::point at, const char* op) {
    fault::inject(at, rank_, op, [this] { link_.abort(); });
  }

  // A call every rank agreed to reject (check() throws) still completes its
  // final round, `final_round` with no payload, before throwing (see
  // call_guard::settle). `signals`: the round's count so far (data_signals_,
  // combine_signals_).
  template <class Check>
  void settle_on_failure(Check&& check, wire::signal_kind final_round, std::uint64_t& signals,
                         const deadline& dl, const char* op) {
    guard_.settle(
        std::forward<Check>(check),
        [&] {
          const std::uint64_t round = ++signals;
          if constexpr (via_proxy)
            push_rejection(final_round, dl);
          else
            end_round(final_round, round, dl);
          for (int p = 0; p < world_; ++p)
            await_round(final_round, p, round, dl, {op, p, "agreement to reject the call"});
        },
        [this](int culprit) { link_.abort(culprit); });
  }

  // RMA path: the final round of a call every rank agreed to reject, as the
  // route pushes it for a rejected call (bare signals).
  void push_rejection(wire::signal_kind final_round, const deadline& dl) {
    if (final_round == wire::signal_kind::data)
      normal_push::rows(route(dl), plan_, world_, rank_, nullptr, {}, false);
    else
      normal_push::combine_rows(route(dl), plan_, world_, rank_, nullptr, {}, false, false);
  }

  // The notify round: `hdr`, then this rank's counts from `lay` (zeros for a
  // rejected call), or the header alone when `lay` is null (a dispatch from a
  // cached handle, whose counts every rank already holds).
  void post_notify(const wire::notify_header& hdr, const layout* lay, std::uint64_t epoch,
                   const deadline& dl) {
    quiet_staging(dl);
    const int per_rank = cap_.num_experts / world_;
    const std::size_t notify_bytes =
        sizeof hdr + (lay ? sizeof(std::int32_t) * (world_ + per_rank) : 0);
    for (int p = 0; p < world_; ++p) {
      if (lost_[p]) continue;
      const std::size_t there = plan_.notify + rank_ * plan_.notify_slot_bytes;
      const std::size_t staged = plan_.send_notify + p * plan_.notify_slot_bytes;
      std::byte* at = link_.outgoing(p, there, staged);
      std::memcpy(at, &hdr, sizeof hdr);
      if (lay == nullptr) continue;
      auto* counts = reinterpret_cast<std::int32_t*>(at + sizeof hdr);
      if (hdr.state == wire::status::ok) {
        std::copy(lay->tokens_per_rank.begin(), lay->tokens_per_rank.end(), counts);
        std::copy_n(lay->tokens_per_expert.begin() + p * per_rank, per_rank, counts + world_);
      } else {
        std::fill_n(counts, world_ + per_rank, 0);
      }
    }
    if constexpr (via_proxy)
      normal_push::notify(route(dl), plan_, world_, rank_, notify_bytes);
    else
      end_round(wire::signal_kind::notify, epoch, dl);
  }

  // Every member's notify record; a rank outside `members` sent nothing and
  // counts as sending nothing (its slot may hold an older call's record).
  // With `cached`, the records carried headers only: the counts are the
  // handle's, and there are no per-expert counts.
  std::vector<peer_notify> read_notify(const std::vector<bool>& members,
                                       const dispatch_handle* cached = nullptr) {
    const int per_rank = cached ? 0 : cap_.num_experts / world_;
    std::vector<peer_notify> peers(world_);
    const std::byte* base = local(plan_.notify);
    for (int s = 0; s < world_; ++s) {
      if (!members[s]) {
        peers[s].tokens_per_rank.assign(world_, 0);
        peers[s].tokens_per_local_expert.assign(per_rank, 0);
        continue;
      }
      const std::byte* at = base + s * plan_.notify_slot_bytes;
      std::memcpy(&peers[s].header, at, sizeof(wire::notify_header));
      const auto* counts =
          cached ? cached->count_matrix.data() + s * world_
                 : reinterpret_cast<const std::int32_t*>(at + sizeof(wire::notify_header));
      peers[s].tokens_per_rank.assign(counts, counts + world_);
      peers[s].tokens_per_local_expert.assign(counts + world_, counts + world_ + per_rank);
    }
    return peers;
  }

  template <class T>
  T* peer_array(int peer, std::size_t offset) {
    return reinterpret_cast<T*>(link_.direct_ptr(peer, offset));
  }

  // The arrays of dispatch rows, at one place: a receive region (a peer's
  // or this rank's), the staging area, or the host memory of a call in
  // windows. store_row and copy_rows write one from the caller's input or
  // another.
  template <class Token>
  struct row_arrays {
    Token* x;
    float* scales;
    std::int64_t* idx;
    float* weights;
    std::int32_t* src;
  };

  // The arrays at `base` + `pl`'s receive (send = false) or staging offsets,
  // from row `first` on, for rows of `hidden` and `k`.
  template <class Token>
  static row_arrays<Token> arrays_at(std::byte* base, const wire::region_plan& pl, bool send,
                                     std::size_t first, std::size_t hidden, std::size_t k) {
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    return {
        reinterpret_cast<Token*>(base + (send ? pl.send_x : pl.recv_x)) + first * hidden,
        reinterpret_cast<float*>(base + (send ? pl.send_scales : pl.recv_scales)) + first * nscales,
        reinterpret_cast<std::int64_t*>(base + (send ? pl.send_topk_idx : pl.recv_topk_idx)) +
            first * k,
        reinterpret_cast<float*>(base + (send ? pl.send_weights : pl.recv_weights)) + first * k,
        reinterpret_cast<std::int32_t*>(base + (send ? pl.send_src_idx : pl.recv_src_idx)) + first};
  }

  // Token t's row for rank r as row `row` of `to`: its x (when `with_x`) and
  // scales, its expert ids rewritten to r's local ones (-1 and weight 0 for
  // another rank's), its index.
  template <class Token>
  static void store_row(const row_arrays<Token>& to, std::size_t row,
                        const dispatch_input<Token>& in, int t, int r, int per_rank, bool with_x) {
    const std::size_t hidden = in.hidden;
    const std::size_t k = in.topk;
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    if (with_x) std::memcpy(to.x + row * hidden, in.x.data() + t * hidden, hidden * sizeof(Token));
    if (nscales != 0)
      std::memcpy(to.scales + row * nscales, in.x_scales.data() + t * nscales,
                  nscales * sizeof(float));
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t local = local_expert_id(in.topk_idx[t * k + j], r, per_rank);
      to.idx[row * k + j] = local;
      to.weights[row * k + j] = local >= 0 ? in.topk_weights[t * k + j] : 0.0f;
    }
    to.src[row] = t;
  }

  template <class Token>
  static void copy_rows(const row_arrays<Token>& to, const row_arrays<Token>& from, std::size_t n,
                        std::size_t hidden, std::size_t k) {
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    std::memcpy(to.x, from.x, n * hidden * sizeof(Token));
    std::memcpy(to.scales, from.scales, n * nscales * sizeof(float));
    std::memcpy(to.idx, from.idx, n * k * sizeof(std::int64_t));
    std::memcpy(to.weights, from.weights, n * k * sizeof(float));
    std::memcpy(to.src, from.src, n * sizeof(std::int32_t));
  }

  bool windowed() const { return cap_.window_rows > 0; }

  // A dispatch's data round(s), once the notify round has accepted it:
  // whether each source's rows all arrived (a lost one's may not have).
  // `result_rows`: the rows the result holds, padding included.
  template <class Token>
  std::vector<bool> move_rows(const dispatch_input<Token>& in, const layout& lay,
                              const dispatch_handle& h, const topology& topo, int result_rows,
                              const deadline& dl) {
    std::vector<bool> came(world_, true);
    guarded([&] {
      if (windowed()) {
        came = rows_in_rounds(in, lay, h, topo, result_rows, dl);
      } else {
        inject(fault::point::mid_dispatch, "dispatch");
        const std::uint64_t round = ++data_signals_;
        send_rows(in, lay, h, topo, dl);
        for (int s = 0; s < world_; ++s)
          came[s] =
              await_round(wire::signal_kind::data, s, round, dl, {"dispatch", s, "token rows"});
      }
      // The staging area holds combine_send_buffer: the caller's experts may
      // write it as soon as this returns, so no put may still read it.
      quiet_staging(dl);
    });
    return came;
  }

  template <class Token>
  void send_rows(const dispatch_input<Token>& in, const layout& lay, const dispatch_handle& h,
                 const topology& topo, const deadline& dl) {
    quiet_staging(dl);
    const std::size_t hidden = in.hidden;
    const std::size_t k = in.topk;
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    const int per_rank = topo.experts_per_rank();
    // Over RMA, x written into dispatch_send_buffer is put from there.
    const bool stage_x = !(via_proxy && in.x.data() == dispatch_send_area<Token>());
    // Rows for a rank this one stores into (every rank over a peer-mapped
    // transport, itself over RMA) go to their final rows there; the others
    // are staged by destination: rank r's rows start after those of ranks < r.
    std::vector<row_arrays<Token>> to(world_);
    for (int r = 0; r < world_; ++r)
      to[r] = link_.direct(r)
                  ? arrays_at<Token>(link_.direct_ptr(r, 0), plan_, false, h.recv_offset(rank_, r),
                                     hidden, k)
                  : arrays_at<Token>(local(0), plan_, true, h.return_offset(rank_, r), hidden, k);
    // Token-major: each source row is read once, while hot, for all its ranks.
    for (int t = 0; t < in.num_tokens; ++t)
      for (int r = 0; r < world_; ++r) {
        const int pos = lay.position(t, r);
        if (pos >= 0 && !lost_[r])
          store_row(to[r], pos, in, t, r, per_rank, stage_x || link_.direct(r));
      }
    if constexpr (via_proxy) {
      const normal_push::row_shape rs{hidden * sizeof(Token), nscales * sizeof(float), k, 0};
      const normal_push::x_source xs =
          stage_x ? normal_push::x_source{}
                  : normal_push::x_source{lay.send_pos.data(), lay.num_tokens};
      normal_push::rows(route(dl), plan_, world_, rank_, h.count_matrix.data(), rs, true, xs);
    } else {
      end_round(wire::signal_kind::data, data_signals_, dl);
    }
  }

  // A dispatch in windows (normal/window.hpp): each round, this rank's
  // slice of rows for every rank into that rank's window for it (once the
  // rank has emptied it of the last round), then every source's slice out
  // of this rank's windows into the result's host memory (received_, laid
  // out as the receive regions), freeing the windows. Returns whether each
  // source's rows all came: a round's count is its progress word (see
  // await_round), so a source lost between rounds is judged by the last
  // round it finished, and the rows of a source lost before its last round
  // become padding, as in a whole call.
  template <class Token>
  std::vector<bool> rows_in_rounds(const dispatch_input<Token>& in, const layout& lay,
                                   const dispatch_handle& h, const topology& topo, int result_rows,
                                   const deadline& dl) {
    const std::size_t hidden = in.hidden;
    const std::size_t k = in.topk;
    const int window = cap_.window_rows;
    const int rounds = wire::window_rounds(h.count_matrix.data(), world_, window);
    const int per_rank = topo.experts_per_rank();
    wire::capacity shape = cap_;
    shape.max_hidden = in.hidden;
    shape.max_topk = in.topk;
    wire::carver regions;
    wire::take_received_rows(received_plan_, regions, shape, result_rows);
    received_.resize(regions.at());
    // The tokens bound for each rank, in the order it receives them.
    std::vector<std::vector<int>> order(world_);
    for (int r = 0; r < world_; ++r) order[r].resize(h.sent(rank_, r));
    for (int t = 0; t < in.num_tokens; ++t)
      for (int r = 0; r < world_; ++r)
        if (const int pos = lay.position(t, r); pos >= 0) order[r][pos] = t;
    const std::uint64_t data_before = data_signals_;
    const std::uint64_t freed_before = freed_signals_;
    std::vector<bool> came(world_, true);
    for (int i = 0; i < rounds; ++i) {
      // After the first round (when there is one), so that a loss injected
      // here falls between rounds.
      if (i == std::min(1, rounds - 1)) inject(fault::point::mid_dispatch, "dispatch");
      quiet_staging(dl);
      for (int r = 0; i > 0 && r < world_; ++r)
        await_round(wire::signal_kind::window_free, r, freed_before + i, dl,
                    {"dispatch", r, "room in its receive window"});
      for (int r = 0; r < world_; ++r) {
        if (lost_[r]) continue;
        const wire::window_slice slice = wire::slice_of(h.sent(rank_, r), i, window);
        const auto to = link_.direct(r)
                            ? arrays_at<Token>(link_.direct_ptr(r, 0), plan_, false,
                                               static_cast<std::size_t>(rank_) * window, hidden, k)
                            : arrays_at<Token>(local(0), plan_, true,
                                               static_cast<std::size_t>(r) * window, hidden, k);
        for (int j = 0; j < slice.rows; ++j)
          store_row(to, j, in, order[r][slice.first + j], r, per_rank, true);
      }
      if constexpr (via_proxy) {
        const normal_push::row_shape rs{
            hidden * sizeof(Token),
            (token_traits<Token>::has_scales ? hidden / 128 : 0) * sizeof(float), k, 0};
        normal_push::window_rows(route(dl), plan_, world_, rank_, h.count_matrix.data(), i, window,
                                 rs);
      } else {
        end_round(wire::signal_kind::data, data_before + i + 1, dl);
      }
      for (int s = 0; s < world_; ++s) {
        if (!came[s]) continue;  // lost in an earlier round
        came[s] = await_round(wire::signal_kind::data, s, data_before + i + 1, dl,
                              {"dispatch", s, "token rows"});
        const wire::window_slice slice = wire::slice_of(h.sent(s, rank_), i, window);
        if (came[s] && slice.rows > 0)  // else the result may have no memory at all
          copy_rows(arrays_at<Token>(received_.data(), received_plan_, false,
                                     h.recv_offset(s, rank_) + slice.first, hidden, k),
                    arrays_at<Token>(local(0), plan_, false, static_cast<std::size_t>(s) * window,
                                     hidden, k),
                    slice.rows, hidden, k);
        if (i + 1 < rounds) free_window(s, dl);
      }
    }
    data_signals_ += rounds;
    freed_signals_ += rounds - 1;
    return came;
  }

  // Tells `peer` that its rows of this round are out of this rank's window.
  // Never after a call's last round: the next call's first round (notify,
  // or combine readiness), which this rank posts only once it has copied
  // them out, comes before any peer writes a window again. Nothing would
  // wait for that signal, and over an RMA transport a signal nobody waits
  // for may stay incomplete in this rank's proxy (the peer need not
  // progress), failing the call's final quiet.
  void free_window(int peer, const deadline& dl) {
    if (lost_[peer]) return;
    link_.signal(producer_channel, peer, slot(wire::signal_kind::window_free, rank_), dl);
  }

  // `rows_came[s]`: source s's rows all arrived; where a lost member's did
  // not, its rows are left as padding (mask_lost_ranks).
  template <class Token>
  void fill_result(dispatch_result<Token>& res, const dispatch_input<Token>& in,
                   const dispatch_options& opt, const std::vector<peer_notify>& peers,
                   const std::vector<bool>& rows_came) {
    const int n = res.handle.num_recv_tokens;
    const int rows = opt.worst_case_recv_tokens > 0 ? opt.worst_case_recv_tokens : n;
    const std::size_t hidden = in.hidden;
    const std::size_t k = in.topk;
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    // In windows, the rows went on to host memory laid out alike.
    std::byte* base = windowed() ? received_.data() : local(0);
    const wire::region_plan& at = windowed() ? received_plan_ : plan_;
    auto* idx = reinterpret_cast<std::int64_t*>(base + at.recv_topk_idx);
    auto* weights = reinterpret_cast<float*>(base + at.recv_weights);
    auto* src = reinterpret_cast<std::int32_t*>(base + at.recv_src_idx);
    // Padding rows must read as "routed nowhere" for callers that loop over
    // the bound rather than the count.
    std::fill(idx + n * k, idx + rows * k, -1);
    std::fill(weights + n * k, weights + rows * k, 0.0f);
    std::fill(src + n, src + rows, -1);
    for (int s = 0; s < world_; ++s) {
      if (rows_came[s]) continue;
      const std::size_t first = res.handle.recv_offset(s, rank_);
      const std::size_t end = first + res.handle.sent(s, rank_);
      std::fill(idx + first * k, idx + end * k, -1);
      std::fill(weights + first * k, weights + end * k, 0.0f);
      std::fill(src + first, src + end, -1);
    }
    res.num_recv_tokens = n;
    res.recv_x = {reinterpret_cast<const Token*>(base + at.recv_x), rows * hidden};
    if (nscales != 0)
      res.recv_x_scales = {reinterpret_cast<const float*>(base + at.recv_scales), rows * nscales};
    res.recv_topk_idx = {idx, rows * k};
    res.recv_topk_weights = {weights, rows * k};
    res.recv_src_idx = {src, static_cast<std::size_t>(rows)};
    res.num_recv_tokens_per_expert.assign(cap_.num_experts / world_, 0);
    for (int s = 0; s < world_; ++s)
      if (rows_came[s])
        for (std::size_t e = 0; e < peers[s].tokens_per_local_expert.size(); ++e)
          res.num_recv_tokens_per_expert[e] += peers[s].tokens_per_local_expert[e];
    for (int& n : res.num_recv_tokens_per_expert) n = aligned_expert_count(n, opt.expert_alignment);
  }

  void post_combine_status(const wire::combine_header& hdr, const deadline& dl) {
    quiet_staging(dl);
    if constexpr (via_proxy) {
      std::memcpy(local(plan_.send_combine_status), &hdr, sizeof hdr);
      normal_push::combine_status(route(dl), plan_, world_, rank_, sizeof hdr);
    } else {
      const std::size_t there = plan_.combine_status + rank_ * plan_.combine_status_slot_bytes;
      for (int p = 0; p < world_; ++p)
        if (!lost_[p]) std::memcpy(link_.peer(p, there), &hdr, sizeof hdr);
      end_round(wire::signal_kind::combine_ready, hdr.epoch, dl);
    }
  }

  // Every member's combine status, once all agree that the call goes ahead;
  // a rank outside `members` counts as an ok one that left nothing in place.
  std::vector<wire::combine_header> check_combine_status(std::uint64_t epoch,
                                                         const std::vector<bool>& members) {
    const std::byte* base = local(plan_.combine_status);
    std::vector<wire::combine_header> all(world_);
    for (int s = 0; s < world_; ++s)
      if (members[s])
        std::memcpy(&all[s], base + s * plan_.combine_status_slot_bytes,
                    sizeof(wire::combine_header));
    judge_combine_status(rank_, epoch, all, members);
    return all;
  }

  // dispatch_send_buffer's tokens.
  // With a window there is no send_tokens region: the rows are staged.
  template <class Token>
  Token* dispatch_send_area() {
    if (via_proxy && !windowed())
      return reinterpret_cast<Token*>(local(plan_.send_tokens));
    else
      return reinterpret_cast<Token*>(send_tokens_.data());
  }

  // combine_send_buffer's rows without a window: the in-place region, or
  // the RMA staging area.
  template <class Out>
  Out* combine_y() {
    return reinterpret_cast<Out*>(local(via_proxy ? plan_.send_combine_x : plan_.combine_y));
  }

  // y is exactly the span combine_send_buffer(h) gives.
  template <class Out>
  bool left_in_place(const combine_input<Out>& in, const dispatch_handle& h) {
    return h.hidden >= 1 && h.num_recv_tokens >= 0 && in.y.data() == combine_y<Out>() &&
           in.y.size() == static_cast<std::size_t>(h.num_recv_tokens) * h.hidden;
  }

  // Rows left in place are read by the sources during their reduce: each
  // source then tells every such rank, which returns only once all have, so
  // that the caller cannot overwrite rows a slower source still reads.
  void release_in_place_rows(const std::vector<wire::combine_header>& status, bool in_place,
                             const deadline& dl) {
    guarded([&] {
      for (int r = 0; r < world_; ++r)
        if (status[r].in_place && !lost_[r])
          link_.signal(producer_channel, r, slot(wire::signal_kind::combine_read, rank_), dl);
      if (!in_place) return;
      ++in_place_combines_;
      // A lost source reads nothing any more.
      for (int s = 0; s < world_; ++s)
        await_round(wire::signal_kind::combine_read, s, in_place_combines_, dl,
                    {"combine", s, "the end of its reads of the rows left in place"});
    });
  }

  // Sends y's rows back to their sources, unless this rank left them in
  // place; the weights always go.
  template <class Out>
  void return_rows(const combine_input<Out>& in, const dispatch_handle& h, bool in_place,
                   std::uint64_t epoch, const deadline& dl) {
    const std::size_t hidden = h.hidden;
    const std::size_t k = h.topk;
    const bool weights = in.topk_weights.has_value();
    for (int s = 0; s < world_; ++s) {
      const std::size_t n = h.sent(s, rank_);
      if (n != 0 && !lost_[s]) {
        const std::size_t from = h.recv_offset(s, rank_);
        const std::size_t to = h.return_offset(s, rank_);
        if (!in_place)
          std::memcpy(peer_array<Out>(s, plan_.combine_x) + to * hidden,
                      in.y.data() + from * hidden, n * hidden * sizeof(Out));
        if (weights)
          std::memcpy(peer_array<float>(s, plan_.combine_weights) + to * k,
                      in.topk_weights->data() + from * k, n * k * sizeof(float));
      }
    }
    end_round(wire::signal_kind::combine_data, epoch, dl);
  }

  // RMA path of return_rows: y's rows, in receive order, are staged once
  // (unless the experts wrote them there, through combine_send_buffer);
  // each source gets its block back with one put per array, the last one
  // carrying the combine-data signal.
  template <class Out>
  void put_combine_rows(const combine_input<Out>& in, const dispatch_handle& h, bool in_place,
                        const deadline& dl) {
    quiet_staging(dl);
    const std::size_t hidden = h.hidden;
    const std::size_t k = h.topk;
    const std::size_t rows = h.num_recv_tokens;
    const bool weights = in.topk_weights.has_value();
    std::byte* base = local(0);
    if (rows != 0) {
      if (!in_place)
        std::memcpy(base + plan_.send_combine_x, in.y.data(), rows * hidden * sizeof(Out));
      if (weights)
        std::memcpy(base + plan_.send_combine_weights, in.topk_weights->data(),
                    rows * k * sizeof(float));
    }
    // This rank's own rows stay in the staging area, where reduce reads
    // them; its weights go to their final rows, as another rank's would.
    const std::size_t own = h.sent(rank_, rank_);
    if (weights && own != 0)
      std::memcpy(local(plan_.combine_weights) + h.return_offset(rank_, rank_) * k * sizeof(float),
                  in.topk_weights->data() + h.recv_offset(rank_, rank_) * k,
                  own * k * sizeof(float));
    const normal_push::row_shape rs{0, 0, k, hidden * sizeof(Out)};
    normal_push::combine_rows(route(dl), plan_, world_, rank_, h.count_matrix.data(), rs, weights,
                              true);
  }

  // A combine in windows, the dispatch's rounds in reverse: each round,
  // this rank's slice of the rows every source sent it into that source's
  // combine window for it (once emptied of the last round), then every
  // rank's slice of this rank's rows out of its windows into host memory
  // (returned_, laid out as the combine regions), freeing the windows.
  // Returns whether each rank's rows all came back (see rows_in_rounds).
  template <class Out>
  std::vector<bool> return_rows_in_rounds(const combine_input<Out>& in, const dispatch_handle& h,
                                          const deadline& dl) {
    const std::size_t row = h.hidden * sizeof(Out);
    const std::size_t wrow = h.topk * sizeof(float);
    const int window = cap_.window_rows;
    const int rounds = wire::window_rounds(h.count_matrix.data(), world_, window);
    const bool weights = in.topk_weights.has_value();
    const std::size_t back = h.return_offset(rank_, world_);  // rows coming back to this rank
    wire::carver regions;
    returned_plan_.combine_x = regions.take(back * row);
    returned_plan_.combine_weights = regions.take(back * wrow);
    returned_.resize(regions.at());
    const auto* y = reinterpret_cast<const std::byte*>(in.y.data());
    const auto* yw =
        weights ? reinterpret_cast<const std::byte*>(in.topk_weights->data()) : nullptr;
    const std::uint64_t done_before = combine_signals_;
    const std::uint64_t freed_before = freed_signals_;
    std::vector<bool> came(world_, true);
    for (int i = 0; i < rounds; ++i) {
      if (i == std::min(1, rounds - 1)) inject(fault::point::mid_combine, "combine");
      quiet_staging(dl);
      for (int s = 0; i > 0 && s < world_; ++s)
        await_round(wire::signal_kind::window_free, s, freed_before + i, dl,
                    {"combine", s, "room in its combine window"});
      for (int s = 0; s < world_; ++s) {
        const wire::window_slice slice = wire::slice_of(h.sent(s, rank_), i, window);
        if (slice.rows == 0 || lost_[s]) continue;  // y may be empty, without memory
        const std::size_t from = h.recv_offset(s, rank_) + slice.first;
        const bool direct = link_.direct(s);
        const std::size_t to = static_cast<std::size_t>(direct ? rank_ : s) * window;
        std::memcpy(direct ? link_.direct_ptr(s, plan_.combine_x) + to * row
                           : local(plan_.send_combine_x) + to * row,
                    y + from * row, slice.rows * row);
        if (weights)
          std::memcpy(direct ? link_.direct_ptr(s, plan_.combine_weights) + to * wrow
                             : local(plan_.send_combine_weights) + to * wrow,
                      yw + from * wrow, slice.rows * wrow);
      }
      if constexpr (via_proxy)
        normal_push::window_combine_rows(route(dl), plan_, world_, rank_, h.count_matrix.data(), i,
                                         window, {0, 0, wrow / sizeof(float), row}, weights);
      else
        end_round(wire::signal_kind::combine_data, done_before + i + 1, dl);
      for (int r = 0; r < world_; ++r) {
        if (!came[r]) continue;  // lost in an earlier round
        came[r] = await_round(wire::signal_kind::combine_data, r, done_before + i + 1, dl,
                              {"combine", r, "combined rows"});
        const wire::window_slice slice = wire::slice_of(h.sent(rank_, r), i, window);
        const std::size_t to = h.return_offset(rank_, r) + slice.first;
        const std::size_t from = static_cast<std::size_t>(r) * window;
        if (came[r] && slice.rows > 0) {  // else returned_ may have no memory at all
          std::memcpy(returned_.data() + returned_plan_.combine_x + to * row,
                      local(plan_.combine_x) + from * row, slice.rows * row);
          if (weights)
            std::memcpy(returned_.data() + returned_plan_.combine_weights + to * wrow,
                        local(plan_.combine_weights) + from * wrow, slice.rows * wrow);
        }
        if (i + 1 < rounds) free_window(r, dl);
      }
    }
    combine_signals_ += rounds;
    freed_signals_ += rounds - 1;
    return came;
  }

  // Token t's row from rank r: in this rank's combine region, where r
  // returned it, or where r left it in place; over RMA this rank's own rows
  // are read in its staging area, where put_combine_rows left them. Rows of
  // a rank that did not return them (`returned`: lost) are left out and
  // counted.
  template <class Out>
  void reduce(const combine_input<Out>& in, const dispatch_handle& h,
              const std::vector<wire::combine_header>& status, const std::vector<bool>& returned,
              std::span<Out> out_x, std::span<float> out_weights) {
    const std::size_t hidden = h.hidden;
    const std::size_t k = h.topk;
    // In windows, the rows went on to host memory laid out alike.
    const std::byte* base = windowed() ? returned_.data() : local(0);
    const wire::region_plan& at = windowed() ? returned_plan_ : plan_;
    const auto* wrows = reinterpret_cast<const float*>(base + at.combine_weights);
    std::vector<int> first(world_);
    std::vector<const Out*> rows(world_);
    for (int r = 0; r < world_; ++r) {
      first[r] = h.return_offset(rank_, r);
      rows[r] = reinterpret_cast<const Out*>(base + at.combine_x) + first[r] * hidden;
      if (windowed()) continue;
      if constexpr (via_proxy) {
        if (r == rank_)
          rows[r] = reinterpret_cast<const Out*>(base + plan_.send_combine_x) +
                    static_cast<std::size_t>(h.recv_offset(rank_, r)) * hidden;
      } else if (status[r].in_place) {
        rows[r] = reinterpret_cast<const Out*>(link_.peer(r, plan_.combine_y)) +
                  static_cast<std::size_t>(h.recv_offset(rank_, r)) * hidden;
      }
    }
    reduce_tokens<Out>(h.num_tokens, hidden, k, in.bias_0, in.bias_1, out_x, out_weights,
                       [&](int t, auto&& add) {
                         for (int r = 0; r < world_; ++r) {
                           const int pos = h.send_pos[static_cast<std::size_t>(t) * world_ + r];
                           if (pos < 0) continue;
                           if (!returned[r]) {
                             ++stats_.masked_contributions;
                             continue;
                           }
                           add(rows[r] + static_cast<std::size_t>(pos) * hidden,
                               wrows + static_cast<std::size_t>(first[r] + pos) * k);
                         }
                       });
  }

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  wire::capacity cap_;
  wire::region_plan plan_;
  host_link<Transport> link_;
  bool mask_lost_ranks_;
  std::vector<bool> lost_;  // peers found gone (mask_lost_ranks); never cleared
  std::uint64_t dispatch_epoch_ = 0;
  std::uint64_t combine_epoch_ = 0;
  // Signals each peer has sent this rank so far, of kinds data, combine_data
  // and window_free: one data and combine_data per call (their counts equal
  // the epochs), or one per round of a call in windows. All ranks run the
  // same rounds, so one count serves every peer.
  std::uint64_t data_signals_ = 0;
  std::uint64_t combine_signals_ = 0;
  std::uint64_t freed_signals_ = 0;
  std::uint64_t in_place_combines_ = 0;  // combines whose rows this rank left in place
  call_guard guard_;
  buffer_stats stats_{std::vector<std::chrono::nanoseconds>(world_)};
  // dispatch_send_buffer over a peer-mapped transport or with a window:
  // floats, so that any token type is aligned in it.
  std::vector<float> send_tokens_;
  // With a window: where the rows of the last dispatch and combine went on
  // from the windows (laid out by these plans' recv_* and combine_*
  // offsets), and combine_send_buffer's rows.
  std::vector<std::byte> received_;
  wire::region_plan received_plan_{};
  std::vector<std::byte> returned_;
  wire::region_plan returned_plan_{};
  std::vector<float> send_y_;
  call_queue calls_;  // last: destroyed first (normal/async_calls.hpp)
};

}  // namespace epcomm
