// Correctness of the low-latency CUDA path, on every rank, against:
//   - the independent reference of the test suite (tests/support/ll_reference.hpp);
//   - the host engine (low_latency_buffer<shm::transport>) run on the same
//     inputs in the same processes: packed outputs, the count words and
//     records of the wire format, combine outputs and error messages must be
//     identical, byte for byte;
//   - failures: bad input on one rank (judged on the host or on the device)
//     fails every rank with the host engine's message and leaves the buffer
//     usable; a rank that never shows up makes the others fail at the
//     deadline, naming it; a captured CUDA graph replays correctly.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "correctness.hpp"
#include "device_memory.hpp"
#include "epcomm/bootstrap/local.hpp"
#include "epcomm/low_latency/buffer.hpp"
#include "epcomm/low_latency/cuda/device_buffer.hpp"
#include "epcomm/nvlink_ipc/transport.hpp"
#include "epcomm/shm/transport.hpp"
#include "stream_gate.hpp"
#include "support/ll_reference.hpp"

namespace epcomm::gpu_check {

// Link: the device engine's transport, nvlink_ipc or (through the GPU-fed
// proxy) libfabric / UCX.
template <class Wire, class Link, class... More>
using ll_device_engine = cuda::low_latency_device_buffer<Link, Wire, More...>;
template <class Wire, class... More>
using ll_host_engine = low_latency_buffer<shm::transport, Wire, More...>;

// Both engines of one rank, built from one config, serving Wire and More,
// and the stream the device engine uses.
template <class Wire, class Link, class... More>
struct ll_engines {
  using first_wire = Wire;  // what a check moves when not told
  ll_device_engine<Wire, Link, More...> dev;
  ll_host_engine<Wire, More...> host;
  cudaStream_t stream;
  int rank;

  ll_engines(local_bootstrap& boot, const low_latency_config& cfg, cudaStream_t s)
      : dev(boot, cfg, check_rma_memory), host(boot, cfg), stream(s), rank(boot.rank()) {}

  const wire::ll::shape& shape() const { return host.shape(); }
  bool round = false;  // fp8 scales rounded to powers of two
};

// Device copies of one rank's inputs to a call.
struct ll_device_call {
  device_array<bf16> x;
  device_array<std::int64_t> topk_idx;
  device_array<float> topk_weights;
  int misalign;
  int tokens, topk;

  ll_device_call(const test::rank_input<bf16>& in, int tokens_, int topk_, int misalign_x = 0)
      : x(in.x.size() + misalign_x),
        topk_idx(std::span<const std::int64_t>(in.topk_idx)),
        topk_weights(std::span<const float>(in.topk_weights)),
        misalign(misalign_x),
        tokens(tokens_),
        topk(topk_) {
    if (!in.x.empty())
      cuda::check_cuda(cudaMemcpy(x.data() + misalign, in.x.data(), in.x.size() * sizeof(bf16),
                                  cudaMemcpyHostToDevice),
                       -1, "gpu check", -1, "cudaMemcpy(x)");
  }

  cuda::ll_device_dispatch_input dispatch() const {
    return {tokens, topk, x.data() + misalign, topk_idx.data()};
  }
};

// Host copies of a device dispatch result, viewed as the host engine's
// result type so the test suite's reference can check it.
template <class Wire>
struct ll_snapshot {
  std::vector<Wire> x;
  std::vector<float> scales;
  std::vector<std::int32_t> scales_ue8m0;
  std::vector<std::int32_t> count;
  std::vector<wire::ll::source> src;
  std::vector<wire::ll::range> range;

  ll_snapshot(const cuda::ll_device_dispatch_result<Wire>& r, const wire::ll::shape& s) {
    const std::size_t rows = static_cast<std::size_t>(s.local_experts()) * s.rows_per_expert();
    x = device_array<Wire>::read(r.recv_x, rows * s.hidden);
    if constexpr (token_traits<Wire>::has_scales) {
      if (s.scale_layout == ll_scale_layout::ue8m0)
        scales_ue8m0 =
            device_array<std::int32_t>::read(r.recv_x_scales_ue8m0, wire::ll::recv_scales_words(s));
      else
        scales = device_array<float>::read(r.recv_x_scales, wire::ll::recv_scales_words(s));
    }
    count = device_array<std::int32_t>::read(r.recv_count, s.local_experts());
    src = device_array<wire::ll::source>::read(r.recv_src, rows);
    range = device_array<wire::ll::range>::read(
        r.recv_range, static_cast<std::size_t>(s.local_experts()) * s.world_size);
  }

