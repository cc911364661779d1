// epcomm::cuda::low_latency_device_buffer: low-latency (decode / rollout)
// dispatch and combine with CUDA kernels as the producers, over a device
// transport (nvlink_ipc: kernels store into peers), or over an RMA transport
// (libfabric, UCX: kernels stage in this rank's buffer and hand puts to the
// GPU-fed proxy; device_link.hpp, low_latency/route.hpp). The protocol, the
// wire format (low_latency/wire.hpp) and the error messages are the host
// engine's (low_latency/buffer.hpp): a rank running this buffer and one running the
// host engine exchange the same bytes. Only the producer differs: kernels on
// a stream instead of the calling thread.
//
// Every call is two kernels, send and receive, and both phases can be
// launched apart (the *_send functions return a hook that launches the
// receive phase), so that a framework overlaps compute with communication.
// dispatch() and combine() run both phases on the stream a call_stream names
// (the caller's, or the buffer's communication stream after an event) and
// return an event recorded after them.
// Nothing is allocated per call and no launch size depends on the routing;
// call counters live on the device: the calls can be captured in a CUDA graph
// and replayed. Inputs and outputs are device pointers; results are device
// views into the buffer.
//
// Calls do not synchronise with the host. A failure a kernel finds (a
// deadline, a rejected call, a protocol violation) is recorded on the device
// and thrown by the next synchronize(stream), with the host engine's message.
// Input the host can already judge (too many tokens, null pointers, a stale
// handle) is rejected at once outside of a graph capture, after the same
// exchange that tells every peer, as the host engine does.
//
// Host code (g++) can use this header: kernels are reached through the
// runtime switch (low_latency/cuda/registry.hpp), filled by .cu files that use
// low_latency/cuda/instantiate.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

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
#include "epcomm/low_latency/arguments.hpp"
#include "epcomm/low_latency/cuda/checks.hpp"
#include "epcomm/low_latency/cuda/launch.hpp"
#include "epcomm/low_latency/cuda/registry.hpp"
#include "epcomm/low_latency/parity_calls.hpp"
#include "epcomm/low_latency/receive_hook.hpp"
#include "epcomm/low_latency/report.hpp"
#include "epcomm/low_latency/wire.hpp"
#include "epcomm/transport/peer_table.hpp"
#include "epcomm/transport/rma/symmetric_memory.hpp"

namespace epcomm::cuda {

struct ll_device_dispatch_input {
  int num_tokens = 0;
  int topk = 0;
  const bf16* x = nullptr;                 // [T][hidden]
  const std::int64_t* topk_idx = nullptr;  // [T][K], -1 = no expert
};

// Names one dispatch so that combine can send expert outputs back along it.
// Plain data; valid until the next dispatch on the same parity.
struct ll_device_handle {
  int parity = -1;
  std::uint64_t dispatch = 0;  // which dispatch of its parity (counted on the host)
  int num_tokens = 0;
  int topk = 0;
};

// Device views, laid out as the host engine's ll_dispatch_result: rows of
// each local expert packed by source rank, then token, then top-k slot; rows
// [0, recv_count[e]) of expert e are valid. Valid until the next dispatch on
// the same parity (two dispatches later), once the stream got there.
template <class Wire>
struct ll_device_dispatch_result {
  const Wire* recv_x = nullptr;  // [E_local][R * max_tokens][H]
  // fp8 wire, in the buffer's scale_layout (low_latency/scale_layout.hpp):
  // ue8m0 fills recv_x_scales_ue8m0, the others recv_x_scales.
  const float* recv_x_scales = nullptr;
  const std::int32_t* recv_x_scales_ue8m0 = nullptr;
  const std::int32_t* recv_count = nullptr;     // [E_local]
  const wire::ll::source* recv_src = nullptr;   // [E_local][R * max_tokens]
  const wire::ll::range* recv_range = nullptr;  // [E_local][R]
  ll_device_handle handle;
  device_event event;  // recorded after the call's work (call_stream); empty from dispatch_send
};

// A combine's output and the event recorded after its work.
struct ll_device_combine_result {
  const bf16* out = nullptr;  // [T][H] on the device
  device_event event;
};

struct ll_device_combine_input {
  // [E_local][R * max_tokens][H] expert outputs aligned with recv_x; may be
  // combine_send_buffer(handle) (zero copy).
  const bf16* y = nullptr;
  const std::int64_t* topk_idx = nullptr;  // [T][K], the dispatched ids
  const float* topk_weights = nullptr;     // [T][K]
};

// Wire is what a dispatch moves when not told; More are further wires the
// same buffer serves, each call choosing its own, as the host engine's.
template <device_buffer_transport Transport, low_latency_wire Wire = bf16, low_latency_wire... More>
class low_latency_device_buffer {
  static constexpr const char* dispatch_op = ll_dispatch_op;
  static constexpr const char* combine_op = ll_combine_op;
  static constexpr bool via_proxy = device_link<Transport>::via_proxy;
  // As the host engine's: the kernels go on without a peer whose process
  // exited, which an RMA transport must let its proxy do too.
  static constexpr bool can_mask_lost_ranks =
      via_proxy ? has_lost_peer_masking<Transport> : has_peer_exit<Transport>;

