// Correctness of the CUDA path against the host, on every rank:
//   - the independent reference of the test suite (tests/support/reference.hpp);
//   - the host engine (buffer<shm::transport>) run on the same inputs in the
//     same processes: received arrays, the notify slots of the wire format,
//     combine outputs and error messages must be identical, byte for byte;
//   - failures: bad input on one rank fails every rank with the host
//     engine's message and leaves the buffer usable; a rank that never shows
//     up makes the others fail at the deadline, naming it, instead of hanging.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absent_peer.hpp"
#include "device_memory.hpp"
#include "epcomm/bootstrap/local.hpp"
#include "epcomm/normal/buffer.hpp"
#include "epcomm/normal/cuda/device_buffer.hpp"
#include "epcomm/nvlink_ipc/transport.hpp"
#include "epcomm/shm/transport.hpp"
#include "stream_gate.hpp"
#include "support/reference.hpp"

namespace epcomm::gpu_check {

// Link: the device engine's transport, nvlink_ipc or (through the GPU-fed
// proxy) libfabric / UCX.
template <class Token, class Link>
using device_engine = cuda::device_buffer<Link, Token>;

// Over libfabric / UCX the check places the device engines' buffers in host
// memory mapped into the device: the fabric libraries of a stock system
// have no CUDA support (FI_HMEM), and the protocol and the kernels' paths
// are the same; only the bytes cross PCIe.
inline constexpr proxy::memory_kind check_rma_memory = proxy::memory_kind::host;
template <class Token>
using host_engine = buffer<shm::transport, Token>;

// One GPU per rank where there are enough; otherwise ranks share them.
inline int use_device(int rank) {
  int n = 0;
  cuda::check_cuda(cudaGetDeviceCount(&n), rank, "gpu check", no_peer, "cudaGetDeviceCount");
  cuda::check_cuda(cudaSetDevice(rank % n), rank, "gpu check", no_peer, "cudaSetDevice");
  return n;
}

struct scenario {
  test::shape shape;
  int bound = 0;       // worst-case receive bound: the asynchronous path
  bool bias = false;   // combine with bias_0 and bias_1
  int misalign_x = 0;  // x starts this many elements past a 16-byte boundary
  int alignment = 1;   // expert_alignment
};

inline std::string describe(const scenario& sc, const char* dtype) {
  std::string s = test::describe(sc.shape, dtype);
  if (sc.bound) s += " bound=" + std::to_string(sc.bound);
  if (sc.bias) s += " bias";
  if (sc.misalign_x) s += " misaligned";
  if (sc.alignment > 1) s += " expert_alignment=" + std::to_string(sc.alignment);
  return s;
}

// Byte equality; empty spans (whose data() may be null, which memcmp must
// not see) are equal.
template <class T>
bool same_bytes(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

template <class T>
std::vector<T> bias_rows(const test::shape& s, int rank, int which) {
  std::vector<T> b(static_cast<std::size_t>(s.tokens) * s.hidden);
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = from_float<T>(test::uniform(test::hash(s.seed, rank, i, 100 + which)));
  return b;
}

// Device copies of one rank's dispatch input.
template <class Token>
struct device_input {
  device_array<Token> x;
  device_array<float> scales;
  device_array<std::int64_t> topk_idx;
  device_array<float> topk_weights;
  int misalign;

  device_input(const test::rank_input<Token>& in, int misalign_x)
      : x(in.x.size() + misalign_x),
        scales(std::span<const float>(in.scales)),
        topk_idx(std::span<const std::int64_t>(in.topk_idx)),
        topk_weights(std::span<const float>(in.topk_weights)),
        misalign(misalign_x) {
    if (!in.x.empty())
      cuda::check_cuda(cudaMemcpy(x.data() + misalign, in.x.data(), in.x.size() * sizeof(Token),
                                  cudaMemcpyHostToDevice),
                       -1, "gpu check", -1, "cudaMemcpy(x)");
  }

  cuda::device_dispatch_input<Token> view(const test::shape& s) const {
    return {s.tokens,
            s.hidden,
            s.topk,
            x.data() + misalign,
            scales.size() ? scales.data() : nullptr,
            topk_idx.data(),
            topk_weights.data()};
  }
};

// Host copies of a device dispatch result, shaped as the host engine's.
template <class Token>
struct downloaded {
  std::vector<Token> x;
  std::vector<float> scales;
  std::vector<std::int64_t> idx;
  std::vector<float> weights;
  std::vector<std::int32_t> src;
  dispatch_result<Token> view;
};

template <class Token>
downloaded<Token> download(const cuda::device_dispatch_result<Token>& r, int num_recv, int rows,
                           const test::shape& s, const std::vector<int>& per_expert) {
  downloaded<Token> d;
  const std::size_t n = rows, h = s.hidden, k = s.topk;
  d.x = device_array<Token>::read(r.recv_x, n * h);
  if constexpr (token_traits<Token>::has_scales)
    d.scales = device_array<float>::read(r.recv_x_scales, n * (h / 128));
  d.idx = device_array<std::int64_t>::read(r.recv_topk_idx, n * k);
  d.weights = device_array<float>::read(r.recv_topk_weights, n * k);
  d.src = device_array<std::int32_t>::read(r.recv_src_idx, n);
  d.view.num_recv_tokens = num_recv;
  d.view.recv_x = d.x;
  d.view.recv_x_scales = d.scales;
  d.view.recv_topk_idx = d.idx;
  d.view.recv_topk_weights = d.weights;
  d.view.recv_src_idx = d.src;
  d.view.num_recv_tokens_per_expert = per_expert;
  return d;
}

// Runs one scenario of Token on both engines, each serving Token among
// others or alone; returns what differs, or "".
template <class Token, class Device, class Host>
std::string run_scenario(int rank, Device& dev, Host& host, const scenario& sc,
                         cudaStream_t stream) {
  using Out = combine_type_t<Token>;
  const test::shape& s = sc.shape;
  std::vector<test::rank_input<Token>> all;
  for (int r = 0; r < s.world; ++r) all.push_back(test::make_input<Token>(s, r));
  const auto& mine = all[rank];

  const auto hres = host.template dispatch<Token>(
      {s.tokens, s.hidden, s.topk, mine.x, mine.scales, mine.topk_idx, mine.topk_weights},
      {sc.bound, sc.alignment});
  const device_input<Token> din(mine, sc.misalign_x);
  auto dres = dev.dispatch(din.view(s), {sc.bound, sc.alignment}, stream);
  if (sc.bound > 0) {
    if (dres.num_recv_tokens != -1) return "a bounded dispatch synchronised";
    dev.synchronize(stream);
  }
  const int num_recv = device_array<std::int32_t>::read(dres.num_recv_tokens_device, 1)[0];
  const auto per_expert =
      device_array<std::int32_t>::read(dres.num_recv_tokens_per_expert, s.experts / s.world);
  const int rows = sc.bound > 0 ? sc.bound : num_recv;
  if (sc.bound == 0 && dres.rows != num_recv) return "result rows differ from the received count";
  const auto d =
      download(dres, num_recv, rows, s, std::vector<int>(per_expert.begin(), per_expert.end()));

  if (auto e = test::check_dispatch(s, rank, all, d.view, -1, sc.alignment); !e.empty())
    return "dispatch: " + e;
  if (num_recv != hres.num_recv_tokens) return "received count differs from the host engine's";
  // Token rows past the received count hold whatever earlier calls left
  // there; the padded metadata is defined and compared in full.
  const std::size_t n = num_recv;
  const std::size_t ns = token_traits<Token>::has_scales ? s.hidden / 128 : 0;
  if (hres.recv_x.size() != d.x.size() || hres.recv_x_scales.size() != d.scales.size() ||
      !same_bytes<Token>(d.view.recv_x.first(n * s.hidden), hres.recv_x.first(n * s.hidden)) ||
      !same_bytes<float>(d.view.recv_x_scales.first(n * ns), hres.recv_x_scales.first(n * ns)) ||
      !same_bytes<std::int64_t>(d.view.recv_topk_idx, hres.recv_topk_idx) ||
      !same_bytes<float>(d.view.recv_topk_weights, hres.recv_topk_weights) ||
      !same_bytes<std::int32_t>(d.view.recv_src_idx, hres.recv_src_idx))
    return "received arrays differ from the host engine's";
  if (d.view.num_recv_tokens_per_expert != hres.num_recv_tokens_per_expert)
    return "tokens per expert differ from the host engine's";

  // The wire format itself: the notify slots every peer wrote here.
  const wire::region_plan& plan = dev.plan();
  const std::size_t notify_bytes = plan.notify_slot_bytes * s.world;
  const auto dev_notify =
      device_array<std::byte>::read(dev.local_device_buffer() + plan.notify, notify_bytes);
  const std::byte* host_notify = host.transport().local_buffer().data() + plan.notify;
  if (std::memcmp(dev_notify.data(), host_notify, notify_bytes) != 0)
    return "notify slots differ from the host engine's (wire format)";

  const auto y = test::expert_rows(hres, s.hidden, rank);
  const std::span<const float> w = hres.recv_topk_weights;
  std::vector<Out> b0, b1;
  if (sc.bias) b0 = bias_rows<Out>(s, rank, 0), b1 = bias_rows<Out>(s, rank, 1);
  const auto hout = host.template combine<Out>({y, w, b0, b1}, hres.handle);

  const device_array<Out> dy{std::span<const Out>(y)};
  const device_array<float> dw{w};
  const device_array<Out> db0{std::span<const Out>(b0)}, db1{std::span<const Out>(b1)};
  device_array<Out> out(static_cast<std::size_t>(s.tokens) * s.hidden);
  device_array<float> out_w(static_cast<std::size_t>(s.tokens) * s.topk);
  const long long y_rows = static_cast<long long>(y.size() / s.hidden);
  dev.combine({dy.data(), y_rows, dw.data(), sc.bias ? db0.data() : nullptr,
               sc.bias ? db1.data() : nullptr},
              dres.handle, out.data(), out_w.data(), stream, sc.bound == 0);
  if (sc.bound > 0) dev.synchronize(stream);
  combine_result<Out> dout{out.download(), out_w.download()};
  if (!same_bytes<Out>(dout.x, hout.x) || !same_bytes<float>(dout.topk_weights, hout.topk_weights))
    return "combine output differs from the host engine's";
  if (!sc.bias)
    if (auto e = test::check_combine(s, mine, dout); !e.empty()) return "combine: " + e;
  return {};
}

// The scenarios every rank count and token type runs; the expert count is the
// buffer's, filled in by the caller.
template <class Token>
std::vector<scenario> scenarios(int world, bool quick) {
  const bool fp8 = token_traits<Token>::has_scales;
  using test::routing;
  std::vector<scenario> v;
  v.push_back({{world, 96, 256, 4, 0, routing::random, 11}});
  v.push_back({{world, 64, 7168, 8, 0, routing::random, 12}});                 // hidden-specialised
  v.push_back({{world, 80, 512, 4, 0, routing::random, 13}, world * 80});      // async, padded
  v.push_back({{world, 48, 256, 3, 0, routing::uneven, 14}, 0, true});         // bias
  v.push_back({{world, 40, 128, 4, 0, routing::random, 19}, 0, false, 0, 8});  // expert_alignment
  if (quick) return v;
  for (routing r :
       {routing::one_expert, routing::none, routing::starve_last, routing::duplicate_rank})
    v.push_back({{world, 40, 128, 3, 0, r, 15}});
  v.push_back({{world, 0, 128, 2, 0, routing::random, 16}});  // no tokens
  v.push_back({{world, 512, 4096, 8, 0, routing::random, 17}});
  // Generic path: rows that are not whole 16-byte vectors and a misaligned x.
  if (!fp8) v.push_back({{world, 33, 100, 2, 0, routing::random, 18}, 0, false, 1});
  return v;
}

// `message` with every number (digits, and the sign of a negative one) taken out.
inline std::string without_numbers(const std::string& message) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  std::string out;
  for (std::size_t i = 0; i < message.size(); ++i)
    if (!digit(message[i]) &&
        !(message[i] == '-' && i + 1 < message.size() && digit(message[i + 1])))
      out += message[i];
  return out;
}

// A call both engines must reject on every rank: "" when the host engine's
// message holds `expected_text` and the device engine threw the same
// message naming `peer`, else what differs. Without `same_numbers` the
// numbers in the messages may differ (routing fingerprints, which hold each
// engine's own dispatch count).
inline std::string same_failure(const std::function<void()>& on_host,
                                const std::function<void()>& on_device, int peer,
                                const std::string& expected_text, bool same_numbers = true) {
  std::string host_message, device_message;
  int device_peer = -2;
  try {
    on_host();
  } catch (const error& e) {
    host_message = e.what();
  }
  try {
    on_device();
  } catch (const error& e) {
    device_message = e.what();
    device_peer = e.peer();
  }
  if (host_message.find(expected_text) == std::string::npos)
    return "the host engine's error '" + host_message + "' lacks '" + expected_text + "'";
  if ((same_numbers ? device_message : without_numbers(device_message)) !=
      (same_numbers ? host_message : without_numbers(host_message)))
    return "device error '" + device_message + "' differs from the host engine's '" + host_message +
           "'";
  if (device_peer != peer)
    return "the error names peer " + std::to_string(device_peer) + ", not " + std::to_string(peer);
  return {};
}

// Bad input on one rank: every rank gets the host engine's error, and the
// buffer serves the next call. Returns what went wrong, or "".
template <class Token, class Link>
std::string check_bad_input(int rank, device_engine<Token, Link>& dev, host_engine<Token>& host,
                            cudaStream_t stream) {
  const int world = dev.world_size();
  const int experts = dev.capacity().num_experts;
  const test::shape s{world, 16, 128, 2, experts, test::routing::random, 21};
  auto mine = test::make_input<Token>(s, rank);
  const int culprit = world - 1;
  if (rank == culprit) mine.topk_idx[5] = s.experts;  // token 2, slot 1
  const device_input<Token> din(mine, 0);
  if (auto e = same_failure(
          [&] {
            host.dispatch({s.tokens, s.hidden, s.topk, mine.x, mine.scales, mine.topk_idx,
                           mine.topk_weights});
          },
          [&] { dev.dispatch(din.view(s), {}, stream); }, rank == culprit ? no_peer : culprit,
          "topk_idx[2][1] = " + std::to_string(s.experts) + " is outside [-1, " +
              std::to_string(s.experts) + ")");
      !e.empty())
    return e;
  // Nothing moved and every rank agreed: the next call goes through.
  const scenario ok{{world, 32, 256, 2, experts, test::routing::random, 22}};
  if (auto e = run_scenario<Token>(rank, dev, host, ok, stream); !e.empty())
    return "after the rejected call: " + e;
  return {};
}

// The worst-case-bound path captured into a CUDA graph (dispatch, then
// combine of precomputed expert rows) and replayed: every replay must give the
// host engine's results, because call counters live on the device.
template <class Token, class Link>
std::string check_graph_replay(int rank, device_engine<Token, Link>& dev, host_engine<Token>& host,
                               cudaStream_t stream) {
  using Out = combine_type_t<Token>;
  const int world = dev.world_size();
  const test::shape s{world, 64, 512, 4, dev.capacity().num_experts, test::routing::random, 41};
  const int bound = world * s.tokens;
  std::vector<test::rank_input<Token>> all;
  for (int r = 0; r < world; ++r) all.push_back(test::make_input<Token>(s, r));
  const auto& mine = all[rank];
  const auto hres = host.dispatch(
      {s.tokens, s.hidden, s.topk, mine.x, mine.scales, mine.topk_idx, mine.topk_weights}, {bound});
  const auto y = test::expert_rows(hres, s.hidden, rank);
  const auto hout = host.combine({y, hres.recv_topk_weights, {}, {}}, hres.handle);

  const device_input<Token> din(mine, 0);
  const device_array<Out> dy{std::span<const Out>(y)};
  const device_array<float> dw{hres.recv_topk_weights};
  device_array<Out> out(static_cast<std::size_t>(s.tokens) * s.hidden);
  device_array<float> out_w(static_cast<std::size_t>(s.tokens) * s.topk);
  const auto check = [rank](cudaError_t e, const char* what) {
    cuda::check_cuda(e, rank, "gpu check", no_peer, what);
  };
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  const auto res = dev.dispatch(din.view(s), {bound}, stream);
  dev.combine({dy.data(), bound, dw.data(), nullptr, nullptr}, res.handle, out.data(), out_w.data(),
              stream, true);  // captured: must not synchronise
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  std::string failure;
  for (int replay = 0; replay < 3 && failure.empty(); ++replay) {
    check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    dev.synchronize(stream);
    const int n = device_array<std::int32_t>::read(res.num_recv_tokens_device, 1)[0];
    const auto x = device_array<Token>::read(res.recv_x, static_cast<std::size_t>(n) * s.hidden);
    const auto idx = device_array<std::int64_t>::read(res.recv_topk_idx,
                                                      static_cast<std::size_t>(bound) * s.topk);
    if (n != hres.num_recv_tokens || !same_bytes<Token>(x, hres.recv_x.first(x.size())) ||
        !same_bytes<std::int64_t>(idx, hres.recv_topk_idx))
      failure = "replay " + std::to_string(replay) + ": dispatch differs from the host engine's";
    else if (!same_bytes<Out>(out.download(), hout.x) ||
             !same_bytes<float>(out_w.download(), hout.topk_weights))
      failure = "replay " + std::to_string(replay) + ": combine differs from the host engine's";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return failure;
}

// Handles that outlive later dispatches, as a layer's handle does from
// forward to backward: three dispatches on both engines, then their combines
// in reverse order, each equal to the host engine's. Then every slot pinned:
// the next dispatch fails on every rank, and goes through once one handle is
// released.
template <class Token, class Link>
std::string check_live_handles(int rank, device_engine<Token, Link>& dev, host_engine<Token>& host,
                               cudaStream_t stream, int slots) {
  using Out = combine_type_t<Token>;
  const int world = dev.world_size();
  const int experts = dev.capacity().num_experts;
  struct layer {
    test::shape s;
    dispatch_handle host_handle;
    cuda::device_dispatch_handle device_handle;
    std::vector<Out> y;
    std::vector<float> weights;
  };
  std::vector<layer> layers;
  const test::routing routes[] = {test::routing::random, test::routing::uneven,
                                  test::routing::starve_last};
  for (int l = 0; l < 3; ++l) {
    const test::shape s{world, 48 - 16 * l, 256, 4, experts, routes[l], 60u + l};
    const auto mine = test::make_input<Token>(s, rank);
    const auto hres = host.dispatch(
        {s.tokens, s.hidden, s.topk, mine.x, mine.scales, mine.topk_idx, mine.topk_weights});
    const device_input<Token> din(mine, 0);
    const auto dres = dev.dispatch(din.view(s), {}, stream);
    if (dres.num_recv_tokens != hres.num_recv_tokens)
      return "dispatch " + std::to_string(l) + ": received count differs from the host engine's";
    layers.push_back({s,
                      hres.handle,
                      dres.handle,
                      test::expert_rows(hres, s.hidden, rank),
                      {hres.recv_topk_weights.begin(), hres.recv_topk_weights.end()}});
  }
  for (int l = 2; l >= 0; --l) {
    const layer& L = layers[l];
    const auto hout = host.combine({L.y, L.weights, {}, {}}, L.host_handle);
    const device_array<Out> dy{std::span<const Out>(L.y)};
    const device_array<float> dw{std::span<const float>(L.weights)};
    device_array<Out> out(static_cast<std::size_t>(L.s.tokens) * L.s.hidden);
    device_array<float> out_w(static_cast<std::size_t>(L.s.tokens) * L.s.topk);
    dev.combine(
        {dy.data(), static_cast<long long>(L.y.size() / L.s.hidden), dw.data(), nullptr, nullptr},
        L.device_handle, out.data(), out_w.data(), stream);
    if (!same_bytes<Out>(out.download(), hout.x) ||
        !same_bytes<float>(out_w.download(), hout.topk_weights))
      return "combine of dispatch " + std::to_string(l) +
             " after later dispatches differs from the host engine's";
  }
  // Pin every slot (the three above hold three), then one more dispatch.
  const test::shape s{world, 8, 128, 2, experts, test::routing::random, 70};
  const auto mine = test::make_input<Token>(s, rank);
  const device_input<Token> din(mine, 0);
  std::vector<cuda::device_dispatch_handle> pinned;
  for (const layer& L : layers) pinned.push_back(L.device_handle);
  layers.clear();
  while (static_cast<int>(pinned.size()) < slots)
    pinned.push_back(dev.dispatch(din.view(s), {}, stream).handle);
  try {
    dev.dispatch(din.view(s), {}, stream);
    return "a dispatch with every handle slot pinned went through";
  } catch (const error& e) {
    if (std::string(e.what()).find("handle slots (max_live_handles) are pinned") ==
        std::string::npos)
      return std::string("unexpected error with every slot pinned: ") + e.what();
  }
  pinned.erase(pinned.begin());
  try {
    dev.dispatch(din.view(s), {}, stream);
  } catch (const error& e) {
    return std::string("a dispatch after a handle was released failed: ") + e.what();
  }
  return {};
}

// DeepEP's dispatch(handle=) on both engines: fresh rows along the routing of
// a dispatch kept across another one, then a combine of that handle; rows,
// source indices, the notify slots (headers with the routing fingerprint)
// and the combine must equal the host engine's byte for byte. Then the last
// rank passes the later dispatch's handle: every rank fails with the host
// engine's message, and so does a combine in which it passes that handle;
// the handle still serves a cached dispatch.
template <class Token, class Link>
std::string check_cached_dispatch(int rank, device_engine<Token, Link>& dev,
                                  host_engine<Token>& host, cudaStream_t stream) {
  using Out = combine_type_t<Token>;
  const int world = dev.world_size();
  const int experts = dev.capacity().num_experts;
  const test::shape kept{world, 44, 256, 4, experts, test::routing::random, 80};
  const test::shape between{world, 30, 256, 4, experts, test::routing::uneven, 81};
  const test::shape fresh{world, 44, 256, 4, experts, test::routing::random, 82};  // its x only
  const auto mine = test::make_input<Token>(kept, rank);
  const auto hres = host.dispatch(
      {kept.tokens, kept.hidden, kept.topk, mine.x, mine.scales, mine.topk_idx, mine.topk_weights});
  const dispatch_handle host_handle = hres.handle;
  const device_input<Token> din(mine, 0);
  const cuda::device_dispatch_handle handle = dev.dispatch(din.view(kept), {}, stream).handle;
  const auto other = test::make_input<Token>(between, rank);
  const dispatch_handle host_later =
      host.dispatch({between.tokens, between.hidden, between.topk, other.x, other.scales,
                     other.topk_idx, other.topk_weights})
          .handle;
  const device_input<Token> dother(other, 0);
  const cuda::device_dispatch_handle later = dev.dispatch(dother.view(between), {}, stream).handle;
  // A twin of the first dispatch: the same routing, so the same counts.
  const dispatch_handle host_twin = host.dispatch({kept.tokens, kept.hidden, kept.topk, mine.x,
                                                   mine.scales, mine.topk_idx, mine.topk_weights})
                                        .handle;
  const cuda::device_dispatch_handle twin = dev.dispatch(din.view(kept), {}, stream).handle;

  const auto rows = test::make_input<Token>(fresh, rank);
  const device_input<Token> drows(rows, 0);
  const auto cached_input = [&] {
    return cuda::device_cached_dispatch_input<Token>{
        drows.x.data(), drows.scales.size() ? drows.scales.data() : nullptr};
  };
  const auto hc = host.dispatch(cached_dispatch_input<Token>{rows.x, rows.scales}, host_handle);
  const auto dc = dev.dispatch(cached_input(), handle, stream);
  const std::size_t n = hc.num_recv_tokens, h = kept.hidden;
  const std::size_t ns = token_traits<Token>::has_scales ? h / 128 : 0;
  // The host result's views last until its next dispatch.
  const std::vector<Token> expect_x(hc.recv_x.begin(), hc.recv_x.begin() + n * h);
  if (dc.num_recv_tokens != hc.num_recv_tokens || dc.rows != hc.num_recv_tokens ||
      dc.recv_topk_idx != nullptr || dc.num_recv_tokens_per_expert != nullptr)
    return "cached dispatch: counts or extras differ from the host engine's";
  if (!same_bytes<Token>(device_array<Token>::read(dc.recv_x, n * h), hc.recv_x.first(n * h)) ||
      !same_bytes<float>(device_array<float>::read(dc.recv_x_scales, n * ns),
                         hc.recv_x_scales.first(n * ns)) ||
      !same_bytes<std::int32_t>(device_array<std::int32_t>::read(dc.recv_src_idx, n),
                                hc.recv_src_idx.first(n)))
    return "cached dispatch: received rows differ from the host engine's";
  // The notify slots as both engines wrote them, but for the call counter
  // and the routing fingerprint, which holds it: the device engine ran more
  // dispatches (graph replays, pinned slots). The fingerprint must be the
  // same in every rank's slot.
  const wire::region_plan& plan = dev.plan();
  const std::size_t notify_bytes = plan.notify_slot_bytes * world;
  auto dev_notify =
      device_array<std::byte>::read(dev.local_device_buffer() + plan.notify, notify_bytes);
  std::vector<std::byte> host_notify(notify_bytes);
  std::memcpy(host_notify.data(), host.transport().local_buffer().data() + plan.notify,
              notify_bytes);
  std::int32_t routing = 0;
  for (int s = 0; s < world; ++s)
    for (auto* slot : {dev_notify.data(), host_notify.data()}) {
      std::byte* header = slot + s * plan.notify_slot_bytes;
      std::memset(header + offsetof(wire::notify_header, epoch), 0, sizeof(std::uint64_t));
      std::int32_t* r =
          reinterpret_cast<std::int32_t*>(header + offsetof(wire::notify_header, routing));
      if (slot == dev_notify.data() && (*r == 0 || (s > 0 && *r != routing)))
        return "cached dispatch: the device's notify slots carry routings that differ";
      if (slot == dev_notify.data()) routing = *r;
      *r = 0;
    }
  if (dev_notify != host_notify)
    return "cached dispatch: notify slots differ from the host engine's (wire format)";

  std::vector<Out> y(n * h);
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = from_float<Out>(test::uniform(test::hash(83, rank, i, 0)));
  const auto hout = host.combine({y, std::nullopt, {}, {}}, host_handle);
  const device_array<Out> dy{std::span<const Out>(y)};
  device_array<Out> out(static_cast<std::size_t>(kept.tokens) * h);
  dev.combine({dy.data(), static_cast<long long>(n), nullptr, nullptr, nullptr}, handle, out.data(),
              nullptr, stream);
  if (!same_bytes<Out>(out.download(), hout.x))
    return "combine after a cached dispatch differs from the host engine's";

  if (world == 1) return {};  // nobody to disagree with
  const int culprit = world - 1;
  const bool odd = rank == culprit;  // passes the later dispatch's handle, with rows for it
  if (auto e = same_failure(
          [&] {
            host.dispatch(odd ? cached_dispatch_input<Token>{other.x, other.scales}
                              : cached_dispatch_input<Token>{rows.x, rows.scales},
                          odd ? host_later : host_handle);
          },
          [&] {
            dev.dispatch(odd ? cuda::device_cached_dispatch_input<Token>{dother.x.data(),
                                                                         dother.scales.size()
                                                                             ? dother.scales.data()
                                                                             : nullptr}
                             : cached_input(),
                         odd ? later : handle, stream);
          },
          culprit, "the cached handle's routing", false);
      !e.empty())
    return "along two routings: " + e;
  // A combine along those two handles: rejected alike, before any row moves.
  const std::vector<Out> y_later(static_cast<std::size_t>(host_later.num_recv_tokens) * h);
  const device_array<Out> dy_later{std::span<const Out>(y_later)};
  const std::span<const Out> odd_y = odd ? std::span<const Out>(y_later) : std::span<const Out>(y);
  if (auto e = same_failure(
          [&] {
            host.combine({odd_y, std::nullopt, {}, {}}, odd ? host_later : host_handle);
          },
          [&] {
            dev.combine({odd ? dy_later.data() : dy.data(),
                         odd ? host_later.num_recv_tokens : static_cast<long long>(n), nullptr,
                         nullptr, nullptr},
                        odd ? later : handle, out.data(), nullptr, stream);
          },
          culprit, "the handle's routing (fingerprint of its dispatch: number and counts)", false);
      !e.empty())
    return "combine along two dispatches: " + e;
  // And along twin handles, told apart by their dispatch's number alone.
  if (auto e = same_failure(
          [&] {
            host.combine({y, std::nullopt, {}, {}}, odd ? host_twin : host_handle);
          },
          [&] {
            dev.combine({dy.data(), static_cast<long long>(n), nullptr, nullptr, nullptr},
                        odd ? twin : handle, out.data(), nullptr, stream);
          },
          culprit, "the handle's routing (fingerprint of its dispatch: number and counts)", false);
      !e.empty())
    return "combine along twin dispatches: " + e;
  const auto again = dev.dispatch(cached_input(), handle, stream);
  if (again.num_recv_tokens != static_cast<int>(n) ||
      !same_bytes<Token>(device_array<Token>::read(again.recv_x, n * h), expect_x))
    return "the handle after a rejected cached dispatch";
  return {};
}

// DeepEP's previous_event, async_finish and communication stream (call_stream).
// Each call's input is copied behind a gate on the caller's stream, over x
// (or y) zeroed beforehand, so a call that starts before what it follows
// reads zeros. (a) A dispatch on the communication stream after an event
// recorded after that copy and before a second gate, finishing
// asynchronously: its event is not done while the first gate is shut, is
// done while the second still is, and the rows are the host engine's.
// (b) One on the communication stream after the caller's work so far, which
// the caller's stream then waits for: its event is not done in the second
// the gate stays shut, and a copy of the rows enqueued on the caller's stream
// right after the call sees them. (c) A combine as (a).
template <class Token, class Link>
std::string check_call_stream(int rank, device_engine<Token, Link>& dev, host_engine<Token>& host,
                              cudaStream_t stream) {
  using Out = combine_type_t<Token>;
  const int world = dev.world_size();
  const int experts = dev.capacity().num_experts;

  // (a)
  const test::shape sa{world, 48, 512, 4, experts, test::routing::random, 90};
  const int bound = world * sa.tokens;
  const auto ma = test::make_input<Token>(sa, rank);
  const auto ha = host.dispatch(
      {sa.tokens, sa.hidden, sa.topk, ma.x, ma.scales, ma.topk_idx, ma.topk_weights}, {bound});
  const std::size_t na = ha.num_recv_tokens;
  const std::vector<Token> expect_a(ha.recv_x.begin(), ha.recv_x.begin() + na * sa.hidden);
  const auto y = test::expert_rows(ha, sa.hidden, rank);
  const std::vector<float> y_weights(ha.recv_topk_weights.begin(), ha.recv_topk_weights.end());
  const auto hout = host.combine({y, y_weights, {}, {}}, ha.handle);
  const device_input<Token> da(ma, 0);
  cuda::device_dispatch_result<Token> ra;
  if (auto err = check_after_event(
          stream, rank, [&] { copy_over_zeros<Token>(stream, rank, da.x.data(), ma.x); },
          [&](const cuda::call_stream& on) {
            ra = dev.dispatch(da.view(sa), {bound}, on);
            return ra.event;
          });
      !err.empty())
    return "(a) a dispatch: " + err;
  dev.synchronize(stream);
  if (device_array<std::int32_t>::read(ra.num_recv_tokens_device, 1)[0] != ha.num_recv_tokens ||
      !same_bytes<Token>(device_array<Token>::read(ra.recv_x, na * sa.hidden), expect_a))
    return "(a) the rows of a dispatch after an event differ from the host engine's (did it "
           "start before the event?)";

  // (b)
  const test::shape sb{world, 40, 512, 4, experts, test::routing::uneven, 91};
  const auto mb = test::make_input<Token>(sb, rank);
  const auto hb = host.dispatch(
      {sb.tokens, sb.hidden, sb.topk, mb.x, mb.scales, mb.topk_idx, mb.topk_weights}, {bound});
  const std::size_t nb = hb.num_recv_tokens;
  const device_input<Token> db(mb, 0);
  std::vector<Token> got_b(nb * sb.hidden);
  {
    stream_gate gate(stream, rank, std::chrono::seconds(30));
    copy_over_zeros<Token>(stream, rank, db.x.data(), mb.x);
    const auto rb = dev.dispatch(db.view(sb), {bound}, cuda::call_stream(stream).on_comm());
    cuda::check_cuda(cudaMemcpyAsync(got_b.data(), rb.recv_x, got_b.size() * sizeof(Token),
                                     cudaMemcpyDeviceToHost, stream),
                     rank, "gpu check", no_peer, "cudaMemcpyAsync(rows)");
    // Held long enough for a call that did not wait to finish reading zeros.
    if (done_within(rb.event, std::chrono::seconds(1)))
      return "(b) a dispatch on the communication stream finished before the caller's earlier "
             "work";
    gate.open();
    dev.synchronize(stream);
    if (gate.expired()) return "(b) the call waited for the caller's stream to finish";
  }
  if (!same_bytes<Token>(std::span<const Token>(got_b), hb.recv_x.first(nb * sb.hidden)))
    return "(b) the caller's stream read the rows of a dispatch on the communication stream "
           "before it finished, or the dispatch read x before the caller's stream wrote it";

  // (c): y for (a)'s handle.
  const device_array<Out> dy(y.size());
  const device_array<float> dw{std::span<const float>(y_weights)};
  device_array<Out> out(static_cast<std::size_t>(sa.tokens) * sa.hidden);
  device_array<float> out_w(static_cast<std::size_t>(sa.tokens) * sa.topk);
  if (auto err = check_after_event(
          stream, rank, [&] { copy_over_zeros<Out>(stream, rank, dy.data(), y); },
          [&](const cuda::call_stream& on) {
            return dev.combine({dy.data(), static_cast<long long>(y.size() / sa.hidden), dw.data(),
                                nullptr, nullptr},
                               ra.handle, out.data(), out_w.data(), on, false);
          });
      !err.empty())
    return "(c) a combine: " + err;
  dev.synchronize(stream);
  if (!same_bytes<Out>(out.download(), hout.x) ||
      !same_bytes<float>(out_w.download(), hout.topk_weights))
    return "(c) a combine after an event differs from the host engine's (did it start before "
           "the event?)";
  return {};
}

// One rank's part of a check: its GPU chosen, a non-blocking stream of its
// own (destroyed last: declare it before the engines), and the failures it
// printed.
struct rank_check {
  int rank;
  cudaStream_t stream = nullptr;
  int failures = 0;

  explicit rank_check(int r) : rank(r) {
    use_device(r);
    cuda::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), r, "gpu check",
                     no_peer, "cudaStreamCreate");
  }
  rank_check(const rank_check&) = delete;
  rank_check& operator=(const rank_check&) = delete;
  ~rank_check() { cudaStreamDestroy(stream); }