  ll_dispatch_result<Wire> view() const { return {x, scales, scales_ue8m0, count, src, range, {}}; }
};

// The packed outputs of both engines: counts, ranges and every valid row.
template <class Wire>
std::string compare_dispatch(const ll_dispatch_result<Wire>& h, const ll_snapshot<Wire>& d,
                             const wire::ll::shape& s) {
  const ll_dispatch_result<Wire> dv = d.view();
  if (!same_bytes<std::int32_t>(h.recv_count, d.count)) return "recv_count differs";
  if (!same_bytes<wire::ll::range>(h.recv_range, d.range)) return "recv_range differs";
  const std::size_t rpe = s.rows_per_expert(), hd = s.hidden, ns = s.scales_per_token();
  for (int le = 0; le < s.local_experts(); ++le) {
    const std::size_t first = le * rpe, n = d.count[le];
    if (!same_bytes<Wire>(h.recv_x.subspan(first * hd, n * hd),
                          std::span<const Wire>(d.x).subspan(first * hd, n * hd)))
      return "recv_x of local expert " + std::to_string(le) + " differs";
    for (std::size_t row = 0; row < n; ++row)
      for (std::size_t g = 0; g < ns; ++g) {
        const float a = test::received_scale(h, s.scale_layout, rpe, ns, le, row, g);
        const float b = test::received_scale(dv, s.scale_layout, rpe, ns, le, row, g);
        if (std::memcmp(&a, &b, sizeof a) != 0)
          return "recv_x_scales of local expert " + std::to_string(le) + " differs";
      }
    if (std::memcmp(h.recv_src.data() + first, d.src.data() + first,
                    n * sizeof(wire::ll::source)) != 0)
      return "recv_src of local expert " + std::to_string(le) + " differs";
  }
  return {};
}

// The wire a check moves: W when named, else the engines' first.
template <class W, class Engines>
using call_wire = std::conditional_t<std::is_void_v<W>, typename Engines::first_wire, W>;

// Parity p's region at `offset` of both engines' buffers, `bytes` long.
// (Over an RMA transport the device engine's parities also hold staging,
// so its parity 1 starts further on.)
template <class Engines>
std::pair<std::vector<std::byte>, const std::byte*> regions(Engines& e, int p, std::size_t offset,
                                                            std::size_t bytes) {
  const std::size_t host_at = wire::ll::parity_base(wire::ll::plan_buffer(e.shape()), p) + offset;
  const std::size_t dev_at = wire::ll::parity_base(e.dev.plan(), p) + offset;
  return {device_array<std::byte>::read(e.dev.local_device_buffer() + dev_at, bytes),
          e.host.transport().local_buffer().data() + host_at};
}

// The wire format itself, as written into this rank by its peers: the count
// words of dispatch parity p and the meaningful bytes (header, payload,
// scales) of every record they announce, laid out in the call's wire.
template <class Wire, class Engines>
std::string compare_dispatch_wire(Engines& e, int p) {
  const wire::ll::shape s = wire::ll::call_shape<Wire>(e.shape());
  const wire::ll::plan plan = wire::ll::plan_buffer(e.shape());
  const std::size_t nwords = static_cast<std::size_t>(s.local_experts()) * s.world_size;
  const auto [dev_words, host_words] =
      regions(e, p, plan.dispatch_counts, nwords * sizeof(wire::ll::count_word));
  if (std::memcmp(dev_words.data(), host_words, dev_words.size()) != 0)
    return "dispatch count words differ (wire format)";
  const std::size_t meaningful = wire::ll::scales_offset(s) + sizeof(float) * s.scales_per_token();
  const auto [dev_records, host_records] =
      regions(e, p, plan.dispatch_recv, nwords * plan.record_region_bytes);
  const auto* words = reinterpret_cast<const wire::ll::count_word*>(host_words);
  for (int le = 0; le < s.local_experts(); ++le)
    for (int src = 0; src < s.world_size; ++src)
      for (int i = 0; i < words[le * s.world_size + src].count; ++i) {
        const std::size_t at = wire::ll::record_offset(s, plan, le, src, i);
        if (std::memcmp(dev_records.data() + at, host_records + at, meaningful) != 0)
          return "record " + std::to_string(i) + " of region (expert " + std::to_string(le) +
                 ", source " + std::to_string(src) + ") differs (wire format)";
      }
  return {};
}

template <class Engines>
std::string compare_combine_wire(Engines& e, int p) {
  const wire::ll::plan plan = wire::ll::plan_buffer(e.shape());
  const auto [dev_words, host_words] =
      regions(e, p, plan.combine_counts, e.shape().world_size * sizeof(wire::ll::count_word));
  if (std::memcmp(dev_words.data(), host_words, dev_words.size()) != 0)
    return "combine count words differ (wire format)";
  return {};
}

// One call in flight on both engines: inputs, then results as they come.
template <class Wire>
struct ll_flight {
  test::ll_call call;
  test::ll_call reference;  // what the reference checks against: `call` unless a rank was lost
  ll_device_call din;
  bool zero_copy;
  ll_dispatch_result<Wire> hres{};
  cuda::ll_device_dispatch_result<Wire> dres{};
  device_array<bf16> dy{};
  std::vector<bf16> own_y{};
  std::span<const bf16> hy{};