 public:
  using wire_type = Wire;
  using dispatch_result = ll_device_dispatch_result<Wire>;

  // Launches a dispatch's receive phase; returned by dispatch_send.
  template <class W>
  using dispatch_hook_for = receive_hook<low_latency_device_buffer, ll_device_dispatch_result<W>,
                                         int, std::uint64_t, cudaStream_t>;
  using dispatch_hook = dispatch_hook_for<Wire>;
  // Launches a combine's receive phase and returns out[T][H] (a device
  // pointer); returned by combine_send.
  using combine_hook =
      receive_hook<low_latency_device_buffer, const bf16*, int, std::uint64_t, cudaStream_t>;

  // Collective: every rank constructs its buffer with the same config, with
  // the CUDA device it uses already current. Over an RMA transport,
  // `rma_memory` places the symmetric buffer: in that device's memory
  // (GPUDirect RDMA: the provider must support FI_HMEM / UCX CUDA memory;
  // chosen as usual with FI_PROVIDER or UCX_TLS), or in host memory mapped
  // into the device, for fabric libraries without CUDA support (kernels then
  // read and write it over PCIe, results included). Unused over nvlink_ipc.
  template <bootstrap B>
  requires std::constructible_from<Transport, B&, std::size_t, std::size_t, deadline>
  low_latency_device_buffer(B& boot, const low_latency_config& cfg,
                            proxy::memory_kind rma_memory = proxy::memory_kind::cuda_device)
      : rank_(boot.rank()),
        world_(boot.world_size()),
        timeout_(effective_timeout(cfg.timeout)),
        round_scale_(cfg.round_scale),
        max_blocks_(cfg.max_blocks),
        mask_lost_ranks_(cfg.mask_lost_ranks),
        shape_(agree_ll_shape<Wire, More...>(boot, cfg, setup_timeout_of(cfg),
                                             device_limits(cfg, world_), can_mask_lost_ranks)),
        plan_(wire::ll::plan_buffer(shape_, via_proxy)),
        // A channel per parity, and one for the abort relay.
        link_(boot, plan_.total, ll_device_signal_slots(shape_),
              deadline::after(setup_timeout_of(cfg)), timeout_, rma_memory, wire::ll::parities + 1),
        calls_(rank_, timeout_) {
    if constexpr (!via_proxy)
      require_peer_mapped(link_.transport(), rank_, world_, "low_latency_buffer",
                          "the device path needs every rank in one NVLink domain");
    allocate_workspace();
    if constexpr (via_proxy && can_mask_lost_ranks)
      if (mask_lost_ranks_) link_.transport().mask_lost_peers();
    // A wait for a peer that exited then fails at once, or masks it.
    if constexpr (has_peer_exit<Transport>) {
      exit_watch_.start(link_.transport(), exited_, world_, rank_,
                        via_proxy ? exit_grace_over_rma : std::chrono::milliseconds(0));
      ws_.exited = exited_;
    }
  }

  low_latency_device_buffer(const low_latency_device_buffer&) = delete;
  low_latency_device_buffer& operator=(const low_latency_device_buffer&) = delete;
  // Work still queued on a stream must have finished (synchronize()). Over
  // an RMA transport, as the host engine, it first waits (bounded) for every
  // peer's release of this rank's last dispatches, so that this rank's
  // endpoint does not close under them.
  ~low_latency_device_buffer() {
    if constexpr (via_proxy) await_last_releases();
  }

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const wire::ll::shape& shape() const { return shape_; }
  const wire::ll::plan& plan() const { return plan_; }
  // The start of this rank's symmetric buffer, as kernels address it.
  std::byte* local_device_buffer() { return local<std::byte>(0, 0); }
  Transport& transport() { return link_.transport(); }