  // Prints the failure `e` of `what`; "" is a pass.
  void note(const std::string& what, const std::string& e) {
    if (e.empty()) return;
    std::fprintf(stderr, "rank %d FAIL [%s]: %s\n", rank, what.c_str(), e.c_str());
    ++failures;
  }
  int exit_code() const { return failures == 0 ? 0 : 1; }
};

// Correctness of one token type on `world` ranks: every scenario, then bad input.
template <class Token, class Link = nvlink_ipc::transport>
int check_rank(local_bootstrap& boot, bool quick, int max_blocks = 0) {
  rank_check rc(boot.rank());
  const int rank = rc.rank;
  const cudaStream_t stream = rc.stream;
  buffer_config cfg;
  cfg.num_experts = 16 * boot.world_size();
  cfg.max_hidden = 7168;
  cfg.max_topk = 8;
  cfg.max_tokens_per_rank = 512;
  cfg.timeout = std::chrono::seconds(60);
  cfg.max_blocks = max_blocks;
  device_engine<Token, Link> dev(boot, cfg, check_rma_memory);
  host_engine<Token> host(boot, cfg);
  const std::string dtype(token_traits<Token>::name);
  for (scenario sc : scenarios<Token>(boot.world_size(), quick)) {
    sc.shape.experts = cfg.num_experts;  // fixed by the buffer
    rc.note(describe(sc, dtype.c_str()), run_scenario<Token>(rank, dev, host, sc, stream));
  }
  rc.note(dtype + " bad input", check_bad_input(rank, dev, host, stream));
  rc.note(dtype + " graph replay", check_graph_replay(rank, dev, host, stream));
  if (!quick) {
    rc.note(dtype + " live handles",
            check_live_handles(rank, dev, host, stream, cfg.max_live_handles));
    rc.note(dtype + " cached dispatch", check_cached_dispatch(rank, dev, host, stream));
    rc.note(dtype + " call stream", check_call_stream(rank, dev, host, stream));
  }
  return rc.exit_code();
}