  ll_flight(const test::ll_call& c, int rank, bool zero_copy_, int misalign = 0)
      : call(c),
        reference(c),
        din(c.in[rank], c.tokens[rank], c.topk, misalign),
        zero_copy(zero_copy_) {}
};

template <class Wire>
ll_dispatch_input host_input(const ll_flight<Wire>& f, int rank) {
  return {f.call.tokens[rank], f.call.topk, f.call.in[rank].x, f.call.in[rank].topk_idx};
}

// Checks a received dispatch against the reference, the host engine and the
// wire, then prepares the expert outputs (the same on both engines).
template <class Wire, class Engines>
std::string after_dispatch(Engines& e, ll_flight<Wire>& f) {
  e.dev.synchronize(e.stream);
  const wire::ll::shape s = wire::ll::call_shape<Wire>(e.shape());
  const ll_snapshot<Wire> d(f.dres, s);
  if (auto err = test::check_ll_dispatch(f.reference, e.rank, s.world_size, s.max_tokens_per_rank,
                                         e.round, d.view(), s.scale_layout);
      !err.empty())
    return "dispatch: " + err;
  if (auto err = compare_dispatch(f.hres, d, s); !err.empty())
    return "dispatch vs host engine: " + err;
  if (f.dres.handle.parity != f.hres.handle.parity) return "the engines used different parities";
  if (auto err = compare_dispatch_wire<Wire>(e, f.hres.handle.parity); !err.empty()) return err;

  const std::size_t n =
      static_cast<std::size_t>(s.local_experts()) * s.rows_per_expert() * s.hidden;
  std::vector<bf16> y(n);
  test::ll_expert_rows(f.hres, e.rank, s.local_experts(), s.hidden, s.rows_per_expert(),
                       std::span<bf16>(y), s.scale_layout);
  if (f.zero_copy) {
    auto hy = e.host.combine_send_buffer(f.hres.handle);
    std::copy(y.begin(), y.end(), hy.begin());
    f.hy = hy;
    cuda::check_cuda(cudaMemcpy(e.dev.combine_send_buffer(f.dres.handle), y.data(),
                                n * sizeof(bf16), cudaMemcpyHostToDevice),
                     e.rank, "gpu check", no_peer, "cudaMemcpy(combine_send_buffer)");
  } else {
    f.own_y = y;
    f.hy = f.own_y;
    f.dy = device_array<bf16>(std::span<const bf16>(y));
  }
  return {};
}

template <class Wire, class Engines>
cuda::ll_device_combine_input device_combine(Engines& e, const ll_flight<Wire>& f) {
  return {f.zero_copy ? e.dev.combine_send_buffer(f.dres.handle) : f.dy.data(),
          f.din.topk_idx.data(), f.din.topk_weights.data()};
}

template <class Wire>
ll_combine_input host_combine(const ll_flight<Wire>& f, int rank) {
  return {f.hy, f.call.in[rank].topk_idx, f.call.in[rank].topk_weights};
}

template <class Wire, class Engines>
std::string after_combine(Engines& e, const ll_flight<Wire>& f, std::span<const bf16> hout,
                          const bf16* dout) {
  e.dev.synchronize(e.stream);
  const std::size_t n = static_cast<std::size_t>(f.call.tokens[e.rank]) * e.shape().hidden;
  const auto got = device_array<bf16>::read(dout, n);
  if (!same_bytes<bf16>(got, hout)) return "combine output differs from the host engine's";
  if (auto err = test::check_ll_combine<Wire>(f.reference, e.rank, e.round, got); !err.empty())
    return "combine: " + err;
  return compare_combine_wire(e, f.hres.handle.parity);
}

// One dispatch on wire W (the engines' first unless named) and combine on
// both engines, one-shot.
template <class W = void, class Engines>
std::string run_ll_call(Engines& e, const test::ll_call& call, bool zero_copy, int misalign = 0) {
  using Wire = call_wire<W, Engines>;
  ll_flight<Wire> f(call, e.rank, zero_copy, misalign);
  f.hres = e.host.template low_latency_dispatch<Wire>(host_input(f, e.rank));
  f.dres = e.dev.template dispatch<Wire>(f.din.dispatch(), e.stream);
  if (auto err = after_dispatch(e, f); !err.empty()) return err;
  const auto hout = e.host.low_latency_combine(host_combine(f, e.rank), f.hres.handle);
  const bf16* dout = e.dev.combine(device_combine(e, f), f.dres.handle, e.stream).out;
  return after_combine(e, f, hout, dout);
}

// call_stream on the low-latency device buffer: a dispatch, then a combine,
// each on the communication stream after an event and asynchronous, over
// input zeroed and copied behind a gate (check_after_event), then checked
// as run_ll_call checks them.
template <class Wire, class Link>
std::string check_ll_call_stream(ll_engines<Wire, Link>& e, const test::ll_call& call) {
  ll_flight<Wire> f(call, e.rank, false);
  f.hres = e.host.low_latency_dispatch(host_input(f, e.rank));
  if (auto err = check_after_event(
          e.stream, e.rank,
          [&] { copy_over_zeros<bf16>(e.stream, e.rank, f.din.x.data(), call.in[e.rank].x); },
          [&](const cuda::call_stream& on) {
            f.dres = e.dev.dispatch(f.din.dispatch(), on);
            return f.dres.event;
          });
      !err.empty())
    return "dispatch: " + err;
  if (auto err = after_dispatch(e, f); !err.empty()) return err;
  const auto hout = e.host.low_latency_combine(host_combine(f, e.rank), f.hres.handle);
  const bf16* dout = nullptr;
  if (auto err = check_after_event(
          e.stream, e.rank, [&] { copy_over_zeros<bf16>(e.stream, e.rank, f.dy.data(), f.own_y); },
          [&](const cuda::call_stream& on) {
            auto r = e.dev.combine(device_combine(e, f), f.dres.handle, on);
            dout = r.out;
            return r.event;
          });
      !err.empty())
    return "combine: " + err;
  return after_combine(e, f, hout, dout);
}

// Two calls in flight with split phases: both sends, then the receives in
// reverse order, on both engines.
// Two calls in flight, A on one parity on wire WA and B on the other on WB
// (the engines' first unless named), each phase run in reverse order.
template <class WA = void, class WB = WA, class Engines>
std::string run_ll_two_in_flight(Engines& e, const test::ll_call& a, const test::ll_call& b) {
  using A = call_wire<WA, Engines>;
  using B = call_wire<WB, Engines>;
  ll_flight<A> fa(a, e.rank, true);
  ll_flight<B> fb(b, e.rank, false);
  auto ha = e.host.template low_latency_dispatch_send<A>(host_input(fa, e.rank));
  auto hb = e.host.template low_latency_dispatch_send<B>(host_input(fb, e.rank));
  fb.hres = hb();
  fa.hres = ha();
  auto da = e.dev.template dispatch_send<A>(fa.din.dispatch(), e.stream);
  auto db = e.dev.template dispatch_send<B>(fb.din.dispatch(), e.stream);
  fb.dres = db();
  fa.dres = da();
  if (auto err = after_dispatch(e, fa); !err.empty()) return "A: " + err;
  if (auto err = after_dispatch(e, fb); !err.empty()) return "B: " + err;
  auto hca = e.host.low_latency_combine_send(host_combine(fa, e.rank), fa.hres.handle);
  auto hcb = e.host.low_latency_combine_send(host_combine(fb, e.rank), fb.hres.handle);
  const auto hout_b = hcb();
  const auto hout_a = hca();
  auto dca = e.dev.combine_send(device_combine(e, fa), fa.dres.handle, e.stream);
  auto dcb = e.dev.combine_send(device_combine(e, fb), fb.dres.handle, e.stream);
  const bf16* dout_b = dcb();
  const bf16* dout_a = dca();
  if (auto err = after_combine(e, fb, hout_b, dout_b); !err.empty()) return "B: " + err;
  if (auto err = after_combine(e, fa, hout_a, dout_a); !err.empty()) return "A: " + err;
  return {};
}

struct caught {
  std::string what;
  int peer = -2;
};

inline caught catch_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const error& e) {
    return {e.what(), e.peer()};
  }
  return {};
}