  // Both phases, on the stream `on` names (call_stream.hpp), on wire W (any
  // served one; every rank of a call must dispatch the same).
  template <one_of<Wire, More...> W = Wire>
  ll_device_dispatch_result<W> dispatch(const ll_device_dispatch_input& in,
                                        const call_stream& on = {}) {
    const cudaStream_t stream = calls_.enter(on, dispatch_op);
    ll_device_dispatch_result<W> r = dispatch_send<W>(in, stream)();
    r.event = calls_.leave(on, stream, dispatch_op);
    return r;
  }

  // The send phase only; run the returned hook before the next dispatch on
  // this parity (the one after next).
  template <one_of<Wire, More...> W = Wire>
  dispatch_hook_for<W> dispatch_send(const ll_device_dispatch_input& in,
                                     cudaStream_t stream = nullptr) {
    calls_.ensure_usable(dispatch_op);
    const int p = next_parity_;
    parity_state& st = parity_[p];
    const std::uint64_t number = st.open_dispatch(rank_, p);
    next_parity_ ^= 1;
    // The call's records and outputs in its own wire's layout, within the
    // regions the plan sized for every served wire.
    const wire::ll::shape call = wire::ll::call_shape<W>(shape_);
    const std::string cause =
        check_ll_dispatch(call, {in.num_tokens, in.topk, in.x != nullptr, in.topk_idx != nullptr});
    ll_args& a = st.dispatch_args;
    a = base_args(p, cause);
    a.shape = call;
    // A rejected call moves nothing: the kernels read no input.
    a.num_tokens = cause.empty() ? in.num_tokens : 0;
    a.topk = cause.empty() ? in.topk : 0;
    a.x = in.x;
    a.topk_idx = in.topk_idx;
    st.dispatch_kernels =
        kernels_for<W>(ll_kernel_registry::dispatch(), dispatch_op, aligned(in.x));
    calls_.launch(dispatch_op, st.dispatch_kernels.send(a, stream));
    st.dispatch_sent(cause.empty(), in.num_tokens, in.topk);
    if (!cause.empty() && !calls_.capturing(stream)) {
      receive_dispatch<W>(p, number, stream);
      finish(stream, dispatch_op);  // throws the rejection every rank now sees
      throw error(rank_, dispatch_op, no_peer, "internal: a rejected dispatch was not reported");
    }
    return dispatch_hook_for<W>(this, &low_latency_device_buffer::receive_dispatch<W>, p, number,
                                stream);
  }

  // Where expert outputs for `h` can be written so that combine reads them in
  // place: [E_local][R * max_tokens][H], aligned with recv_x. Pass it as y.
  bf16* combine_send_buffer(const ll_device_handle& h) {
    check_ll_handle_parity(rank_, combine_op, h.parity);
    return local<bf16>(h.parity, plan_.combine_send);
  }

  // Both phases, on the stream `on` names (call_stream.hpp). out: [T][H] on
  // the device, or null for the buffer's own combine output (valid until the
  // next combine on the same parity).
  ll_device_combine_result combine(const ll_device_combine_input& in, const ll_device_handle& h,
                                   const call_stream& on = {}, bf16* out = nullptr) {
    const cudaStream_t stream = calls_.enter(on, combine_op);
    ll_device_combine_result r{combine_send(in, h, stream, out)(), {}};
    r.event = calls_.leave(on, stream, combine_op);
    return r;
  }

  // The send phase only; run the returned hook before the next dispatch on
  // this parity.
  combine_hook combine_send(const ll_device_combine_input& in, const ll_device_handle& h,
                            cudaStream_t stream = nullptr, bf16* out = nullptr) {
    calls_.ensure_usable(combine_op);
    check_ll_handle_parity(rank_, combine_op, h.parity);
    const int p = h.parity;
    parity_state& st = parity_[p];
    const std::uint64_t number = st.open_combine(rank_, p);
    const std::string cause = check_ll_combine(
        {p, h.dispatch, st.dispatches, st.dispatch_accepted, h.num_tokens, h.topk, st.num_tokens,
         st.topk, in.y != nullptr, in.topk_idx != nullptr, in.topk_weights != nullptr});
    ll_args& a = st.combine_args;
    a = base_args(p, cause);
    a.num_tokens = cause.empty() ? h.num_tokens : 0;
    a.topk = cause.empty() ? h.topk : 0;
    a.y = in.y;
    a.topk_idx = in.topk_idx;
    a.topk_weights = in.topk_weights;
    a.out = out != nullptr ? out : local<bf16>(p, plan_.combine_out);
    st.combine_kernels = kernels_for<bf16>(ll_kernel_registry::combine(), combine_op,
                                           aligned(in.y) && aligned(a.out));
    calls_.launch(combine_op, st.combine_kernels.send(a, stream));
    st.combine_pending = true;
    if (!cause.empty() && !calls_.capturing(stream)) {
      receive_combine(p, number, stream);
      finish(stream, combine_op);  // throws the rejection every rank now sees
      throw error(rank_, combine_op, no_peer, "internal: a rejected combine was not reported");
    }
    return combine_hook(this, &low_latency_device_buffer::receive_combine, p, number, stream);
  }

