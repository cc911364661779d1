// epcomm::hierarchical_buffer: normal-mode dispatch and combine over several
// nodes, templated on two transports and the token types it serves (one
// set of regions for all, as the flat buffer: see normal/buffer.hpp). Ranks form nodes of
// L consecutive ranks (the bootstrap's local_world_size); a rank's node is
// served by Intra (peer-mapped, the host engine storing through peer_ptr:
// shm) and its rail, the ranks with its local index on every node, by Inter
// (a fabric, through the proxy, or a peer-mapped transport where the rail
// shares memory).
//
// A token crosses the fabric at most once per destination node: to the rank
// of that node with the source's local index (its forwarder), which stores
// it into each of its node's ranks that the token reaches. Combine runs the
// other way: every rank reduces, for each source rank of its rail, the rows
// its node's ranks computed for that source's tokens, and sends one fp32
// partial sum per token back across the fabric; the source adds the partial
// sums of the token's nodes. Results are the flat buffer's (normal/buffer.hpp):
// same dispatch_result, rows ordered by (source rank, source token index),
// same handle, same combine, fp32 accumulation all along the path.
//
// Protocol per call (see docs/transports.md, "Hierarchical path"):
//
//   dispatch  notify: each rank puts its record (status, shape, counts) to
//             its rail, then copies the rail's records to its node, so that
//             every rank holds all R records and all decide identically;
//             data: rows go to forwarders across nodes, then every rank
//             stores its own rows and those it forwards, at the flat
//             buffer's offsets, into its node's ranks.
//   combine   ready: statuses gathered the same way, with the masks a
//             forwarder needs to know which of its node's rows belong to
//             which relayed token; staged: each rank stages y where its node
//             reads it; partial: forwarders reduce and send fp32 sums back.
//
// Every signal is a counter per (kind, source member) that goes up by one per
// call, on both transports, whether the call succeeds or is rejected.
//
// dispatch_async and combine_async queue a call on the buffer's
// communication thread and return a completion (normal/async_calls.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "epcomm/bootstrap/subgroup.hpp"
#include "epcomm/core/call_guard.hpp"
#include "epcomm/core/combine_reduce.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/layout.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/core/topology.hpp"
#include "epcomm/hierarchical/link.hpp"
#include "epcomm/hierarchical/wire.hpp"
#include "epcomm/host/call_queue.hpp"
#include "epcomm/host/fault_injection.hpp"
#include "epcomm/normal/arguments.hpp"
#include "epcomm/normal/async_calls.hpp"
#include "epcomm/normal/call_headers.hpp"
#include "epcomm/normal/call_overloads.hpp"
#include "epcomm/normal/capacity_agreement.hpp"
#include "epcomm/normal/input_checks.hpp"
#include "epcomm/normal/verdict.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm {

// What a rank moved through each transport since its buffer was built; take
// differences around a call to see that call's traffic.
struct hierarchical_traffic {
  group_traffic intra;  // by local index of the node's rank stored into or read from
  group_traffic inter;  // by node index of the rail's rank sent to
};