// Both engines must fail the same way: the same message and the same peer.
inline std::string same_failure(const caught& host, const caught& dev, const std::string& what) {
  if (host.what.empty()) return what + ": the host engine accepted it";
  if (dev.what != host.what || dev.peer != host.peer)
    return what + ": device error '" + dev.what + "' (peer " + std::to_string(dev.peer) +
           ") differs from the host engine's '" + host.what + "' (peer " +
           std::to_string(host.peer) + ")";
  return {};
}

// Bad input on the last rank, judged on the host (too many tokens, a stale
// handle) or on the device (an expert id out of range, a topk_idx that is
// not the dispatched one): every rank gets the host engine's error, and the
// buffer serves the next call.
template <class Wire, class Link>
std::string check_ll_bad_input(ll_engines<Wire, Link>& e, std::uint64_t seed) {
  const wire::ll::shape& s = e.shape();
  const int world = s.world_size, rank = e.rank, culprit = world - 1;
  const int max = s.max_tokens_per_rank;
  const std::vector<int> all_max(world, max);
  auto still_works = [&](std::uint64_t sd) {
    return run_ll_call(
        e,
        test::make_ll_call(world, s.hidden, 2, s.num_experts, all_max, test::routing::random, sd),
        sd % 2 == 0);
  };

  {  // Too many tokens: judged on the culprit's host, before any kernel.
    auto call = test::make_ll_call(world, s.hidden, 2, s.num_experts,
                                   std::vector<int>(world, max + 1), test::routing::random, seed);
    const int tokens = rank == culprit ? max + 1 : max;
    auto& in = call.in[rank];
    in.x.resize(static_cast<std::size_t>(tokens) * s.hidden);
    in.topk_idx.resize(static_cast<std::size_t>(tokens) * 2);
    const caught h = catch_error([&] {
      e.host.low_latency_dispatch({tokens, 2, in.x, in.topk_idx});
    });
    const ll_device_call din(in, tokens, 2);
    const caught d = catch_error([&] {
      e.dev.dispatch(din.dispatch(), e.stream);
      e.dev.synchronize(e.stream);
    });
    if (auto err = same_failure(h, d, "too many tokens"); !err.empty()) return err;
    if (auto err = still_works(seed + 1); !err.empty()) return "after too many tokens: " + err;
  }
  {  // An expert id out of range: judged by the culprit's send kernel.
    auto call = test::make_ll_call(world, s.hidden, 2, s.num_experts, all_max,
                                   test::routing::random, seed + 2);
    auto& in = call.in[rank];
    if (rank == culprit) in.topk_idx[5] = s.num_experts;  // token 2, slot 1
    const caught h = catch_error([&] { e.host.low_latency_dispatch({max, 2, in.x, in.topk_idx}); });
    const ll_device_call din(in, max, 2);
    const caught d = catch_error([&] {
      e.dev.dispatch(din.dispatch(), e.stream);
      e.dev.synchronize(e.stream);
    });
    if (auto err = same_failure(h, d, "invalid expert id"); !err.empty()) return err;
    if (d.what.find("topk_idx[2][1] = " + std::to_string(s.num_experts) + " is outside") ==
        std::string::npos)
      return "invalid expert id: unexpected message " + d.what;
    if (auto err = still_works(seed + 3); !err.empty()) return "after an invalid expert: " + err;
  }
  {  // A topk_idx in combine that differs from the dispatched one.
    const auto call = test::make_ll_call(world, s.hidden, 2, s.num_experts, all_max,
                                         test::routing::random, seed + 4);
    ll_flight<Wire> f(call, rank, true);
    f.hres = e.host.low_latency_dispatch(host_input(f, rank));
    f.dres = e.dev.dispatch(f.din.dispatch(), e.stream);
    if (auto err = after_dispatch(e, f); !err.empty()) return "before a bad combine: " + err;
    auto changed = call.in[rank].topk_idx;
    if (rank == culprit) changed[3] = changed[3] == 0 ? 1 : 0;
    const caught h = catch_error([&] {
      e.host.low_latency_combine({f.hy, changed, call.in[rank].topk_weights}, f.hres.handle);
    });
    const device_array<std::int64_t> dchanged{std::span<const std::int64_t>(changed)};
    const caught d = catch_error([&] {
      e.dev.combine(
          {e.dev.combine_send_buffer(f.dres.handle), dchanged.data(), f.din.topk_weights.data()},
          f.dres.handle, e.stream);
      e.dev.synchronize(e.stream);
    });
    if (auto err = same_failure(h, d, "changed topk_idx"); !err.empty()) return err;
    if (auto err = still_works(seed + 5); !err.empty()) return "after a bad combine: " + err;
  }
  {  // A stale handle: judged on every rank's host.
    const auto call = test::make_ll_call(world, s.hidden, 2, s.num_experts, all_max,
                                         test::routing::random, seed + 6);
    const auto& in = call.in[rank];
    const ll_device_call din(in, max, 2);
    const auto first_h = e.host.low_latency_dispatch({max, 2, in.x, in.topk_idx});
    const auto first_d = e.dev.dispatch(din.dispatch(), e.stream);
    for (int i = 0; i < 2; ++i) {
      e.host.low_latency_dispatch({max, 2, in.x, in.topk_idx});
      e.dev.dispatch(din.dispatch(), e.stream);
    }
    const caught h = catch_error([&] {
      e.host.low_latency_combine(
          {e.host.combine_send_buffer(first_h.handle), in.topk_idx, in.topk_weights},
          first_h.handle);
    });
    const caught d = catch_error([&] {
      e.dev.combine(
          {e.dev.combine_send_buffer(first_d.handle), din.topk_idx.data(), din.topk_weights.data()},
          first_d.handle, e.stream);
    });
    if (auto err = same_failure(h, d, "stale handle"); !err.empty()) return err;
    if (auto err = still_works(seed + 7); !err.empty()) return "after a stale handle: " + err;
  }
  return {};
}