  // Waits, with a deadline, for everything this buffer enqueued on `stream`
  // and on its communication stream, and throws the first failure any of it
  // recorded. Not while capturing.
  void synchronize(cudaStream_t stream = nullptr) {
    calls_.ensure_usable("synchronize");
    if (calls_.capturing(stream))
      throw error(rank_, "synchronize", no_peer,
                  "the stream is being captured; synchronize after replaying the graph");
    calls_.join_comm(stream, "synchronize");
    finish(stream, "synchronize");
  }

  // Cumulative per-rank counters, as the host engine's stats(): rows received
  // per local expert, and time blocked on each source (dispatch) and each
  // expert rank (combine), measured on the device. Reads them after the work
  // already on `stream` and on the communication stream.
  ll_stats stats(cudaStream_t stream = nullptr) {
    read_counters(stream, "stats");
    const int el = shape_.local_experts();
    const std::size_t n = stats_words();
    ll_stats out;
    out.recv_tokens_per_expert.assign(host_stats_, host_stats_ + el);
    for (int r = 0; r < world_; ++r) {
      out.dispatch_wait.emplace_back(static_cast<std::int64_t>(host_stats_[el + r]));
      out.combine_wait.emplace_back(static_cast<std::int64_t>(host_stats_[el + world_ + r]));
    }
    out.masked_contributions = host_stats_[n - 1];
    return out;
  }

  // mask_lost_ranks: the ranks the kernels went on without so far (their
  // processes exited), ascending, after the work already on `stream` and on
  // the communication stream; empty otherwise.
  std::vector<int> lost_ranks(cudaStream_t stream = nullptr) {
    read_counters(stream, "lost_ranks");
    std::vector<int> ranks;
    for (int r = 0; r < world_; ++r)
      if (host_stats_[stats_words() + r] != 0) ranks.push_back(r);
    return ranks;
  }

  void reset_stats(cudaStream_t stream = nullptr) {
    calls_.join_comm(stream, "stats");
    calls_.check(cudaMemsetAsync(ws_.recv_tokens, 0, stats_words() * sizeof(std::uint64_t), stream),
                 "stats", "cudaMemsetAsync(stats)");
  }

 private:
  // What the receive phases launch with: the send phases' arguments.
  struct parity_state : ll_parity_calls {
    ll_args dispatch_args{};
    ll_args combine_args{};
    ll_kernel_pair dispatch_kernels{};
    ll_kernel_pair combine_kernels{};
  };

  // Whether this device can stage a record of every served wire in shared
  // memory; the answer joins the collective config agreement, so every rank
  // fails together.
  static std::string device_limits(const low_latency_config& cfg, int world) {
    if (cfg.num_experts < 1 || cfg.hidden < 1 || cfg.max_topk < 1 || world < 1) return {};
    // Each wire's own record (call_shape sets the wire fields).
    const wire::ll::shape s{
        world, cfg.num_experts, cfg.hidden, cfg.max_topk, cfg.max_tokens_per_rank, 0, false};
    int device = 0, limit = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess)
      return "cannot query the current CUDA device";
    const std::size_t need = std::max({ll_send_shared_bytes(wire::ll::call_shape<Wire>(s)),
                                       ll_send_shared_bytes(wire::ll::call_shape<More>(s))...});
    if (need > static_cast<std::size_t>(limit))
      return "hidden " + std::to_string(cfg.hidden) + " needs " + std::to_string(need) +
             " bytes of shared memory per block to stage a record; the device has " +
             std::to_string(limit);
    return {};
  }