template <class Intra, class Inter, token_type... Tokens>
requires(sizeof...(Tokens) >= 1) && peer_mapped_transport<Intra> &&
    (peer_mapped_transport<Inter> || has_completion_count<Inter>)class hierarchical_buffer
    : public async_calls<hierarchical_buffer<Intra, Inter, Tokens...>, Tokens...>,
    public call_overloads<hierarchical_buffer<Intra, Inter, Tokens...>, Tokens...> {
  friend class async_calls<hierarchical_buffer, Tokens...>;  // queues on calls_
  static constexpr bool inter_mapped = peer_mapped_transport<Inter>;
  using node_signal = wire::hier::node_signal;
  using rail_signal = wire::hier::rail_signal;
  using kind = detail::traffic_kind;

 public:
  // What a call in braces means when not told a type.
  using typename call_overloads<hierarchical_buffer, Tokens...>::first_token;
  using typename call_overloads<hierarchical_buffer, Tokens...>::first_combine;
  using call_overloads<hierarchical_buffer, Tokens...>::dispatch;
  using call_overloads<hierarchical_buffer, Tokens...>::combine;

  // Collective: every rank of `boot` constructs its buffer with the same
  // config. Nodes are the bootstrap's local groups, which must be equally
  // large and made of consecutive ranks.
  template <bootstrap B>
  requires transport_for<Intra, subgroup_bootstrap<B>> &&
      transport_for<Inter, subgroup_bootstrap<B>>
      hierarchical_buffer(B& boot, const buffer_config& cfg)
      : rank_(boot.rank()),
        world_(boot.world_size()),
        timeout_(effective_timeout(cfg.timeout)),
        cap_(agree_capacity<Tokens...>(boot, cfg, setup_timeout_of(cfg))),
        per_node_(agreed_node_size(boot, setup_timeout_of(cfg))),
        nodes_(world_ / per_node_),
        node_(rank_ / per_node_),
        local_(rank_ % per_node_),
        node_plan_(wire::hier::plan_node(cap_, nodes_)),
        rail_plan_(wire::hier::plan_rail(cap_, nodes_, per_node_, !inter_mapped)),
        intra_(boot, node_, "node", "node " + std::to_string(node_), node_members(),
               subgroup_locality::parent_nodes, node_plan_.total,
               wire::hier::signal_slots<node_signal>(per_node_),
               deadline::after(setup_timeout_of(cfg))),
        // A peer-mapped rail must map every member, so its group declares one node.
        inter_(boot, local_, "rail", "rail " + std::to_string(local_), rail_members(),
               inter_mapped ? subgroup_locality::one_node : subgroup_locality::parent_nodes,
               rail_plan_.total, wire::hier::signal_slots<rail_signal>(nodes_),
               deadline::after(setup_timeout_of(cfg))) {
    for (int i = 0; i < per_node_; ++i)
      if (!intra_.transport().is_peer_mapped(i))
        throw error(rank_, "hierarchical buffer", intra_.world_rank(i),
                    "that rank of this node is not peer-mapped from here");
    if constexpr (inter_mapped) {
      for (int m = 0; m < nodes_; ++m)
        if (!inter_.transport().is_peer_mapped(m))
          throw error(rank_, "hierarchical buffer", inter_.world_rank(m),
                      "that rank of this rail is not peer-mapped from here; a peer-mapped inter "
                      "transport needs the whole rail in one memory domain");
    }
  }

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int ranks_per_node() const { return per_node_; }
  int num_nodes() const { return nodes_; }
  const wire::capacity& capacity() const { return cap_; }
  Intra& intra_transport() { return intra_.transport(); }
  Inter& inter_transport() { return inter_.transport(); }
  hierarchical_traffic traffic() const { return {intra_.traffic(), inter_.traffic()}; }

  template <one_of<Tokens...> Token>
  dispatch_result<Token> dispatch(const dispatch_input<Token>& in,
                                  const dispatch_options& opt = {}) {
    const call_start call = start_call("dispatch", dispatch_epoch_);
    const std::string cause = check_dispatch_input(in, opt, cap_);
    const topology topo{world_, per_node_, cap_.num_experts, in.hidden, in.topk};
    const layout lay = cause.empty() ? make_layout(topo, in.topk_idx, in.num_tokens) : layout{};
    const auto reach =
        cause.empty()
            ? reach_by_node(in.num_tokens, [&](int t, int d) { return lay.in_rank(t, d); })
            : std::vector<node_tokens>(nodes_);

    wire::notify_header hdr = notify_header_of<Token>(cause, call.epoch, in.num_tokens, in.hidden,
                                                      in.topk, cap_.num_experts);
    hdr.recv_bound = opt.worst_case_recv_tokens;
    guarded([&] {
      inject(fault::point::before_notify, "dispatch");
      gather_notify(hdr, lay.tokens_per_rank, reach, lay.tokens_per_expert, call.epoch, call.dl);
    });
    const auto records = read_notify();
    settle_on_failure([&] { judge_notify(rank_, call.epoch, cap_.max_recv_tokens, records); },
                      node_signal::data, rail_signal::data, call, "dispatch");

    dispatch_result<Token> res;
    res.handle = make_dispatch_handle({world_, rank_, in.num_tokens, in.hidden, in.topk},
                                      call.epoch, records, lay.send_pos);
    move_rows(in, reach, records, res.handle, call.epoch, call.dl);
    fill_result(res, in, opt, records);
    return res;
  }

  // DeepEP's dispatch(handle=...) across nodes: the flat buffer's cached
  // dispatch (normal/buffer.hpp), with its results. No layout: every rank's
  // record carries the handle's counts and the header the routing
  // fingerprint every rank must share; a relayed row carries, instead of its
  // top-k ids and weights, the mask of the forwarder's node ranks it reaches
  // (taken from the handle's send positions).
  template <one_of<Tokens...> Token>
  dispatch_result<Token> dispatch(const cached_dispatch_input<Token>& in,
                                  const dispatch_handle& h) {
    const call_start call = start_call("dispatch", dispatch_epoch_);
    const std::string cause = check_cached_dispatch_input(in, h, rank_, cap_);
    const bool ok = cause.empty();
    // A rejected handle may be malformed: nothing is read from it.
    const dispatch_input<Token> rows =
        ok ? dispatch_input<Token>{h.num_tokens, h.hidden, 0, in.x, in.x_scales, {}, {}}
           : dispatch_input<Token>{};
    std::vector<int> per_rank(world_, 0);
    std::vector<node_tokens> reach(nodes_);
    const wire::notify_header hdr =
        cached_notify_header_of<Token>(cause, call.epoch, cap_.num_experts, h);
    if (ok) {
      for (int r = 0; r < world_; ++r) per_rank[r] = h.sent(rank_, r);
      reach = reach_of(h);
    }
    guarded([&] {
      inject(fault::point::before_notify, "dispatch");
      gather_notify(hdr, per_rank, reach, {}, call.epoch, call.dl);
    });
    const auto records = read_notify();
    settle_on_failure([&] { judge_notify(rank_, call.epoch, cap_.max_recv_tokens, records); },
                      node_signal::data, rail_signal::data, call, "dispatch");

    dispatch_result<Token> res;
    res.handle = h;
    move_rows(rows, reach, records, h, call.epoch, call.dl);
    fill_result(res, rows, {}, records);
    res.num_recv_tokens_per_expert.clear();
    return res;
  }

  // Writes out_x[T][H] (and out_weights[T][K] when in.topk_weights is given)
  // without allocating results. Out is y's element type: any served token's
  // combine type.
  template <one_of<combine_type_t<Tokens>...> Out>
  void combine(const combine_input<Out>& in, const dispatch_handle& h,
               std::type_identity_t<std::span<Out>> out_x, std::span<float> out_weights = {}) {
    const call_start call = start_call("combine", combine_epoch_);
    const std::string cause = check_combine_input<Out>(in, h, out_x, out_weights, rank_, cap_);
    const bool weights = in.topk_weights.has_value();
    std::vector<node_tokens> reach;
    if (cause.empty()) reach = reach_of(h);

    const wire::combine_header hdr = combine_header_of<Out>(cause, call.epoch, weights, h);
    guarded([&] { gather_status(hdr, reach, call.dl); });
    settle_on_failure([&] { check_status(call.epoch); }, node_signal::combine_staged,
                      rail_signal::combine_partial, call, "combine");
    guarded([&] {
      inject(fault::point::mid_combine, "combine");
      stage_y(in, h);
      for (int i = 0; i < per_node_; ++i)
        if (i != local_) intra_.signal(i, node_slot(node_signal::combine_staged, local_), call.dl);
      for (int i = 0; i < per_node_; ++i)
        if (i != local_)
          intra_.wait(node_slot(node_signal::combine_staged, i), call.epoch, call.dl, "combine", i,
                      "rows to reduce");
      reduce_for_rail<Out>(h, reach[node_], weights, call.dl);
      for (int m = 0; m < nodes_; ++m)
        if (m != node_)
          inter_.wait(rail_slot(rail_signal::combine_partial, m), call.epoch, call.dl, "combine", m,
                      "partial sums");
    });
    finish(in, h, reach, out_x, out_weights);
  }

 private:
  // One rank's notify record, as every rank reads it.
  struct record {
    wire::notify_header header;
    std::vector<int> tokens_per_rank;    // [R]
    std::vector<int> tokens_per_node;    // [N]
    std::vector<int> tokens_per_expert;  // [E]
  };

  // This rank's tokens that reach one node, in token order, with the ranks
  // of that node each reaches (bit = local index).
  struct node_tokens {
    std::vector<int> tokens;
    std::vector<std::uint64_t> masks;  // [tokens][mask_words]
  };

  // What a node rank stores for one token row: where its fields are.
  template <class Token>
  struct row_ref {
    const Token* x;
    const float* scales;
    const std::int64_t* topk_idx;  // global expert ids (none in a cached dispatch)
    const float* weights;
    std::int32_t src;
    // The node's ranks the row reaches (bit = local index), or null: then its
    // top-k ids say.
    const std::uint64_t* mask;
  };

  template <bootstrap B>
  static int agreed_node_size(B& boot, std::chrono::milliseconds timeout) {
    struct entry {
      std::int32_t local_rank, local_world_size;
    };
    const entry mine{boot.local_rank(), boot.local_world_size()};
    const auto bytes =
        boot.all_gather(std::as_bytes(std::span(&mine, 1)), deadline::after(timeout));
    std::vector<entry> all(boot.world_size());
    std::memcpy(all.data(), bytes.data(), bytes.size());
    const int per_node = all[0].local_world_size;
    // Every rank judges the same entries, so all throw or none does.
    for (int p = 0; p < boot.world_size(); ++p) {
      if (per_node >= 1 && boot.world_size() % per_node == 0 &&
          all[p].local_world_size == per_node && all[p].local_rank == p % per_node)
        continue;
      throw error(boot.rank(), "hierarchical buffer", p == boot.rank() ? no_peer : p,
                  "nodes must be consecutive ranks, equally many per node: rank " +
                      std::to_string(p) + " says local rank " + std::to_string(all[p].local_rank) +
                      " of " + std::to_string(all[p].local_world_size) + ", rank 0 says nodes of " +
                      std::to_string(per_node) + " in a world of " +
                      std::to_string(boot.world_size()));
    }
    return per_node;
  }

  std::vector<int> node_members() const {
    std::vector<int> m(per_node_);
    for (int i = 0; i < per_node_; ++i) m[i] = node_ * per_node_ + i;
    return m;
  }
  std::vector<int> rail_members() const {
    std::vector<int> m(nodes_);
    for (int n = 0; n < nodes_; ++n) m[n] = n * per_node_ + local_;
    return m;
  }

  std::size_t node_slot(node_signal k, int source) const {
    return wire::hier::signal_slot(k, source, per_node_);
  }
  std::size_t rail_slot(rail_signal k, int source) const {
    return wire::hier::signal_slot(k, source, nodes_);
  }

  // A synchronous call runs after the asynchronous ones queued before it.
  call_start start_call(const char* op, std::uint64_t& epochs) {
    calls_.drain();
    return guard_.start(rank_, op, false, epochs, timeout_);
  }

  void inject(fault::point at, const char* op) {
    fault::inject(at, rank_, op, [&] { abort_links(no_peer); });
  }

  void abort_links(int culprit) {
    intra_.abort(culprit);
    inter_.abort(culprit);
  }

  // See core/call_guard.hpp: a failed call breaks the buffer and gives up on both
  // groups.
  template <class F>
  void guarded(F&& f) {
    guard_.run(std::forward<F>(f), [this](int culprit) { abort_links(culprit); });
  }

  // A call every rank agreed to reject (check() throws) still completes its
  // final round on both transports, node_round and rail_round with no
  // payload, before throwing (see call_guard::settle).
  template <class Check>
  void settle_on_failure(Check&& check, node_signal node_round, rail_signal rail_round,
                         const call_start& call, const char* op) {
    guard_.settle(
        std::forward<Check>(check),
        [&] {
          for (int m = 0; m < nodes_; ++m)
            if (m != node_) inter_.signal(m, rail_slot(rail_round, node_), call.dl);
          for (int i = 0; i < per_node_; ++i)
            if (i != local_) intra_.signal(i, node_slot(node_round, local_), call.dl);
          for (int m = 0; m < nodes_; ++m)
            if (m != node_)
              inter_.wait(rail_slot(rail_round, m), call.epoch, call.dl, op, m,
                          "agreement to reject the call");
          for (int i = 0; i < per_node_; ++i)
            if (i != local_)
              intra_.wait(node_slot(node_round, i), call.epoch, call.dl, op, i,
                          "agreement to reject the call");
        },
        [this](int culprit) { abort_links(culprit); });
  }

  // ---- dispatch ----------------------------------------------------------

  // For every node, the tokens (of num_tokens) that reach any of its ranks
  // and which of its ranks each reaches; reaches(t, d): token t goes to
  // world rank d.
  template <class Reaches>
  std::vector<node_tokens> reach_by_node(int num_tokens, Reaches&& reaches) const {
    const int words = wire::hier::mask_words(per_node_);
    std::vector<node_tokens> out(nodes_);
    std::vector<std::uint64_t> mask(words);
    for (int t = 0; t < num_tokens; ++t) {
      for (int m = 0; m < nodes_; ++m) {
        std::fill(mask.begin(), mask.end(), 0);
        bool any = false;
        for (int i = 0; i < per_node_; ++i) {
          if (!reaches(t, m * per_node_ + i)) continue;
          mask[i / 64] |= std::uint64_t{1} << (i % 64);
          any = true;
        }
        if (!any) continue;
        out[m].tokens.push_back(t);
        out[m].masks.insert(out[m].masks.end(), mask.begin(), mask.end());
      }
    }
    return out;
  }

  std::size_t record_bytes() const { return wire::hier::notify_record_bytes(cap_, nodes_); }

  // Hop 1 puts this rank's record to every rank of its rail; hop 2 copies
  // the rail's N records to every rank of the node. Then every rank holds
  // every rank's record, in its node buffer's slot for that rank.
  // The record holds `hdr` and, when it accepts the call, this rank's counts:
  // per_rank [R], the sizes of `reach`, per_expert [E] (empty: zeros).
  void gather_notify(const wire::notify_header& hdr, std::span<const int> per_rank,
                     const std::vector<node_tokens>& reach, std::span<const int> per_expert,
                     std::uint64_t epoch, const deadline& dl) {
    inter_.quiet(dl);
    const std::size_t slot_bytes = rail_plan_.notify_slot_bytes;
    const std::size_t there = rail_plan_.notify + node_ * slot_bytes;
    std::byte* mine = inter_.local(there);  // what hop 2 copies for this rank
    write_record(mine, hdr, per_rank, reach, per_expert);
    const std::size_t bytes = record_bytes();
    if constexpr (!inter_mapped) std::memcpy(inter_.local(rail_plan_.send_notify), mine, bytes);
    for (int m = 0; m < nodes_; ++m) {
      if (m == node_) continue;
      if constexpr (inter_mapped) std::memcpy(inter_.outgoing(m, there, 0), mine, bytes);
      inter_.send_signal(m, rail_plan_.send_notify, there, bytes,
                         rail_slot(rail_signal::notify, node_), kind::control, dl);
    }
    for (int m = 0; m < nodes_; ++m)
      if (m != node_)
        inter_.wait(rail_slot(rail_signal::notify, m), epoch, dl, "dispatch", m, "notify record");

    for (int m = 0; m < nodes_; ++m) {
      const std::byte* from = inter_.local(rail_plan_.notify + m * slot_bytes);
      const std::size_t to =
          node_plan_.notify + (m * per_node_ + local_) * node_plan_.notify_slot_bytes;
      std::memcpy(intra_.local(to), from, bytes);
      for (int i = 0; i < per_node_; ++i) {
        if (i == local_) continue;
        std::memcpy(intra_.peer(i, to), from, bytes);
        intra_.count(i, bytes, kind::control);
      }
    }
    for (int i = 0; i < per_node_; ++i)
      if (i != local_) intra_.signal(i, node_slot(node_signal::notify, local_), dl);
    for (int i = 0; i < per_node_; ++i)
      if (i != local_)
        intra_.wait(node_slot(node_signal::notify, i), epoch, dl, "dispatch", i, "notify records");
  }

  void write_record(std::byte* at, const wire::notify_header& hdr, std::span<const int> per_rank,
                    const std::vector<node_tokens>& reach, std::span<const int> per_expert) const {
    std::memcpy(at, &hdr, sizeof hdr);
    auto* counts = reinterpret_cast<std::int32_t*>(at + sizeof hdr);
    std::fill_n(counts, world_ + nodes_ + cap_.num_experts, 0);
    if (hdr.state != wire::status::ok) return;
    std::copy(per_rank.begin(), per_rank.end(), counts);
    for (int m = 0; m < nodes_; ++m) counts[world_ + m] = static_cast<int>(reach[m].tokens.size());
    std::copy(per_expert.begin(), per_expert.end(), counts + world_ + nodes_);
  }

  std::vector<record> read_notify() {
    std::vector<record> all(world_);
    for (int s = 0; s < world_; ++s) {
      const std::byte* at = intra_.local(node_plan_.notify + s * node_plan_.notify_slot_bytes);
      std::memcpy(&all[s].header, at, sizeof(wire::notify_header));
      const auto* counts = reinterpret_cast<const std::int32_t*>(at + sizeof(wire::notify_header));
      all[s].tokens_per_rank.assign(counts, counts + world_);
      all[s].tokens_per_node.assign(counts + world_, counts + world_ + nodes_);
      all[s].tokens_per_expert.assign(counts + world_ + nodes_,
                                      counts + world_ + nodes_ + cap_.num_experts);
    }
    return all;
  }

  // The data round of a dispatch: rows relayed across nodes, then every rank
  // stores its own rows and those relayed to it into its node's ranks.
  // in.topk 0 is a dispatch from a cached handle (rows and masks only).
  template <class Token>
  void move_rows(const dispatch_input<Token>& in, const std::vector<node_tokens>& reach,
                 const std::vector<record>& records, const dispatch_handle& h, std::uint64_t epoch,
                 const deadline& dl) {
    guarded([&] {
      inject(fault::point::mid_dispatch, "dispatch");
      relay_rows(in, reach, dl);
      store_rows<Token>(rank_, static_cast<int>(reach[node_].tokens.size()),
                        own_rows(in, reach[node_]), in.topk, h);
      for (int m = 0; m < nodes_; ++m)
        if (m != node_)
          inter_.wait(rail_slot(rail_signal::data, m), epoch, dl, "dispatch", m,
                      "relayed token rows");
      for (int m = 0; m < nodes_; ++m) {
        if (m == node_) continue;
        const int source = m * per_node_ + local_;
        store_rows<Token>(source, records[source].tokens_per_node[node_], relayed_rows(m, in),
                          in.topk, h);
      }
      for (int i = 0; i < per_node_; ++i)
        if (i != local_) intra_.signal(i, node_slot(node_signal::data, local_), dl);
      for (int i = 0; i < per_node_; ++i)
        if (i != local_)
          intra_.wait(node_slot(node_signal::data, i), epoch, dl, "dispatch", i, "token rows");
    });
  }

  // Bytes per relayed row of the ids field: top-k ids, or at topk 0 (a cached
  // dispatch) the row's reach mask (wire::hier::plan_rail sizes it for both).
  std::size_t relayed_ids_bytes(std::size_t topk) const {
    return (topk != 0 ? topk : wire::hier::mask_words(per_node_)) * sizeof(std::uint64_t);
  }

  // Every token of this rank that reaches another node goes once to that
  // node's rank of this rail, into the block of this rank's node: the
  // token, scales, global ids, weights (or, at topk 0, the mask of the
  // node's ranks it reaches) and source index (the forwarder rewrites ids
  // per final rank). Each destination gets one transfer per array, the last
  // carrying the data signal, or the signal alone.
  template <class Token>
  void relay_rows(const dispatch_input<Token>& in, const std::vector<node_tokens>& reach,
                  const deadline& dl) {
    inter_.quiet(dl);
    const std::size_t hidden = in.hidden;
    const std::size_t k = in.topk;
    const std::size_t words = wire::hier::mask_words(per_node_);
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    const std::size_t block = static_cast<std::size_t>(node_) * cap_.max_tokens_per_rank;
    const std::size_t signal = rail_slot(rail_signal::data, node_);
    std::size_t first = 0;  // staged rows of earlier destinations
    for (int m = 0; m < nodes_; ++m) {
      if (m == node_) continue;
      const std::vector<int>& tokens = reach[m].tokens;
      if (tokens.empty()) {
        inter_.signal(m, signal, dl);
        continue;
      }
      struct array {
        std::size_t remote, staged, row;
      };
      const array arrays[] = {
          {rail_plan_.relay.x, rail_plan_.send_relay.x, hidden * sizeof(Token)},
          {rail_plan_.relay.scales, rail_plan_.send_relay.scales, nscales * sizeof(float)},
          {rail_plan_.relay.topk_idx, rail_plan_.send_relay.topk_idx, relayed_ids_bytes(k)},
          {rail_plan_.relay.weights, rail_plan_.send_relay.weights, k * sizeof(float)},
          {rail_plan_.relay.src_idx, rail_plan_.send_relay.src_idx, sizeof(std::int32_t)}};
      auto at = [&](const array& a) {
        return inter_.outgoing(m, a.remote + block * a.row, a.staged + first * a.row);
      };
      auto* x = reinterpret_cast<Token*>(at(arrays[0]));
      auto* scales = reinterpret_cast<float*>(at(arrays[1]));
      auto* ids = reinterpret_cast<std::uint64_t*>(at(arrays[2]));
      auto* weights = reinterpret_cast<float*>(at(arrays[3]));
      auto* src = reinterpret_cast<std::int32_t*>(at(arrays[4]));
      for (std::size_t r = 0; r < tokens.size(); ++r) {
        const std::size_t t = tokens[r];
        std::memcpy(x + r * hidden, in.x.data() + t * hidden, hidden * sizeof(Token));
        if (nscales != 0)
          std::memcpy(scales + r * nscales, in.x_scales.data() + t * nscales,
                      nscales * sizeof(float));
        if (k != 0) {
          std::memcpy(ids + r * k, in.topk_idx.data() + t * k, k * sizeof(std::int64_t));
          std::memcpy(weights + r * k, in.topk_weights.data() + t * k, k * sizeof(float));
        } else {
          std::copy_n(reach[m].masks.begin() + r * words, words, ids + r * words);
        }
        src[r] = static_cast<std::int32_t>(t);
      }
      const std::size_t n = tokens.size();
      for (const array& a : arrays) {
        if (a.row == 0) continue;
        const std::size_t local = a.staged + first * a.row, remote = a.remote + block * a.row;
        if (&a == &arrays[4])
          inter_.send_signal(m, local, remote, n * a.row, signal, kind::payload, dl);
        else
          inter_.send(m, local, remote, n * a.row, kind::payload, dl);
      }
      first += n;
    }
  }

  // This rank's own tokens that reach its node, as rows to store.
  template <class Token>
  auto own_rows(const dispatch_input<Token>& in, const node_tokens& here) const {
    const std::size_t hidden = in.hidden, k = in.topk;
    const std::size_t words = wire::hier::mask_words(per_node_);
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    return [&in, &here, hidden, k, words, nscales](int r) {
      const std::size_t i = here.tokens[r];
      return row_ref<Token>{
          in.x.data() + i * hidden,     nscales != 0 ? in.x_scales.data() + i * nscales : nullptr,
          in.topk_idx.data() + i * k,   in.topk_weights.data() + i * k,
          static_cast<std::int32_t>(i), here.masks.data() + r * words};
    };
  }

  // The rows relayed here by node m's rank of this rail.
  template <class Token>
  auto relayed_rows(int m, const dispatch_input<Token>& in) {
    const std::size_t hidden = in.hidden, k = in.topk;
    const std::size_t ids_row = relayed_ids_bytes(k) / sizeof(std::uint64_t);
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    const std::size_t block = static_cast<std::size_t>(m) * cap_.max_tokens_per_rank;
    const auto* x = reinterpret_cast<const Token*>(inter_.local(rail_plan_.relay.x));
    const auto* scales = reinterpret_cast<const float*>(inter_.local(rail_plan_.relay.scales));
    const auto* ids = inter_.local(rail_plan_.relay.topk_idx);
    const auto* weights = reinterpret_cast<const float*>(inter_.local(rail_plan_.relay.weights));
    const auto* src = reinterpret_cast<const std::int32_t*>(inter_.local(rail_plan_.relay.src_idx));
    return [=](int r) {
      const std::size_t row = block + r;
      const std::byte* row_ids = ids + row * ids_row * sizeof(std::uint64_t);
      return row_ref<Token>{x + row * hidden,
                            nscales != 0 ? scales + row * nscales : nullptr,
                            reinterpret_cast<const std::int64_t*>(row_ids),
                            weights + row * k,
                            src[row],
                            k != 0 ? nullptr : reinterpret_cast<const std::uint64_t*>(row_ids)};
    };
  }

  // Stores `count` rows of world rank `source` (in its token order), each
  // with `k` top-k ids, into the receive arrays of every rank of this node
  // each reaches, at the flat buffer's offsets: after the rows of lower
  // sources, in token order. The counts of the handle say how many rows
  // each rank gets; rows that disagree with them are a protocol error, never
  // a write out of bounds.
  template <class Token, class Rows>
  void store_rows(int source, int count, Rows&& row, std::size_t k, const dispatch_handle& h) {
    const std::size_t hidden = h.hidden;
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    const int per_rank = cap_.num_experts / world_;
    struct target {
      Token* x;
      float* scales;
      std::int64_t* idx;
      float* weights;
      std::int32_t* src;
      int first;  // of source's rows
      int rows;   // of source's rows, announced
      int next = 0;
    };
    std::vector<target> to(per_node_);
    for (int i = 0; i < per_node_; ++i) {
      const int d = node_ * per_node_ + i;
      to[i] = {reinterpret_cast<Token*>(intra_.peer(i, node_plan_.recv_x)),
               reinterpret_cast<float*>(intra_.peer(i, node_plan_.recv_scales)),
               reinterpret_cast<std::int64_t*>(intra_.peer(i, node_plan_.recv_topk_idx)),
               reinterpret_cast<float*>(intra_.peer(i, node_plan_.recv_weights)),
               reinterpret_cast<std::int32_t*>(intra_.peer(i, node_plan_.recv_src_idx)),
               h.recv_offset(source, d),
               h.sent(source, d)};
    }
    auto reaches = [&](const row_ref<Token>& in, int i) {
      if (in.mask != nullptr) return ((in.mask[i / 64] >> (i % 64)) & 1) != 0;
      for (std::size_t j = 0; j < k; ++j)
        if (destination_rank(in.topk_idx[j], per_rank) == node_ * per_node_ + i) return true;
      return false;
    };
    for (int r = 0; r < count; ++r) {
      const row_ref<Token> in = row(r);
      for (int i = 0; i < per_node_; ++i) {
        const int d = node_ * per_node_ + i;
        if (!reaches(in, i)) continue;
        target& o = to[i];
        if (o.next == o.rows)
          throw error(rank_, "dispatch", source,
                      "rows of that rank exceed the " + std::to_string(o.rows) +
                          " it announced for rank " + std::to_string(d));
        const std::size_t at = static_cast<std::size_t>(o.first + o.next++);
        std::memcpy(o.x + at * hidden, in.x, hidden * sizeof(Token));
        if (nscales != 0) std::memcpy(o.scales + at * nscales, in.scales, nscales * sizeof(float));
        for (std::size_t j = 0; j < k; ++j) {
          const std::int64_t local = local_expert_id(in.topk_idx[j], d, per_rank);
          o.idx[at * k + j] = local;
          o.weights[at * k + j] = local >= 0 ? in.weights[j] : 0.0f;
        }
        o.src[at] = in.src;
      }
    }
    const std::size_t row_bytes = wire::hier::token_row_bytes(
        h.hidden, static_cast<int>(k), sizeof(Token), token_traits<Token>::has_scales);
    for (int i = 0; i < per_node_; ++i) {
      if (to[i].next != to[i].rows)
        throw error(rank_, "dispatch", source,
                    "that rank announced " + std::to_string(to[i].rows) + " rows for rank " +
                        std::to_string(node_ * per_node_ + i) + ", its relayed tokens give " +
                        std::to_string(to[i].next));
      if (to[i].rows != 0) intra_.count(i, to[i].rows * row_bytes, kind::payload);
    }
  }

  template <class Token>
  void fill_result(dispatch_result<Token>& res, const dispatch_input<Token>& in,
                   const dispatch_options& opt, const std::vector<record>& all) {
    const int n = res.handle.num_recv_tokens;
    const int rows = opt.worst_case_recv_tokens > 0 ? opt.worst_case_recv_tokens : n;
    const std::size_t hidden = in.hidden;
    const std::size_t k = in.topk;
    const std::size_t nscales = token_traits<Token>::has_scales ? hidden / 128 : 0;
    auto* idx = reinterpret_cast<std::int64_t*>(intra_.local(node_plan_.recv_topk_idx));
    auto* weights = reinterpret_cast<float*>(intra_.local(node_plan_.recv_weights));
    auto* src = reinterpret_cast<std::int32_t*>(intra_.local(node_plan_.recv_src_idx));
    // Padding rows must read as "routed nowhere" for callers that loop over
    // the bound rather than the count.
    std::fill(idx + n * k, idx + rows * k, -1);
    std::fill(weights + n * k, weights + rows * k, 0.0f);
    std::fill(src + n, src + rows, -1);
    res.num_recv_tokens = n;
    res.recv_x = {reinterpret_cast<const Token*>(intra_.local(node_plan_.recv_x)), rows * hidden};
    if (nscales != 0)
      res.recv_x_scales = {reinterpret_cast<const float*>(intra_.local(node_plan_.recv_scales)),
                           rows * nscales};
    res.recv_topk_idx = {idx, rows * k};
    res.recv_topk_weights = {weights, rows * k};
    res.recv_src_idx = {src, static_cast<std::size_t>(rows)};
    const int per_rank = cap_.num_experts / world_;
    res.num_recv_tokens_per_expert.assign(per_rank, 0);
    for (const auto& r : all)
      for (int e = 0; e < per_rank; ++e)
        res.num_recv_tokens_per_expert[e] += r.tokens_per_expert[rank_ * per_rank + e];
    for (int& c : res.num_recv_tokens_per_expert) c = aligned_expert_count(c, opt.expert_alignment);
  }

  // ---- combine -----------------------------------------------------------

  // From the handle: for every node, this rank's tokens that reached it and
  // which of its ranks each reached.
  std::vector<node_tokens> reach_of(const dispatch_handle& h) const {
    return reach_by_node(h.num_tokens, [&](int t, int d) {
      return h.send_pos[static_cast<std::size_t>(t) * world_ + d] >= 0;
    });
  }

  // Hop 1 puts this rank's status, with the masks of its tokens that reached
  // each node, to that node's rank of the rail; hop 2 copies the rail's
  // statuses to the node, so every rank judges all R statuses.
  void gather_status(const wire::combine_header& hdr, const std::vector<node_tokens>& reach,
                     const deadline& dl) {
    const std::uint64_t epoch = hdr.epoch;
    inter_.quiet(dl);
    const std::size_t slot_bytes = rail_plan_.status_slot_bytes;
    const std::size_t there = rail_plan_.status + node_ * slot_bytes;
    std::memcpy(inter_.local(there), &hdr, sizeof hdr);
    for (int m = 0; m < nodes_; ++m) {
      if (m == node_) continue;
      const std::size_t staged = rail_plan_.send_status + m * slot_bytes;
      std::byte* at = inter_.outgoing(m, there, staged);
      std::memcpy(at, &hdr, sizeof hdr);
      std::size_t bytes = sizeof hdr;
      // An invalid handle has no masks, and the call stops anyway.
      if (hdr.state == wire::status::ok) {
        const std::uint64_t count = reach[m].tokens.size();
        std::memcpy(at + rail_plan_.status_masks, &count, sizeof count);
        std::copy(reach[m].masks.begin(), reach[m].masks.end(),
                  reinterpret_cast<std::uint64_t*>(at + rail_plan_.status_masks + sizeof count));
        bytes = rail_plan_.status_masks + (1 + reach[m].masks.size()) * sizeof(std::uint64_t);
      }
      inter_.send_signal(m, staged, there, bytes, rail_slot(rail_signal::combine_ready, node_),
                         kind::control, dl);
    }
    for (int m = 0; m < nodes_; ++m)
      if (m != node_)
        inter_.wait(rail_slot(rail_signal::combine_ready, m), epoch, dl, "combine", m,
                    "combine status");

    for (int m = 0; m < nodes_; ++m) {
      const std::byte* from = inter_.local(rail_plan_.status + m * slot_bytes);
      const std::size_t to = node_plan_.combine_status +
                             (m * per_node_ + local_) * node_plan_.combine_status_slot_bytes;
      std::memcpy(intra_.local(to), from, sizeof hdr);
      for (int i = 0; i < per_node_; ++i) {
        if (i == local_) continue;
        std::memcpy(intra_.peer(i, to), from, sizeof hdr);
        intra_.count(i, sizeof hdr, kind::control);
      }
    }
    for (int i = 0; i < per_node_; ++i)
      if (i != local_) intra_.signal(i, node_slot(node_signal::combine_ready, local_), dl);
    for (int i = 0; i < per_node_; ++i)
      if (i != local_)
        intra_.wait(node_slot(node_signal::combine_ready, i), epoch, dl, "combine", i,
                    "combine statuses");
  }

  void check_status(std::uint64_t epoch) {
    std::vector<wire::combine_header> all(world_);
    for (int s = 0; s < world_; ++s)
      std::memcpy(
          &all[s],
          intra_.local(node_plan_.combine_status + s * node_plan_.combine_status_slot_bytes),
          sizeof(wire::combine_header));
    judge_combine_status(rank_, epoch, all);
  }

  // y's rows, in receive order, where the ranks of this node read them.
  template <class Out>
  void stage_y(const combine_input<Out>& in, const dispatch_handle& h) {
    const std::size_t rows = h.num_recv_tokens;
    if (rows == 0) return;
    std::memcpy(intra_.local(node_plan_.staged_y), in.y.data(), rows * h.hidden * sizeof(Out));
    if (in.topk_weights)
      std::memcpy(intra_.local(node_plan_.staged_weights), in.topk_weights->data(),
                  rows * h.topk * sizeof(float));
  }

  // For each source rank of this rail, the fp32 sum, per token that reached
  // this node, of the rows this node's ranks computed for it (in rank order).
  // This rank's own sums stay here; the others go back to their source in one
  // transfer per array.
  template <class Out>
  void reduce_for_rail(const dispatch_handle& h, const node_tokens& own, bool with_weights,
                       const deadline& dl) {
    inter_.quiet(dl);
    const std::size_t hidden = h.hidden;
    const std::size_t k = h.topk;
    const int words = wire::hier::mask_words(per_node_);
    const std::size_t block = static_cast<std::size_t>(node_) * cap_.max_tokens_per_rank;
    const std::size_t signal = rail_slot(rail_signal::combine_partial, node_);
    std::size_t first = 0;  // staged rows of earlier destinations
    for (int m = 0; m < nodes_; ++m) {
      const int source = m * per_node_ + local_;
      std::size_t count;
      const std::uint64_t* masks;
      if (m == node_) {
        count = own.tokens.size();
        masks = own.masks.data();
      } else {
        const std::byte* slot = inter_.local(rail_plan_.status + m * rail_plan_.status_slot_bytes +
                                             rail_plan_.status_masks);
        std::uint64_t n;
        std::memcpy(&n, slot, sizeof n);
        if (n > static_cast<std::uint64_t>(cap_.max_tokens_per_rank))
          throw error(rank_, "combine", source,
                      "that rank sent masks for " + std::to_string(n) + " tokens, more than " +
                          std::to_string(cap_.max_tokens_per_rank));
        count = n;
        masks = reinterpret_cast<const std::uint64_t*>(slot + sizeof n);
      }
      if (m != node_ && count == 0) {
        inter_.signal(m, signal, dl);
        continue;
      }
      float* x;
      float* w;
      if (m == node_) {
        x = reinterpret_cast<float*>(inter_.local(rail_plan_.partial_x)) + block * hidden;
        w = reinterpret_cast<float*>(inter_.local(rail_plan_.partial_weights)) + block * k;
      } else {
        x = reinterpret_cast<float*>(
            inter_.outgoing(m, rail_plan_.partial_x + block * hidden * sizeof(float),
                            rail_plan_.send_partial_x + first * hidden * sizeof(float)));
        w = reinterpret_cast<float*>(
            inter_.outgoing(m, rail_plan_.partial_weights + block * k * sizeof(float),
                            rail_plan_.send_partial_weights + first * k * sizeof(float)));
      }
      reduce_source<Out>(h, source, count, masks, words, with_weights, x, w);
      if (m == node_) continue;
      const std::size_t x_bytes = count * hidden * sizeof(float);
      const std::size_t w_bytes = count * k * sizeof(float);
      const std::size_t x_staged = rail_plan_.send_partial_x + first * hidden * sizeof(float);
      const std::size_t x_remote = rail_plan_.partial_x + block * hidden * sizeof(float);
      if (with_weights) {
        inter_.send(m, x_staged, x_remote, x_bytes, kind::payload, dl);
        inter_.send_signal(m, rail_plan_.send_partial_weights + first * k * sizeof(float),
                           rail_plan_.partial_weights + block * k * sizeof(float), w_bytes, signal,
                           kind::payload, dl);
      } else {
        inter_.send_signal(m, x_staged, x_remote, x_bytes, signal, kind::payload, dl);
      }
      first += count;
    }
  }

  // The partial sums of one source's `count` tokens that reached this node,
  // read from the staged y of each rank the token reached. Positions follow
  // dispatch: a rank's rows from `source` are in the source's token order.
  template <class Out>
  void reduce_source(const dispatch_handle& h, int source, std::size_t count,
                     const std::uint64_t* masks, int words, bool with_weights, float* x, float* w) {
    const std::size_t hidden = h.hidden;
    const std::size_t k = h.topk;
    std::vector<const Out*> y(per_node_);
    std::vector<const float*> yw(per_node_);
    std::vector<int> next(per_node_), rows(per_node_);
    for (int i = 0; i < per_node_; ++i) {
      const int d = node_ * per_node_ + i;
      const std::size_t first = h.recv_offset(source, d);
      y[i] = reinterpret_cast<const Out*>(intra_.peer(i, node_plan_.staged_y)) + first * hidden;
      yw[i] = reinterpret_cast<const float*>(intra_.peer(i, node_plan_.staged_weights)) + first * k;
      rows[i] = h.sent(source, d);
    }
    std::vector<const Out*> srcs;
    srcs.reserve(static_cast<std::size_t>(per_node_));
    for (std::size_t r = 0; r < count; ++r) {
      if (with_weights) std::fill_n(w + r * k, k, 0.0f);
      srcs.clear();
      for (int i = 0; i < per_node_; ++i) {
        if (((masks[r * words + i / 64] >> (i % 64)) & 1) == 0) continue;
        if (next[i] == rows[i])
          throw error(rank_, "combine", source,
                      "that rank's masks give rank " + std::to_string(node_ * per_node_ + i) +
                          " more than the " + std::to_string(rows[i]) + " rows it received");
        const std::size_t row = next[i]++;
        srcs.push_back(y[i] + row * hidden);
        if (with_weights)
          for (std::size_t j = 0; j < k; ++j) w[r * k + j] += yw[i][row * k + j];
      }
      reduce_token<float, Out>(x + r * hidden, hidden, srcs);
    }
    const std::size_t row_bytes = hidden * sizeof(Out) + (with_weights ? k * sizeof(float) : 0);
    for (int i = 0; i < per_node_; ++i) {
      if (next[i] != rows[i])
        throw error(rank_, "combine", source,
                    "that rank's masks give rank " + std::to_string(node_ * per_node_ + i) + " " +
                        std::to_string(next[i]) + " rows, it received " + std::to_string(rows[i]));
      if (rows[i] != 0) intra_.count(i, rows[i] * row_bytes, kind::payload);
    }
  }

  // out = bias_0 + bias_1 + the partial sums of each node the token reached,
  // in node order, all in fp32, rounded once to the output type.
  template <class Out>
  void finish(const combine_input<Out>& in, const dispatch_handle& h,
              const std::vector<node_tokens>& reach, std::span<Out> out_x,
              std::span<float> out_weights) {
    const std::size_t hidden = h.hidden;
    const std::size_t k = h.topk;
    const auto* px = reinterpret_cast<const float*>(inter_.local(rail_plan_.partial_x));
    const auto* pw = reinterpret_cast<const float*>(inter_.local(rail_plan_.partial_weights));
    std::vector<std::size_t> next(nodes_, 0);
    reduce_tokens<float>(h.num_tokens, hidden, k, in.bias_0, in.bias_1, out_x, out_weights,
                         [&](int t, auto&& add) {
                           for (int m = 0; m < nodes_; ++m) {
                             const auto& list = reach[m].tokens;
                             if (next[m] == list.size() || list[next[m]] != t) continue;
                             const std::size_t row =
                                 static_cast<std::size_t>(m) * cap_.max_tokens_per_rank + next[m]++;
                             add(px + row * hidden, pw + row * k);
                           }
                         });
  }

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  wire::capacity cap_;
  int per_node_;
  int nodes_;
  int node_;   // this rank's node
  int local_;  // this rank's index in its node, and its rail's number
  wire::hier::node_plan node_plan_;
  wire::hier::rail_plan rail_plan_;
  detail::group_link<Intra> intra_;
  detail::group_link<Inter> inter_;
  std::uint64_t dispatch_epoch_ = 0;
  std::uint64_t combine_epoch_ = 0;
  call_guard guard_;
  call_queue calls_;  // last: destroyed first (normal/async_calls.hpp)
};

}  // namespace epcomm