// Dispatch and combine captured into a CUDA graph and replayed: every replay
// must give the host engine's results, because epochs and verdicts live on
// the device.
template <class Wire, class Link>
std::string check_ll_graph_replay(ll_engines<Wire, Link>& e, std::uint64_t seed) {
  const wire::ll::shape& s = e.shape();
  const auto call = test::make_ll_call(s.world_size, s.hidden, 4, s.num_experts,
                                       std::vector<int>(s.world_size, s.max_tokens_per_rank),
                                       test::routing::random, seed);
  ll_flight<Wire> f(call, e.rank, false);
  f.hres = e.host.low_latency_dispatch(host_input(f, e.rank));
  const std::size_t n =
      static_cast<std::size_t>(s.local_experts()) * s.rows_per_expert() * s.hidden;
  f.own_y.resize(n);
  test::ll_expert_rows(f.hres, e.rank, s.local_experts(), s.hidden, s.rows_per_expert(),
                       std::span<bf16>(f.own_y), s.scale_layout);
  f.hy = f.own_y;
  f.dy = device_array<bf16>(std::span<const bf16>(f.own_y));
  const auto hout = e.host.low_latency_combine(host_combine(f, e.rank), f.hres.handle);
  const std::vector<bf16> want(hout.begin(), hout.end());

  const auto check = [&](cudaError_t st, const char* what) {
    cuda::check_cuda(st, e.rank, "gpu check", no_peer, what);
  };
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(e.stream, cudaStreamCaptureModeThreadLocal),
        "cudaStreamBeginCapture");
  f.dres = e.dev.dispatch(f.din.dispatch(), e.stream);
  const bf16* dout = e.dev.combine(device_combine(e, f), f.dres.handle, e.stream).out;
  check(cudaStreamEndCapture(e.stream, &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  std::string failure;
  for (int replay = 0; replay < 3 && failure.empty(); ++replay) {
    check(cudaGraphLaunch(exec, e.stream), "cudaGraphLaunch");
    e.dev.synchronize(e.stream);
    const ll_snapshot<Wire> d(f.dres, s);
    const auto out = device_array<bf16>::read(dout, want.size());
    if (auto err = compare_dispatch(f.hres, d, s); !err.empty())
      failure = "replay " + std::to_string(replay) + ": dispatch: " + err;
    else if (!same_bytes<bf16>(out, want))
      failure = "replay " + std::to_string(replay) + ": combine differs from the host engine's";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return failure;
}

// Token counts per rank for a call: all `n`, or (n < 0) drawn in [0, max].
inline std::vector<int> ll_tokens(int world, int n, int max, std::uint64_t seed) {
  std::vector<int> t(world, n);
  if (n < 0)
    for (int r = 0; r < world; ++r) t[r] = static_cast<int>(test::hash(seed, r, 0x70) % (max + 1));
  return t;
}

// Every scenario for one wire type on `world` ranks: the hidden-specialised
// shape (7168) and a generic one (bf16: 200 channels, rows that are not whole
// 16-byte vectors, and a misaligned x; fp8: 384 with scales rounded to
// powers of two).
template <class Wire, class Link = nvlink_ipc::transport>
int check_ll_rank(local_bootstrap& boot, bool quick, int max_blocks = 0) {
  constexpr bool fp8 = token_traits<Wire>::has_scales;
  rank_check rc(boot.rank());
  const int world = boot.world_size();
  const cudaStream_t stream = rc.stream;
  const std::string dtype = "ll " + std::string(token_traits<Wire>::name) + " ";
  auto fail_if = [&](const std::string& what, const std::string& err) {
    rc.note(dtype + what, err);
  };
  struct shape_case {
    int hidden;
    bool round_scale;
    ll_scale_layout layout;
  };
  // fp8: DeepEP's two layouts, so the kernels write both (the host engine's
  // tests cover row_major).
  const shape_case shapes[] = {
      {7168, false, fp8 ? ll_scale_layout::token_major : ll_scale_layout::row_major},
      {fp8 ? 384 : 200, fp8, fp8 ? ll_scale_layout::ue8m0 : ll_scale_layout::row_major}};
  for (const shape_case& sc : shapes) {
    low_latency_config cfg{8 * world, sc.hidden, 8, 32, sc.round_scale, std::chrono::seconds(60)};
    cfg.scale_layout = sc.layout;
    cfg.max_blocks = max_blocks;
    ll_engines<Wire, Link> e(boot, cfg, stream);
    e.round = sc.round_scale;
    const int max = cfg.max_tokens_per_rank, experts = cfg.num_experts;
    const std::string tag = "H=" + std::to_string(sc.hidden);
    using test::routing;
    auto make = [&](int tokens, int topk, routing route, std::uint64_t seed, bool repeat = false) {
      return test::make_ll_call(world, sc.hidden, topk, experts,
                                ll_tokens(world, tokens, max, seed), route, seed, repeat);
    };
    try {
      fail_if(tag + " full", run_ll_call(e, make(max, 8, routing::random, 1), false));
      fail_if(tag + " uneven, zero copy", run_ll_call(e, make(-1, 8, routing::uneven, 2), true));
      // Half the tokens: a token may name an expert twice, so no expert is
      // named more than max times even when one rank holds every expert.
      fail_if(tag + " repeated expert",
              run_ll_call(e, make(max / 2, 6, routing::random, 3, true), true));
      if (!fp8 && sc.hidden == 200)
        fail_if(tag + " misaligned x", run_ll_call(e, make(7, 3, routing::random, 4), false, 1));
      if (sc.hidden != 7168 || quick) continue;
      fail_if(tag + " one expert", run_ll_call(e, make(max, 1, routing::one_expert, 5), false));
      fail_if(tag + " nothing routed", run_ll_call(e, make(max, 4, routing::none, 6), true));
      fail_if(tag + " no tokens", run_ll_call(e, make(0, 2, routing::random, 7), false));
      fail_if(tag + " one token", run_ll_call(e, make(1, 8, routing::random, 8), true));
      fail_if(tag + " two in flight", run_ll_two_in_flight(e, make(-1, 8, routing::random, 9),
                                                           make(-1, 5, routing::uneven, 10)));
      fail_if(tag + " call stream", check_ll_call_stream(e, make(max, 8, routing::random, 11)));
      fail_if(tag + " bad input", check_ll_bad_input(e, 20));
      // Both engines counted the same rows per local expert (rejected calls
      // count nothing). Before the graph, whose replays only the device runs.
      if (e.dev.stats(stream).recv_tokens_per_expert != e.host.stats().recv_tokens_per_expert)
        fail_if(tag + " stats", "rows received per expert differ from the host engine's");
      fail_if(tag + " graph replay", check_ll_graph_replay(e, 40));
    } catch (const error& ex) {
      fail_if(tag, std::string("threw: ") + ex.what());
    }
  }
  return rc.exit_code();
}

// The last rank never calls dispatch (rank 0 fails at its deadline, the
// others through its abort relay) or its process exits (every other rank
// fails at once): absent_peer.hpp. All name it; everyone refuses further
// calls; nobody hangs.
template <class Link = nvlink_ipc::transport, absence How = absence::silent>
int check_ll_absent_peer(local_bootstrap& boot) {
  const int rank = boot.rank(), world = boot.world_size();
  const int absent = world - 1;
  const absent_peer_plan plan{rank, absent, How};
  use_device(rank);
  const low_latency_config cfg{2 * world, 256, 2, 16, false, plan.timeout()};
  int code = 0;
  {
    ll_device_engine<bf16, Link> dev(boot, cfg, check_rma_memory);
    if (How == absence::exited) {
      boot.barrier(deadline::after(std::chrono::seconds(60)));  // every rank has its buffer
      if (rank == absent) std::_Exit(0);
    }
    if (rank != absent) {
      const auto call = test::make_ll_call(world, 256, 2, cfg.num_experts,
                                           std::vector<int>(world, 16), test::routing::random, 31);
      const ll_device_call din(call.in[rank], 16, 2);
      const auto start = steady::now();
      const caught c = catch_error([&] {
        dev.dispatch(din.dispatch());
        dev.synchronize();
      });
      if (const std::string bad =
              plan.verdict(c.what, c.peer, steady::now() - start, "dispatch records");
          !bad.empty()) {
        std::fprintf(stderr, "rank %d FAIL [ll absent peer]: %s\n", rank, bad.c_str());
        code = 1;
      }
      const caught again = catch_error([&] { dev.dispatch(din.dispatch()); });
      if (again.what.find("unusable after an earlier failure") == std::string::npos) {
        std::fprintf(stderr, "rank %d FAIL [ll absent peer]: a broken buffer said '%s'\n", rank,
                     again.what.c_str());
        code = 1;
      }
    }
    // The absent rank keeps its memory mapped until the others are done.
    if (How == absence::silent) boot.barrier(deadline::after(std::chrono::seconds(120)));
  }
  return code;
}

// When the lost rank of check_ll_lost_rank goes, counted in its own calls.
enum class ll_loss {
  after_a_call,    // returns after its first call: its buffers and transports close
  at_dispatch,     // exits as its second dispatch starts (the survivors are in theirs)
  before_combine,  // exits once its second dispatch has landed everywhere, before combining
};

// mask_lost_ranks on the device path: the last rank leaves as `how` says and
// the survivors go on without it, the device engine as the host engine does
// (over shm, in the same processes, masking it too): every later call
// matches it byte for byte and the reference without the lost rank's
// experts, both count the contributions that implies, and both name the
// rank in lost_ranks().
template <class Link = nvlink_ipc::transport>
int check_ll_lost_rank(local_bootstrap& boot, ll_loss how) {
  rank_check rc(boot.rank());
  const int rank = rc.rank, world = boot.world_size();
  const int lost = world - 1;
  constexpr int hidden = 256, topk = 4, tokens = 12;
  low_latency_config cfg{2 * world, hidden, topk, 16, false, std::chrono::seconds(30)};
  cfg.mask_lost_ranks = true;
  const int el = cfg.num_experts / world;
  const auto make = [&](std::uint64_t seed) {
    return test::make_ll_call(world, hidden, topk, cfg.num_experts, std::vector<int>(world, tokens),
                              test::routing::random, seed);
  };
  const auto note = [&](int call, const std::string& err) {
    rc.note("ll lost rank, call " + std::to_string(call), err);
  };
  ll_engines<bf16, Link> e(boot, cfg, rc.stream);
  note(0, run_ll_call(e, make(60), false));
  // Every rank has its first call's results: the loss falls within the later calls.
  boot.barrier(deadline::after(std::chrono::seconds(60)));
  if (rank == lost && how == ll_loss::after_a_call) return rc.exit_code();
  if (rank == lost && how == ll_loss::at_dispatch) std::_Exit(rc.exit_code());
  std::uint64_t masked = 0;  // contributions of this rank that the reference leaves out
  for (int i = 1; i < 4 && rc.failures == 0; ++i) {
    ll_flight<bf16> f(make(60 + i), rank, i % 2 == 0);
    // Before its combine, the lost rank's dispatch was whole.
    const bool dispatched_whole = how == ll_loss::before_combine && i == 1;
    if (!dispatched_whole) masked += test::without_rank(f.reference, lost, el, rank);
    try {
      f.hres = e.host.low_latency_dispatch(host_input(f, rank));
      f.dres = e.dev.dispatch(f.din.dispatch(), e.stream);
      note(i, after_dispatch(e, f));
      if (dispatched_whole) {
        boot.barrier(deadline::after(std::chrono::seconds(60)));  // every dispatch has landed
        if (rank == lost) std::_Exit(rc.exit_code());
      }
      masked += test::without_rank(f.reference, lost, el, rank);  // 0 once applied
      const auto hout = e.host.low_latency_combine(host_combine(f, rank), f.hres.handle);
      const bf16* dout = e.dev.combine(device_combine(e, f), f.dres.handle, e.stream).out;
      note(i, after_combine(e, f, hout, dout));
    } catch (const error& ex) {
      note(i, std::string("threw: ") + ex.what());
    }
  }
  if (rc.failures != 0) return rc.exit_code();
  const std::uint64_t on_device = e.dev.stats(rc.stream).masked_contributions;
  const std::uint64_t on_host = e.host.stats().masked_contributions;
  if (on_device != masked || on_host != masked)
    note(3, "masked contributions: device " + std::to_string(on_device) + ", host engine " +
                std::to_string(on_host) + ", expected " + std::to_string(masked));
  for (const auto& [engine, ranks] :
       {std::pair{"device", e.dev.lost_ranks()}, std::pair{"host", e.host.lost_ranks()}})
    if (ranks != std::vector<int>{lost})
      note(3, std::string(engine) + " engine's lost_ranks() names " + std::to_string(ranks.size()) +
                  " ranks, not rank " + std::to_string(lost) + " alone");
  // Random routing must have reached the lost rank's experts: otherwise
  // nothing above was masked and the checks prove nothing.
  if (masked == 0) note(3, "no contribution was masked");
  return rc.exit_code();
}

}  // namespace epcomm::gpu_check
