// Timing of the low-latency CUDA path with CUDA events: each phase (dispatch
// send and receive, combine send and receive) on its own, at a decode-step
// shape (DeepEP's low-latency test: 128 tokens, hidden 7168, top-8), with
// random data, as the median of the timed iterations after warm-up; a rank's
// time is the slowest rank's. Next to it the roofline: the bytes the busiest
// GPU must write / the device-to-device copy bandwidth.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "device_memory.hpp"
#include "ll_correctness.hpp"
#include "timing.hpp"

namespace epcomm::gpu_check {

struct ll_timing_case {
  int world;
  int tokens;
  int hidden;
  int topk;
  int experts;
};

// One line of the low-latency table, filled by rank 0 of the case.
struct ll_timing_row {
  char label[48];
  int world;
  int gpus;
  double dispatch_bytes;  // written on the busiest GPU
  double combine_bytes;
  double phase_us[4];  // dispatch send, dispatch receive, combine send, combine receive
  int valid;           // the timed results were checked
};

struct ll_shared_results {
  int rows;
  ll_timing_row row[16];
};

template <class Wire>
int time_ll_rank(local_bootstrap& boot, const ll_timing_case& tc, const timing_options& opt,
                 ll_timing_row* row) {
  const int rank = boot.rank();
  const int devices = use_device(rank);
  cudaStream_t stream = nullptr;
  cuda::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank, "gpu check",
                   no_peer, "cudaStreamCreate");
  const auto call =
      test::make_ll_call(tc.world, tc.hidden, tc.topk, tc.experts,
                         std::vector<int>(tc.world, tc.tokens), test::routing::random, 77);
  const low_latency_config cfg{tc.experts, tc.hidden, tc.topk,
                               tc.tokens,  false,     std::chrono::seconds(60)};
  const ll_device_call din(call.in[rank], tc.tokens, tc.topk);
  struct rank_result {
    double phase_us[4];
    double dispatch_bytes, combine_bytes;
    std::int32_t device, valid;
  } mine{};
  mine.device = rank % devices;
  cudaEvent_t ev[5];
  for (auto& e : ev) cudaEventCreate(&e);
  const deadline dl = deadline::after(std::chrono::minutes(5));
  {
    ll_device_engine<Wire, nvlink_ipc::transport> dev(boot, cfg);
    const wire::ll::shape& s = dev.shape();
    // Random expert outputs, written once where combine reads them in place
    // (zero copy) on both parities.
    const std::size_t rows = static_cast<std::size_t>(s.local_experts()) * s.rows_per_expert();
    std::vector<bf16> y(rows * s.hidden);
    for (std::size_t i = 0; i < y.size(); ++i)
      y[i] = to_bf16(test::uniform(test::mix(i ^ (static_cast<std::uint64_t>(rank) << 40))));
    for (int p = 0; p < wire::ll::parities; ++p)
      cuda::check_cuda(cudaMemcpy(dev.combine_send_buffer({p, 0, 0, 0}), y.data(),
                                  y.size() * sizeof(bf16), cudaMemcpyHostToDevice),
                       rank, "gpu check", no_peer, "cudaMemcpy(y)");
    std::vector<double> ms[4];
    cuda::ll_device_dispatch_result<Wire> res;
    for (int i = 0; i < opt.warmup + opt.iterations; ++i) {
      boot.barrier(dl);
      cudaEventRecord(ev[0], stream);
      auto recv = dev.dispatch_send(din.dispatch(), stream);
      cudaEventRecord(ev[1], stream);
      res = recv();
      cudaEventRecord(ev[2], stream);
      auto done = dev.combine_send(
          {dev.combine_send_buffer(res.handle), din.topk_idx.data(), din.topk_weights.data()},
          res.handle, stream);
      cudaEventRecord(ev[3], stream);
      done();
      cudaEventRecord(ev[4], stream);
      dev.synchronize(stream);
      if (i >= opt.warmup)
        for (int k = 0; k < 4; ++k) ms[k].push_back(elapsed_ms(ev[k], ev[k + 1]));
    }
    for (int k = 0; k < 4; ++k) mine.phase_us[k] = median(ms[k]) * 1e3;
    // The last dispatch must be the reference's, exactly.
    const ll_snapshot<Wire> got(res, s);
    const std::string err =
        test::check_ll_dispatch(call, rank, tc.world, tc.tokens, false, got.view());
    if (!err.empty())
      std::fprintf(stderr, "rank %d: timed dispatch wrong: %s\n", rank, err.c_str());
    mine.valid = err.empty();
    long long routed = 0, returned = 0;
    for (std::int64_t e : call.in[rank].topk_idx) routed += e >= 0;
    for (int n : got.count) returned += n;
    mine.dispatch_bytes = static_cast<double>(routed) * wire::ll::record_bytes(s);
    mine.combine_bytes = static_cast<double>(returned) * s.hidden * sizeof(bf16);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaStreamDestroy(stream);

  const auto gathered = boot.all_gather(std::as_bytes(std::span(&mine, 1)), dl);
  if (rank != 0) return 0;
  std::vector<rank_result> all(tc.world);
  std::memcpy(all.data(), gathered.data(), gathered.size());
  std::vector<double> d_bytes(devices, 0.0), c_bytes(devices, 0.0);
  std::vector<bool> used(devices, false);
  *row = {};
  row->world = tc.world;
  row->valid = 1;
  for (const rank_result& r : all) {
    d_bytes[r.device] += r.dispatch_bytes;
    c_bytes[r.device] += r.combine_bytes;
    used[r.device] = true;
    row->valid = row->valid && r.valid;
    for (int k = 0; k < 4; ++k) row->phase_us[k] = std::max(row->phase_us[k], r.phase_us[k]);
  }
  row->gpus = static_cast<int>(std::count(used.begin(), used.end(), true));
  row->dispatch_bytes = *std::max_element(d_bytes.begin(), d_bytes.end());
  row->combine_bytes = *std::max_element(c_bytes.begin(), c_bytes.end());
  std::snprintf(row->label, sizeof row->label, "%s T=%d H=%d K=%d E=%d",
                token_traits<Wire>::name.data(), tc.tokens, tc.hidden, tc.topk, tc.experts);
  return 0;
}

inline void print_ll_table(const ll_shared_results& r, double copy_bytes_per_s) {
  std::printf(
      "\nlow-latency mode (times in us; dispatch = send + receive, combine likewise; roofline%% = "
      "(bytes written on the busiest GPU / copy bandwidth) / time)\n");
  std::printf("%-34s %5s %4s | %7s %7s %7s %8s %9s | %7s %7s %7s %8s %9s\n", "case", "ranks",
              "GPUs", "send", "recv", "disp", "disp MB", "roofline%", "send", "recv", "comb",
              "comb MB", "roofline%");
  for (int i = 0; i < r.rows; ++i) {
    const ll_timing_row& t = r.row[i];
    auto part = [&](double send, double recv, double bytes) {
      const double us = send + recv;
      const double roof_us = bytes / copy_bytes_per_s * 1e6;
      std::printf(" %7.1f %7.1f %7.1f %8.2f %8.1f%% |", send, recv, us, bytes / 1e6,
                  100.0 * roof_us / us);
    };
    std::printf("%-34s %5d %4d |", t.label, t.world, t.gpus);
    part(t.phase_us[0], t.phase_us[1], t.dispatch_bytes);
    part(t.phase_us[2], t.phase_us[3], t.combine_bytes);
    std::printf("\n");
  }
}

}  // namespace epcomm::gpu_check
