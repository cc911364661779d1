// epcomm::cuda::device_buffer: normal-mode dispatch and combine with the CUDA
// kernels as producers, over a device transport (nvlink_ipc: kernels store
// into peers), or over an RMA transport (libfabric, UCX: kernels stage in
// this rank's buffer and hand puts to the GPU-fed proxy; device_link.hpp,
// normal/route.hpp). The protocol,
// the wire format (wire::plan_regions, wire::signal_slot, notify_header) and
// the error messages are the host engine's (normal/buffer.hpp); only the producer
// differs: kernels on a stream instead of the calling thread.
//
// Inputs and outputs are device pointers. Each call enqueues its kernels on
// the given stream, or on the buffer's communication stream after a given
// event (call_stream.hpp), and returns an event recorded after them. A
// dispatch synchronises (to report the received row count and any error)
// unless the caller passes a worst-case receive bound, and a combine unless
// asked not to; a call that does not synchronise, or any call while the
// stream is being captured into a CUDA graph, reports its errors at the next
// synchronize(stream). Kernels never hang: every wait has a deadline
// and a late peer becomes an epcomm::error naming it.
//
// Host code (g++) can use this header: the kernels are reached through the
// runtime switch (normal/cuda/registry.hpp), filled by .cu files that use
// instantiate.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/cuda_check.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/spin_wait.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/cuda/call_stream.hpp"
#include "epcomm/cuda/device_calls.hpp"
#include "epcomm/cuda/device_event.hpp"
#include "epcomm/cuda/device_link.hpp"
#include "epcomm/cuda/exit_watch.hpp"
#include "epcomm/host/require_peer_mapped.hpp"
#include "epcomm/normal/arguments.hpp"
#include "epcomm/normal/capacity_agreement.hpp"
#include "epcomm/normal/cuda/checks.hpp"
#include "epcomm/normal/cuda/launch.hpp"
#include "epcomm/normal/cuda/registry.hpp"
#include "epcomm/normal/report.hpp"
#include "epcomm/normal/wire.hpp"
#include "epcomm/transport/peer_table.hpp"