  // recv_tokens [E_local], dispatch_wait_sum [R], combine_wait_sum [R],
  // masked_contributions, then lost [R]: contiguous, so that one copy reads
  // them; reset_stats() clears the first stats_words().
  std::size_t stats_words() const {
    return static_cast<std::size_t>(shape_.local_experts()) + 2 * static_cast<std::size_t>(world_) +
           1;
  }

  // The device's counters into host_stats_, after the work on `stream`.
  void read_counters(cudaStream_t stream, const char* op) {
    calls_.join_comm(stream, op);
    const std::size_t n = stats_words() + static_cast<std::size_t>(world_);
    calls_.check(cudaMemcpyAsync(host_stats_, ws_.recv_tokens, n * sizeof(std::uint64_t),
                                 cudaMemcpyDeviceToHost, stream),
                 op, "cudaMemcpyAsync(counters)");
    calls_.wait_stream(stream, op);
  }

  template <class T>
  T* local(int p, std::size_t offset) {
    return reinterpret_cast<T*>(link_.local_buffer() + wire::ll::parity_base(plan_, p) + offset);
  }

  // Over RMA: see the destructor. Skipped after a failure; bounded.
  void await_last_releases() noexcept {
    if (calls_.broken()) return;
    try {
      std::uint64_t epochs[wire::ll::parities] = {};
      if (cudaMemcpy(epochs, ws_.dispatch_epoch, sizeof epochs, cudaMemcpyDeviceToHost) !=
          cudaSuccess)
        return;
      const deadline dl = deadline::after(timeout_);
      for (int p = 0; p < wire::ll::parities; ++p)
        if (epochs[p] > 0)
          for (int r = 0; r < world_; ++r)
            if ((r != rank_ || !parity_[p].dispatch_pending) && !link_.transport().peer_exited(r))
              link_.transport().wait(
                  wire::ll::released_signal(shape_, p, r), epochs[p], dl,
                  {"low_latency_buffer teardown", r, "release of the last dispatch"});
    } catch (const error&) {
      // A peer failed or left meanwhile: the transport's teardown is bounded.
    }
  }

  static bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

  ll_args base_args(int p, const std::string& cause) {
    ll_args a{};
    a.peers = link_.peers();
    if constexpr (via_proxy) {
      a.route.via_proxy = 1;
      for (int q = 0; q < wire::ll::parities; ++q) a.route.parity[q] = link_.channel(q);
      a.route.abort = link_.channel(wire::ll::parities);
    }
    a.shape = shape_;
    a.plan = plan_;
    a.ws = ws_;
    a.parity = p;
    a.round_scale = round_scale_ ? 1 : 0;
    a.mask_lost_ranks = mask_lost_ranks_ ? 1 : 0;
    a.max_blocks = calls_.block_budget(max_blocks_);
    a.timeout_ns = calls_.timeout_ns();
    calls_.copy_cause(a.host_cause, cause);
    return a;
  }

  // The kernels of `registry` for wire W (combine: bf16 rows).
  template <class W>
  ll_kernel_pair kernels_for(const ll_kernel_registry& registry, const char* op,
                             bool vector_aligned) const {
    constexpr int wire_id = token_traits<W>::id;
    ll_kernel_pair k{};
    if (!registry.find(wire_id, shape_.hidden, vector_aligned, k))
      throw error(rank_, op, no_peer,
                  "no CUDA kernels fit hidden " + std::to_string(shape_.hidden) +
                      " (instantiated: " + registry.describe(wire_id) +
                      "); link a .cu file that uses EPCOMM_CUDA_INSTANTIATE_LOW_LATENCY(epcomm::" +
                      std::string(token_traits<W>::name) +
                      ", 0) (epcomm/low_latency/cuda/instantiate.cuh)");
    return k;
  }

  template <class W>
  ll_device_dispatch_result<W> receive_dispatch(int p, std::uint64_t number, cudaStream_t stream) {
    calls_.ensure_usable(dispatch_op);
    parity_state& st = parity_[p];
    st.expect_dispatch_pending(rank_, number);
    calls_.launch(dispatch_op, st.dispatch_kernels.recv(st.dispatch_args, stream));
    st.dispatch_pending = false;
    ll_device_dispatch_result<W> res;
    res.recv_x = local<const W>(p, plan_.recv_x);
    if constexpr (token_traits<W>::has_scales) {
      if (shape_.scale_layout == ll_scale_layout::ue8m0)
        res.recv_x_scales_ue8m0 = local<const std::int32_t>(p, plan_.recv_scales);
      else
        res.recv_x_scales = local<const float>(p, plan_.recv_scales);
    }
    res.recv_count = local<const std::int32_t>(p, plan_.recv_count);
    res.recv_src = local<const wire::ll::source>(p, plan_.recv_src);
    res.recv_range = local<const wire::ll::range>(p, plan_.recv_range);
    res.handle = {p, number, st.num_tokens, st.topk};
    return res;
  }

