// Timing of the CUDA path, with CUDA events, against two yardsticks measured
// in the same run: the device-to-device copy roofline (bytes that must move /
// cudaMemcpy bandwidth) and the NCCL point-to-point baseline. Inputs are
// random (never all zeros); every number is the median of the timed
// iterations after warm-up, and a rank's time is the slowest rank's.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "correctness.hpp"
#include "device_memory.hpp"
#include "epcomm/core/layout.hpp"
#include "epcomm/core/topology.hpp"
#ifdef EPCOMM_GPU_CHECK_NCCL
#include "nccl_baseline.hpp"
#endif

namespace epcomm::gpu_check {

struct timing_case {
  int world;
  int tokens;
  int hidden;
  int topk;
  int experts;
};

// One line of the final table, filled by rank 0 of the case.
struct timing_row {
  char label[48];
  int world;
  int gpus;               // distinct GPUs the ranks ran on
  double dispatch_bytes;  // bytes written on the busiest GPU
  double combine_bytes;
  double epcomm_dispatch_us, epcomm_combine_us;
  double nccl_dispatch_us, nccl_combine_us;  // < 0: not run (see nccl_note)
  int valid;                                 // the timed results were checked
  char nccl_note[48];
};

// Written by the ranks (forked processes) into memory the launcher shares.
struct shared_results {
  double copy_bytes_per_s;
  char device[256];
  int rows;
  timing_row row[32];
};

struct timing_options {
  int iterations = 20;
  int warmup = 5;
  bool nccl = true;
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Milliseconds between two recorded events.
inline double elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cuda::check_cuda(cudaEventElapsedTime(&ms, a, b), -1, "gpu check", -1, "cudaEventElapsedTime");
  return ms;
}

// Device-to-device copy bandwidth of this GPU: the roofline every kernel is
// compared with (a dispatch reads each row once and writes it per destination).
inline int measure_copy(local_bootstrap& boot, shared_results* out, const timing_options& opt) {
  use_device(boot.rank());
  cudaDeviceProp prop{};
  cuda::check_cuda(cudaGetDeviceProperties(&prop, 0), 0, "gpu check", no_peer,
                   "cudaGetDeviceProperties");
  std::snprintf(out->device, sizeof out->device, "%s", prop.name);
  const std::size_t words = std::size_t{64} << 20;  // 512 MiB of uint64
  std::vector<std::uint64_t> host(words);
  for (std::size_t i = 0; i < words; ++i) host[i] = test::mix(i);
  const device_array<std::uint64_t> src{std::span<const std::uint64_t>(host)};
  device_array<std::uint64_t> dst(words);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ms;
  for (int i = 0; i < opt.warmup + opt.iterations; ++i) {
    cudaEventRecord(a);
    cudaMemcpyAsync(dst.data(), src.data(), words * 8, cudaMemcpyDeviceToDevice);
    cudaEventRecord(b);
    cuda::check_cuda(cudaEventSynchronize(b), 0, "gpu check", no_peer, "copy roofline");
    if (i >= opt.warmup) ms.push_back(elapsed_ms(a, b));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  out->copy_bytes_per_s = static_cast<double>(words * 8) / (median(ms) * 1e-3);
  return 0;
}

// Bytes one rank's dispatch and combine must move, from the routing alone:
// each (token, destination) row with its scales and metadata, and each
// returned row with its weights.
template <class Token>
std::pair<double, double> bytes_moved(const test::shape& s, const test::rank_input<Token>& in,
                                      int received) {
  const topology topo{s.world, s.world, s.experts, s.hidden, s.topk};
  const layout lay = make_layout(topo, in.topk_idx, s.tokens);
  long long sends = 0;
  for (int n : lay.tokens_per_rank) sends += n;
  const double k = s.topk;
  const double row = s.hidden * sizeof(Token) +
                     (token_traits<Token>::has_scales ? s.hidden / 128 * 4.0 : 0.0) + k * 12 + 4;
  const double back = s.hidden * sizeof(combine_type_t<Token>) + k * 4;
  return {static_cast<double>(sends) * row, static_cast<double>(received) * back};
}

struct rank_timing {
  double dispatch_us, combine_us, nccl_dispatch_us, nccl_combine_us;
  double dispatch_bytes, combine_bytes;
  std::int32_t device, valid;
  char nccl_note[48];
};

template <class Token>
int time_rank(local_bootstrap& boot, const timing_case& tc, const timing_options& opt,
              timing_row* row) {
  using Out = combine_type_t<Token>;
  const int rank = boot.rank();
  const int devices = use_device(rank);
  cudaStream_t stream = nullptr;
  cuda::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank, "gpu check",
                   no_peer, "cudaStreamCreate");
  const test::shape s{tc.world, tc.tokens, tc.hidden, tc.topk, tc.experts, test::routing::random,
                      77};
  const auto mine = test::make_input<Token>(s, rank);
  // What this rank must receive: only the peers' routing is needed for that.
  int expected_recv = 0;
  for (int src = 0; src < s.world; ++src) {
    const topology topo{s.world, s.world, s.experts, s.hidden, s.topk};
    expected_recv += make_layout(topo, test::make_routing(s, src), s.tokens).tokens_per_rank[rank];
  }

  buffer_config cfg;
  cfg.num_experts = s.experts;
  cfg.max_hidden = s.hidden;
  cfg.max_topk = s.topk;
  cfg.max_tokens_per_rank = s.tokens;
  cfg.timeout = std::chrono::seconds(60);
  rank_timing mine_t{};
  mine_t.device = rank % devices;
  mine_t.nccl_dispatch_us = mine_t.nccl_combine_us = -1;
  const device_input<Token> din(mine, 0);
  const int bound = s.world * s.tokens;  // no host synchronisation: the graph-capturable path
  std::vector<Out> y_host(static_cast<std::size_t>(bound) * s.hidden);
  for (std::size_t i = 0; i < y_host.size(); ++i)
    y_host[i] = from_float<Out>(test::uniform(test::hash(s.seed, rank, i, 5)));
  const device_array<Out> y{std::span<const Out>(y_host)};
  device_array<Out> out(static_cast<std::size_t>(s.tokens) * s.hidden);
  device_array<float> out_w(static_cast<std::size_t>(s.tokens) * s.topk);
  cudaEvent_t ev[3];
  for (auto& e : ev) cudaEventCreate(&e);
  const deadline dl = deadline::after(std::chrono::minutes(5));
  {
    device_engine<Token, nvlink_ipc::transport> dev(boot, cfg);
    std::vector<double> d_ms, c_ms;
    cuda::device_dispatch_result<Token> res;
    for (int i = 0; i < opt.warmup + opt.iterations; ++i) {
      boot.barrier(dl);
      cudaEventRecord(ev[0], stream);
      res = dev.dispatch(din.view(s), {bound}, stream);
      cudaEventRecord(ev[1], stream);
      // Expert weights double as combine weights: they are the right shape.
      dev.combine({y.data(), bound, res.recv_topk_weights, nullptr, nullptr}, res.handle,
                  out.data(), out_w.data(), stream, false);
      cudaEventRecord(ev[2], stream);
      dev.synchronize(stream);
      if (i >= opt.warmup) {
        d_ms.push_back(elapsed_ms(ev[0], ev[1]));
        c_ms.push_back(elapsed_ms(ev[1], ev[2]));
      }
    }
    mine_t.dispatch_us = median(d_ms) * 1e3;
    mine_t.combine_us = median(c_ms) * 1e3;
    const int received = device_array<std::int32_t>::read(res.num_recv_tokens_device, 1)[0];
    mine_t.valid = received == expected_recv;
    std::tie(mine_t.dispatch_bytes, mine_t.combine_bytes) = bytes_moved(s, mine, received);

#ifdef EPCOMM_GPU_CHECK_NCCL
    if (!opt.nccl) {
      std::snprintf(mine_t.nccl_note, sizeof mine_t.nccl_note, "disabled");
    } else if (s.world > devices) {
      std::snprintf(mine_t.nccl_note, sizeof mine_t.nccl_note, "needs a GPU per rank");
    } else {
      nccl_baseline<Token> nccl(boot, s.experts, s.tokens, s.hidden, s.topk, cfg.timeout);
      std::vector<double> nd_ms, nc_ms;
      for (int i = 0; i < opt.warmup + opt.iterations; ++i) {
        boot.barrier(dl);
        cudaEventRecord(ev[0], stream);
        const auto got =
            nccl.dispatch(din.x.data(), din.scales.size() ? din.scales.data() : nullptr,
                          din.topk_idx.data(), din.topk_weights.data(), s.tokens, stream);
        cudaEventRecord(ev[1], stream);
        nccl.combine(y.data(), got.topk_weights, out.data(), out_w.data(), stream);
        cudaEventRecord(ev[2], stream);
        cuda::check_cuda(cudaStreamSynchronize(stream), rank, "nccl baseline", no_peer,
                         "cudaStreamSynchronize");
        if (i >= opt.warmup) {
          nd_ms.push_back(elapsed_ms(ev[0], ev[1]));
          nc_ms.push_back(elapsed_ms(ev[1], ev[2]));
        }
        // The baseline must deliver what epcomm delivers, bit for bit.
        if (i == 0) {
          const std::size_t n = static_cast<std::size_t>(got.rows) * s.hidden;
          const auto a = device_array<Token>::read(got.x, n);
          const auto b = device_array<Token>::read(res.recv_x, n);
          mine_t.valid = mine_t.valid && got.rows == received &&
                         std::memcmp(a.data(), b.data(), n * sizeof(Token)) == 0;
        }
      }
      mine_t.nccl_dispatch_us = median(nd_ms) * 1e3;
      mine_t.nccl_combine_us = median(nc_ms) * 1e3;
    }
#else
    std::snprintf(mine_t.nccl_note, sizeof mine_t.nccl_note, "built without NCCL");
#endif
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaStreamDestroy(stream);

  const auto gathered = boot.all_gather(std::as_bytes(std::span(&mine_t, 1)), dl);
  if (rank != 0) return 0;
  std::vector<rank_timing> t(s.world);
  std::memcpy(t.data(), gathered.data(), gathered.size());
  std::vector<double> d_bytes(devices, 0.0), c_bytes(devices, 0.0);
  std::vector<bool> used(devices, false);
  row->world = s.world;
  row->valid = 1;
  row->epcomm_dispatch_us = row->epcomm_combine_us = 0;
  row->nccl_dispatch_us = row->nccl_combine_us = 0;
  for (const rank_timing& r : t) {
    d_bytes[r.device] += r.dispatch_bytes;
    c_bytes[r.device] += r.combine_bytes;
    used[r.device] = true;
    row->valid = row->valid && r.valid;
    row->epcomm_dispatch_us = std::max(row->epcomm_dispatch_us, r.dispatch_us);
    row->epcomm_combine_us = std::max(row->epcomm_combine_us, r.combine_us);
    row->nccl_dispatch_us = std::max(row->nccl_dispatch_us, r.nccl_dispatch_us);
    row->nccl_combine_us = std::max(row->nccl_combine_us, r.nccl_combine_us);
  }
  // Every rank runs the baseline or none does.
  if (t[0].nccl_dispatch_us < 0) row->nccl_dispatch_us = row->nccl_combine_us = -1;
  row->gpus = static_cast<int>(std::count(used.begin(), used.end(), true));
  row->dispatch_bytes = *std::max_element(d_bytes.begin(), d_bytes.end());
  row->combine_bytes = *std::max_element(c_bytes.begin(), c_bytes.end());
  std::snprintf(row->nccl_note, sizeof row->nccl_note, "%s", t[0].nccl_note);
  std::snprintf(row->label, sizeof row->label, "%s T=%d H=%d K=%d E=%d",
                token_traits<Token>::name.data(), s.tokens, s.hidden, s.topk, s.experts);
  return 0;
}

}  // namespace epcomm::gpu_check