namespace epcomm::cuda {

template <token_type Token>
struct device_dispatch_input {
  int num_tokens = 0;
  int hidden = 0;
  int topk = 0;
  const Token* x = nullptr;                // [T][H]
  const float* x_scales = nullptr;         // [T][H/128] for fp8, else null
  const std::int64_t* topk_idx = nullptr;  // [T][K], -1 = no expert
  const float* topk_weights = nullptr;     // [T][K]
};

// A dispatch along the routing of an earlier one (DeepEP's dispatch(handle=)):
// the rows only, [handle.num_tokens][handle.hidden], in the handle's token order.
template <token_type Token>
struct device_cached_dispatch_input {
  const Token* x = nullptr;         // [T][H]
  const float* x_scales = nullptr;  // [T][H/128] for fp8, else null
};

// What combine needs from a dispatch. The routing stays on the device, in a
// slot of the buffer's workspace that the handle pins: it stays valid across
// later dispatches until every copy of it is destroyed
// (buffer_config::max_live_handles slots).
struct device_dispatch_handle : handle_shape {
  // The workspace slot holding its routing (its index); pins the slot while
  // any copy of the handle lives. Null for a dispatch the host rejected.
  std::shared_ptr<const int> slot;
};

// Device views into the buffer, ordered by (source rank, source token), valid
// until the next dispatch. `rows` is what the arrays hold: the received count,
// or the worst-case bound (padding rows: topk_idx -1, weight 0, src_idx -1).
template <token_type Token>
struct device_dispatch_result {
  int num_recv_tokens = -1;  // -1 until a synchronising call has read it
  int rows = 0;
  const Token* recv_x = nullptr;                         // [rows][H]
  const float* recv_x_scales = nullptr;                  // [rows][H/128] for fp8
  const std::int64_t* recv_topk_idx = nullptr;           // [rows][K] local expert ids, -1 elsewhere
  const float* recv_topk_weights = nullptr;              // [rows][K] 0 where the id is -1
  const std::int32_t* recv_src_idx = nullptr;            // [rows]
  const std::int32_t* num_recv_tokens_device = nullptr;  // device scalar
  const std::int32_t* num_recv_tokens_per_expert = nullptr;  // device [E/R]
  std::vector<int> num_recv_tokens_per_expert_host;          // [E/R] when synchronised
  device_dispatch_handle handle;
  device_event event;  // recorded after the call's work (call_stream)
};

template <class Out>
struct device_combine_input {
  const Out* y = nullptr;               // [y_rows][H], aligned with what this rank received
  long long y_rows = 0;                 // >= the received count
  const float* topk_weights = nullptr;  // [y_rows][K] or null: every rank passes them or none
  const Out* bias_0 = nullptr;          // [T][H] or null
  const Out* bias_1 = nullptr;          // [T][H] or null
};

// Tokens: the token types the buffer serves (any of bf16, fp8_e4m3, float),
// each call's type from its arguments, as the host engine's buffer<Transport,
// Tokens...>: one set of regions sized for the widest row, the call's type in
// the notify header and y's in the combine header, so that ranks calling
// with different types fail together. Each type needs its kernels linked
// (instantiate.cuh).
template <device_buffer_transport Transport, token_type... Tokens>
requires(sizeof...(Tokens) >= 1) class device_buffer {
  static constexpr bool via_proxy = device_link<Transport>::via_proxy;

 public:
  // Collective: every rank constructs its buffer with the same config, with
  // the CUDA device it uses already current. Over an RMA transport,
  // `rma_memory` places the symmetric buffer: device memory (GPUDirect RDMA:
  // FI_HMEM, UCX with CUDA) or host memory mapped into the device (fabric
  // libraries without CUDA support; results are then read over PCIe).
  template <bootstrap B>
  requires std::constructible_from<Transport, B&, std::size_t, std::size_t, deadline> device_buffer(
      B& boot, const buffer_config& cfg,
      proxy::memory_kind rma_memory = proxy::memory_kind::cuda_device)
      : rank_(boot.rank()),
        world_(boot.world_size()),
        timeout_(effective_timeout(cfg.timeout)),
        max_blocks_(cfg.max_blocks),
        cap_(agree_capacity<Tokens...>(boot, cfg, setup_timeout_of(cfg))),
        plan_(wire::plan_regions(cap_, via_proxy)),
        // One channel for the calls' puts (their kernels are stream-ordered)
        // and one for the abort relay.
        link_(boot, plan_.total, with_abort_words(wire::signal_slots(world_), world_),
              deadline::after(setup_timeout_of(cfg)), timeout_, rma_memory, 2),
        calls_(rank_, timeout_) {
    if constexpr (!via_proxy)
      require_peer_mapped(link_.transport(), rank_, world_, "buffer",
                          "normal mode over this transport needs every rank in one NVLink domain");
    allocate_workspace(cfg.max_live_handles);
    // A wait for a peer whose process exited then fails at once, naming it.
    if constexpr (has_peer_exit<Transport>) {
      exited_ = reinterpret_cast<std::uint64_t*>(calls_.host_extra());
      exit_watch_.start(link_.transport(), exited_, world_, rank_,
                        via_proxy ? exit_grace_over_rma : std::chrono::milliseconds(0));
      ws_.exited = exited_;
    }
  }

  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  // Work still queued on a stream must have finished (synchronize()).
  ~device_buffer() = default;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const wire::capacity& capacity() const { return cap_; }
  const wire::region_plan& plan() const { return plan_; }
  Transport& transport() { return link_.transport(); }
  // The start of this rank's symmetric buffer, as kernels address it.
  std::byte* local_device_buffer() { return link_.local_buffer(); }

  // The first served type; an argument list in braces has no type to
  // deduce, so dispatch({...}) means this one.
  using first_token = std::tuple_element_t<0, std::tuple<Tokens...>>;

  device_dispatch_result<first_token> dispatch(const device_dispatch_input<first_token>& in,
                                               const dispatch_options& opt = {},
                                               const call_stream& on = {}) {
    return dispatch<first_token>(in, opt, on);
  }
  device_dispatch_result<first_token> dispatch(const device_cached_dispatch_input<first_token>& in,
                                               const device_dispatch_handle& h,
                                               const call_stream& on = {}) {
    return dispatch<first_token>(in, h, on);
  }

  template <one_of<Tokens...> Token>
  device_dispatch_result<Token> dispatch(const device_dispatch_input<Token>& in,
                                         const dispatch_options& opt = {},
                                         const call_stream& on = {}) {
    calls_.ensure_usable("dispatch");
    const int slot = free_slot();
    std::string cause = check_dispatch_shape(
        cap_, token_traits<Token>::has_scales,
        {in.num_tokens, in.hidden, in.topk, in.x != nullptr, in.x_scales != nullptr,
         in.topk_idx != nullptr, in.topk_weights != nullptr});
    if (cause.empty()) cause = check_dispatch_options(opt, cap_.max_recv_tokens);
    if (cause.empty() && slot < 0)
      cause = "all " + std::to_string(slots_.size()) +
              " handle slots (max_live_handles) are pinned by live dispatch handles";
    dispatch_args a = dispatch_args_of(cause, in.x, in.x_scales, in.num_tokens, in.hidden);
    a.ws = routed(cause.empty() ? slot : -1);  // the kernels write its routing there
    a.topk_idx = in.topk_idx;
    a.topk_weights = in.topk_weights;
    a.topk = in.topk;
    a.recv_bound = opt.worst_case_recv_tokens;
    a.expert_alignment = cause.empty() ? opt.expert_alignment : 1;
    const cudaStream_t stream = calls_.enter(on, "dispatch");
    auto res = launch_dispatch<Token>(a, stream);
    res.event = calls_.leave(on, stream, "dispatch");
    const std::byte* base = link_.local_buffer();
    res.recv_topk_idx = reinterpret_cast<const std::int64_t*>(base + plan_.recv_topk_idx);
    res.recv_topk_weights = reinterpret_cast<const float*>(base + plan_.recv_weights);
    res.num_recv_tokens_per_expert = ws_.recv_per_expert;
    res.handle = {{world_, rank_, in.num_tokens, in.hidden, in.topk}, nullptr};
    if (cause.empty()) {
      res.handle.slot = std::make_shared<const int>(slot);
      slots_[slot].lease = res.handle.slot;
    }
    res.rows = opt.worst_case_recv_tokens;
    // A call the host already knows to fail reports at once, unless captured.
    if ((opt.worst_case_recv_tokens == 0 || !cause.empty()) && !calls_.capturing(stream)) {
      finish(stream, "dispatch");
      res.num_recv_tokens = calls_.report().num_recv_tokens;
      if (res.rows == 0) res.rows = res.num_recv_tokens;
      res.num_recv_tokens_per_expert_host.resize(cap_.num_experts / world_);
      calls_.check(cudaMemcpy(res.num_recv_tokens_per_expert_host.data(), ws_.recv_per_expert,
                              sizeof(int) * res.num_recv_tokens_per_expert_host.size(),
                              cudaMemcpyDeviceToHost),
                   "dispatch", "cudaMemcpy(tokens per expert)");
    }
    return res;
  }

  // DeepEP's dispatch(handle=...) on the device: new rows along the routing
  // of the dispatch that returned `h`, every rank passing its handle of that
  // dispatch, as the host engine's cached dispatch (normal/buffer.hpp) does:
  // no layout kernel and no count exchange (the notify round carries headers
  // with the fingerprint of the handle's count matrix, which every rank must
  // share), no top-k arrays. The result holds recv_x (recv_x_scales for fp8)
  // and recv_src_idx in the handle's receive order, and `h` as its handle,
  // whose routing the call only reads. Synchronises unless captured.
  // The rows may be of another served type than the handle's dispatch moved.
  template <one_of<Tokens...> Token>
  device_dispatch_result<Token> dispatch(const device_cached_dispatch_input<Token>& in,
                                         const device_dispatch_handle& h,
                                         const call_stream& on = {}) {
    calls_.ensure_usable("dispatch");
    const bool ours = owns(h);
    std::string cause =
        check_cached_dispatch_shape(cap_, token_traits<Token>::has_scales, rank_, world_,
                                    {h.rank, h.world_size, h.num_tokens, h.hidden, h.topk,
                                     in.x != nullptr, in.x_scales != nullptr});
    if (cause.empty() && !ours) cause = not_ours;
    dispatch_args a = dispatch_args_of(cause, in.x, in.x_scales, h.num_tokens, h.hidden);
    a.ws = along(cause.empty() ? *h.slot : -1);
    a.cached = 1;
    const cudaStream_t stream = calls_.enter(on, "dispatch");
    auto res = launch_dispatch<Token>(a, stream);
    res.event = calls_.leave(on, stream, "dispatch");
    res.handle = h;
    if (!calls_.capturing(stream)) {
      finish(stream, "dispatch");
      res.num_recv_tokens = res.rows = calls_.report().num_recv_tokens;
    }
    return res;
  }

  // Writes out_x[T][H] (and out_weights[T][K] when in.topk_weights is given).
  // Out is y's element type: any of the served tokens' combine types,
  // whatever type the handle's dispatch moved. Returns the event recorded
  // after its work.
  template <one_of<combine_type_t<Tokens>...> Out>
  device_event combine(const std::type_identity_t<device_combine_input<Out>>& in,
                       const device_dispatch_handle& h, Out* out_x, float* out_weights = nullptr,
                       const call_stream& on = {}, bool synchronize_now = true) {
    calls_.ensure_usable("combine");
    std::string cause = check_combine_shape(
        rank_, world_,
        {h.rank, h.world_size, h.num_tokens, h.hidden, h.topk, in.y_rows, in.y != nullptr,
         in.topk_weights != nullptr, out_x != nullptr, out_weights != nullptr});
    const bool ours = owns(h);
    if (cause.empty() && !ours) cause = not_ours;
    combine_args a{};
    a.peers = link_.peers();
    a.route = route();
    a.plan = plan_;
    a.ws = routed(ours ? *h.slot : -1);  // the routing of the dispatch this combine answers
    a.y = in.y;
    a.y_weights = in.topk_weights;
    a.bias_0 = in.bias_0;
    a.bias_1 = in.bias_1;
    a.out_x = out_x;
    a.out_weights = in.topk_weights != nullptr ? out_weights : nullptr;
    a.y_rows = cause.empty() ? in.y_rows : 0;
    a.num_tokens = cause.empty() ? h.num_tokens : 0;
    a.hidden = h.hidden;
    a.topk = h.topk;
    a.out_id = token_traits<Out>::id;
    a.max_blocks = calls_.block_budget(max_blocks_);
    a.timeout_ns = calls_.timeout_ns();
    calls_.copy_cause(a.host_cause, cause);

    const std::size_t row_bytes = static_cast<std::size_t>(h.hidden) * sizeof(Out);
    const std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(in.y) |
                                reinterpret_cast<std::uintptr_t>(in.bias_0) |
                                reinterpret_cast<std::uintptr_t>(in.bias_1) |
                                reinterpret_cast<std::uintptr_t>(out_x) | row_bytes;
    const normal_kernels k = combine_kernels_for<Out>(h.hidden, bits % 16 == 0);
    const cudaStream_t stream = calls_.enter(on, "combine");
    calls_.launch("combine", k.combine(a, stream));
    device_event done = calls_.leave(on, stream, "combine");
    if ((synchronize_now || !cause.empty()) && !calls_.capturing(stream)) finish(stream, "combine");
    return done;
  }

  // Waits for everything this buffer enqueued on `stream`, and on its
  // communication stream, and throws the first failure any of it recorded.
  void synchronize(cudaStream_t stream = nullptr) {
    calls_.ensure_usable("synchronize");
    calls_.join_comm(stream, "synchronize");
    finish(stream, "synchronize");
  }

 private:
  normal_route route() const {
    normal_route r{};
    if constexpr (via_proxy) r = {1, link_.channel(0), link_.channel(1)};
    return r;
  }

  // What both dispatches pass the kernels alike; a rejected call (`cause`)
  // still runs the notify round (so every rank rejects it together) but with
  // no tokens, so nothing reads past a bad shape.
  template <class Token>
  dispatch_args dispatch_args_of(const std::string& cause, const Token* x, const float* x_scales,
                                 int num_tokens, int hidden) {
    dispatch_args a{};
    a.peers = link_.peers();
    a.route = route();
    a.plan = plan_;
    a.x = x;
    a.x_scales = x_scales;
    a.num_tokens = cause.empty() ? num_tokens : 0;
    a.hidden = hidden;
    a.num_experts = cap_.num_experts;
    a.max_recv_tokens = cap_.max_recv_tokens;
    a.expert_alignment = 1;
    a.token_id = token_traits<Token>::id;
    a.max_blocks = calls_.block_budget(max_blocks_);
    a.timeout_ns = calls_.timeout_ns();
    calls_.copy_cause(a.host_cause, cause);
    return a;
  }

  // Enqueues a dispatch's kernels; the result's views of the rows every
  // dispatch delivers.
  template <class Token>
  device_dispatch_result<Token> launch_dispatch(const dispatch_args& a, cudaStream_t stream) {
    const std::size_t row_bytes = static_cast<std::size_t>(a.hidden) * sizeof(Token);
    const bool aligned = (reinterpret_cast<std::uintptr_t>(a.x) % 16 == 0) && row_bytes % 16 == 0;
    const normal_kernels k = kernels_for("dispatch", token_traits<Token>::id, a.hidden, aligned);
    calls_.launch("dispatch", k.dispatch(a, stream));
    device_dispatch_result<Token> res;
    const std::byte* base = link_.local_buffer();
    res.recv_x = reinterpret_cast<const Token*>(base + plan_.recv_x);
    if constexpr (token_traits<Token>::has_scales)
      res.recv_x_scales = reinterpret_cast<const float*>(base + plan_.recv_scales);
    res.recv_src_idx = reinterpret_cast<const std::int32_t*>(base + plan_.recv_src_idx);
    res.num_recv_tokens_device = a.ws.num_recv;
    return res;
  }

  static constexpr const char* not_ours = "handle is not from a dispatch of this buffer";

  // Whether `h` pins a slot of this buffer (the lease is the one it handed out).
  bool owns(const device_dispatch_handle& h) const {
    return h.slot && *h.slot >= 0 && *h.slot < static_cast<int>(slots_.size()) &&
           slots_[*h.slot].lease.lock() == h.slot;
  }

  // The kernels for rows of the type with token_traits id `id`, or the error
  // that says which .cu file to link.
  normal_kernels kernels_for(const char* op, std::int32_t id, int hidden, bool aligned) const {
    normal_kernels k{};
    const kernel_registry& reg = kernel_registry::global();
    if (!reg.find(id, world_, hidden, aligned, k))
      throw error(rank_, op, no_peer,
                  "no CUDA kernels fit " + std::string(token_type_name(id)) + " tokens on " +
                      std::to_string(world_) + " ranks with hidden " + std::to_string(hidden) +
                      " (instantiated: " + reg.describe(id) +
                      "); link a .cu file that uses EPCOMM_CUDA_INSTANTIATE_NORMAL(Token, 0, 0) "
                      "(epcomm/normal/cuda/instantiate.cuh)");
    return k;
  }

  // The combine kernels for rows of Out: those of the first served type whose
  // combine rows are Out (bf16 and fp8 tokens both combine in bf16) and whose
  // kernels fit; when none fits, the first such type's error.
  template <class Out>
  normal_kernels combine_kernels_for(int hidden, bool aligned) const {
    constexpr std::int32_t none = -1;
    constexpr std::int32_t combining_in_out[] = {
        (std::same_as<combine_type_t<Tokens>, Out> ? token_traits<Tokens>::id : none)...};
    normal_kernels k{};
    for (const std::int32_t id : combining_in_out)
      if (id != none && kernel_registry::global().find(id, world_, hidden, aligned, k)) return k;
    return kernels_for(
        "combine",
        *std::ranges::find_if(combining_in_out, [](std::int32_t id) { return id != none; }), hidden,
        aligned);
  }

  // The host engine's error for what the kernels reported (device_calls::finish).
  void finish(cudaStream_t stream, const char* op) {
    calls_.finish(
        stream, op,
        [&](const report& r) {
          return r.code == failure::none
                     ? error(rank_, op, no_peer, "an earlier call on this buffer timed out")
                 : r.code == failure::proxy ? link_.with_proxy_cause(to_error(r, rank_, op))
                                            : to_error(r, rank_, op);
        },
        [](const report& r) { return breaks_buffer(r); });
  }

  // A slot no live handle pins, or -1.
  int free_slot() const {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].lease.expired()) return static_cast<int>(i);
    return -1;
  }

  // The workspace as the calls of the dispatch in `slot` see it: its routing
  // (notify flags, count matrix, send_pos) lives in the slot, where its
  // kernels write it and its combine reads it, so that its handle outlives
  // later dispatches. -1: a call rejected on the host, which uses the
  // workspace's own arrays.
  workspace routed(int slot) const {
    workspace w = ws_;
    if (slot < 0) return w;
    const routing_slot& r = slots_[slot];
    w.accepted = r.flags;
    w.num_recv = r.flags + 2;
    w.count_matrix = r.count_matrix;
    w.origin = r.origin;
    w.send_pos = r.send_pos;
    return w;
  }

  // The workspace as a cached dispatch along the handle in `slot` sees it:
  // the slot's routing, read only, and the workspace's own flags and
  // received count, so that a rejected call leaves the handle as it was.
  workspace along(int slot) const {
    workspace w = ws_;
    if (slot < 0) return w;
    w.count_matrix = slots_[slot].count_matrix;
    w.origin = slots_[slot].origin;
    w.send_pos = slots_[slot].send_pos;
    return w;
  }

  // The kernels' state, in one device allocation (device_calls::allocate).
  void allocate_workspace(int live_handles) {
    const std::size_t r = world_;
    const std::size_t e = cap_.num_experts;
    wire::carver regions(16);
    const std::size_t send_pos = regions.take(sizeof(std::int32_t) * cap_.max_tokens_per_rank * r);
    const std::size_t per_rank = regions.take(sizeof(std::int32_t) * r);
    const std::size_t per_expert = regions.take(sizeof(std::int32_t) * e);
    const std::size_t matrix = regions.take(sizeof(std::int32_t) * r * r);
    const std::size_t origin = regions.take(sizeof(std::uint64_t));
    const std::size_t recv_expert = regions.take(sizeof(std::int32_t) * (e / r));
    const std::size_t invalid = regions.take(sizeof(std::uint64_t));
    const std::size_t epochs = regions.take(2 * sizeof(std::uint64_t));
    const std::size_t done = regions.take(2 * sizeof(std::uint32_t));
    const std::size_t accepted = regions.take(3 * sizeof(std::int32_t));  // [2] + num_recv
    struct slot_offsets {
      std::size_t flags, matrix, origin, send_pos;
    };
    std::vector<slot_offsets> slot_at;
    for (int i = 0; i < live_handles; ++i)
      slot_at.push_back({regions.take(3 * sizeof(std::int32_t)),
                         regions.take(sizeof(std::int32_t) * r * r),
                         regions.take(sizeof(std::uint64_t)),
                         regions.take(sizeof(std::int32_t) * cap_.max_tokens_per_rank * r)});
    // Pinned, after the report: the exit watch's words, which kernels read
    // in place (pinned memory is mapped into the device at the same address).
    calls_.allocate(regions, r * sizeof(std::uint64_t), "buffer", [&](std::byte* w) {
      for (const slot_offsets& o : slot_at)
        slots_.push_back({reinterpret_cast<std::int32_t*>(w + o.flags),
                          reinterpret_cast<std::int32_t*>(w + o.matrix),
                          reinterpret_cast<std::uint64_t*>(w + o.origin),
                          reinterpret_cast<std::int32_t*>(w + o.send_pos),
                          {}});
      ws_.send_pos = reinterpret_cast<std::int32_t*>(w + send_pos);
      ws_.tokens_per_rank = reinterpret_cast<std::int32_t*>(w + per_rank);
      ws_.tokens_per_expert = reinterpret_cast<std::int32_t*>(w + per_expert);
      ws_.count_matrix = reinterpret_cast<std::int32_t*>(w + matrix);
      ws_.origin = reinterpret_cast<std::uint64_t*>(w + origin);
      ws_.recv_per_expert = reinterpret_cast<std::int32_t*>(w + recv_expert);
      ws_.first_invalid = reinterpret_cast<std::uint64_t*>(w + invalid);
      ws_.dispatch_epoch = reinterpret_cast<std::uint64_t*>(w + epochs);
      ws_.combine_epoch = ws_.dispatch_epoch + 1;
      ws_.blocks_done = reinterpret_cast<std::uint32_t*>(w + done);
      ws_.accepted = reinterpret_cast<std::int32_t*>(w + accepted);
      ws_.num_recv = ws_.accepted + 2;
      ws_.rep = calls_.device_report();
      calls_.check(cudaMemset(ws_.first_invalid, 0xFF, sizeof(std::uint64_t)), "buffer",
                   "cudaMemset(first_invalid)");
    });
  }

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  int max_blocks_;  // buffer_config::max_blocks
  wire::capacity cap_;
  wire::region_plan plan_;
  device_link<Transport> link_;
  device_calls<report> calls_;
  workspace ws_{};
  // Where each dispatch keeps what its combine reads (see routed): the notify
  // flags ([2] accepted + num_recv, as in the workspace), the count matrix,
  // the dispatch's epoch and send_pos.
  struct routing_slot {
    std::int32_t* flags = nullptr;
    std::int32_t* count_matrix = nullptr;
    std::uint64_t* origin = nullptr;
    std::int32_t* send_pos = nullptr;
    std::weak_ptr<const int> lease;  // expired: free
  };
  std::vector<routing_slot> slots_;
  std::uint64_t* exited_ = nullptr;  // [R] pinned (device_calls::host_extra), set by exit_watch_
  exit_watch exit_watch_;            // stops before the memory and transport go
};

}  // namespace epcomm::cuda