  const bf16* receive_combine(int p, std::uint64_t number, cudaStream_t stream) {
    calls_.ensure_usable(combine_op);
    parity_state& st = parity_[p];
    st.expect_combine_pending(rank_, number);
    calls_.launch(combine_op, st.combine_kernels.recv(st.combine_args, stream));
    st.combine_pending = false;
    return st.combine_args.out;
  }

  // The host engine's error for what the kernels reported (device_calls::finish).
  void finish(cudaStream_t stream, const char* op) {
    calls_.finish(
        stream, op,
        [&](const ll_report& r) {
          return r.code == ll_failure::none
                     ? error(rank_, op, no_peer, "an earlier call on this buffer failed")
                 : r.code == ll_failure::proxy ? link_.with_proxy_cause(to_error(r, rank_))
                                               : to_error(r, rank_);
        },
        [](const ll_report& r) { return ll_breaks_buffer(r.code); });
  }

  // The kernels' state, in one device allocation (device_calls::allocate);
  // the pinned stats copy after the host report.
  void allocate_workspace() {
    const std::size_t r = world_;
    const std::size_t el = shape_.local_experts();
    wire::carver regions(16);
    const std::size_t epochs = regions.take(4 * sizeof(std::uint64_t));
    const std::size_t oks = regions.take(4 * sizeof(std::int32_t));
    const std::size_t done =
        regions.take(ll_kernel_count * wire::ll::parities * sizeof(std::uint32_t));
    const std::size_t waits = regions.take(2 * r * sizeof(std::uint64_t));
    const std::size_t decisions = regions.take(2 * wire::ll::parities * r * sizeof(std::uint64_t));
    const std::size_t counter_bytes = (stats_words() + r) * sizeof(std::uint64_t);
    const std::size_t counters = regions.take(counter_bytes);
    // Pinned: the counters' copy, then the exit watch's words.
    const std::size_t exited_bytes = r * sizeof(std::uint64_t);
    calls_.allocate(regions, counter_bytes + exited_bytes, "low_latency_buffer", [&](std::byte* w) {
      ws_.dispatch_epoch = reinterpret_cast<std::uint64_t*>(w + epochs);
      ws_.combine_epoch = ws_.dispatch_epoch + 2;
      ws_.dispatch_ok = reinterpret_cast<std::int32_t*>(w + oks);
      ws_.combine_ok = ws_.dispatch_ok + 2;
      ws_.blocks_done = reinterpret_cast<std::uint32_t*>(w + done);
      ws_.wait_ns = reinterpret_cast<std::uint64_t*>(w + waits);
      ws_.recv_tokens = reinterpret_cast<std::uint64_t*>(w + counters);
      ws_.dispatch_wait_sum = ws_.recv_tokens + el;
      ws_.combine_wait_sum = ws_.dispatch_wait_sum + r;
      ws_.masked_contributions = ws_.combine_wait_sum + r;
      ws_.lost = ws_.masked_contributions + 1;
      ws_.peer_state = reinterpret_cast<std::uint64_t*>(w + decisions);
      ws_.rep = calls_.device_report();
    });
    host_stats_ = reinterpret_cast<std::uint64_t*>(calls_.host_extra());
    // Kernels read the exit watch's words in place (pinned memory is mapped
    // into the device at the same address).
    exited_ = host_stats_ + stats_words() + r;
  }

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  bool round_scale_;
  int max_blocks_;
  bool mask_lost_ranks_;
  wire::ll::shape shape_;
  wire::ll::plan plan_;
  device_link<Transport> link_;
  device_calls<ll_report> calls_;
  parity_state parity_[wire::ll::parities];
  int next_parity_ = 0;
  ll_workspace ws_{};
  std::uint64_t* host_stats_ = nullptr;  // pinned, after the host report
  std::uint64_t* exited_ = nullptr;      // [R] pinned, after the counters' copy (exit_watch)
  exit_watch exit_watch_;                // stops before the memory and transport go
};

}  // namespace epcomm::cuda