// The last rank never calls dispatch (rank 0 fails at its deadline, the
// others through its abort relay) or its process exits (every other rank
// fails at once): absent_peer.hpp. All name it; everyone refuses further
// calls; nobody hangs.
template <class Link = nvlink_ipc::transport, absence How = absence::silent>
int check_absent_peer(local_bootstrap& boot) {
  const int rank = boot.rank();
  const int absent = boot.world_size() - 1;
  const absent_peer_plan plan{rank, absent, How};
  use_device(rank);
  buffer_config cfg;
  cfg.num_experts = 2 * boot.world_size();
  cfg.max_hidden = 256;
  cfg.max_topk = 2;
  cfg.max_tokens_per_rank = 16;
  cfg.timeout = plan.timeout();
  int code = 0;
  {
    device_engine<bf16, Link> dev(boot, cfg, check_rma_memory);
    if (How == absence::exited) {
      boot.barrier(deadline::after(std::chrono::seconds(60)));  // every rank has its buffer
      if (rank == absent) std::_Exit(0);
    }
    if (rank != absent) {
      const test::shape s{boot.world_size(),     16, 256, 2, cfg.num_experts,
                          test::routing::random, 31};
      const auto mine = test::make_input<bf16>(s, rank);
      const device_input<bf16> din(mine, 0);
      const auto start = steady::now();
      try {
        dev.dispatch(din.view(s));
        std::fprintf(stderr, "rank %d FAIL: dispatch without rank %d succeeded\n", rank, absent);
        code = 1;
      } catch (const error& e) {
        const std::string bad =
            plan.verdict(e.what(), e.peer(), steady::now() - start, "notify counts");
        if (!bad.empty()) {
          std::fprintf(stderr, "rank %d FAIL [absent peer]: %s\n", rank, bad.c_str());
          code = 1;
        }
      }
      try {
        dev.dispatch(din.view(s));
        std::fprintf(stderr, "rank %d FAIL: a broken buffer accepted a call\n", rank);
        code = 1;
      } catch (const error& e) {
        if (std::string(e.what()).find("unusable after an earlier failure") == std::string::npos) {
          std::fprintf(stderr, "rank %d FAIL: unexpected error: %s\n", rank, e.what());
          code = 1;
        }
      }
    }
    // The absent rank keeps its memory mapped until the others are done.
    if (How == absence::silent) boot.barrier(deadline::after(std::chrono::seconds(120)));
  }
  return code;
}

}  // namespace epcomm::gpu_check
