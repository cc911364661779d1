// One device buffer serving bf16, fp8 and fp32 calls (DeepEP's one Buffer
// for every dtype), against a host engine serving the same list, on every
// rank:
//   - scenarios of each type in turn on the one buffer (run_scenario): rows,
//     notify slots and combine outputs byte for byte, the reference's checks;
//   - fp32 rows along the handle of an fp8 dispatch (a cached dispatch of
//     another type than its handle's), then a combine of that handle;
//   - the last rank dispatching fp8 among bf16, then combining fp32 rows
//     among bf16: every rank fails with the host engine's message naming it,
//     and the buffer serves the next call.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <string>
#include <vector>

#include "correctness.hpp"

namespace epcomm::gpu_check {

template <class Link>
using mixed_device_engine = cuda::device_buffer<Link, bf16, fp8_e4m3, float>;
using mixed_host_engine = buffer<shm::transport, bf16, fp8_e4m3, float>;

// fp32 rows along an fp8 dispatch's handle, and a combine of it.
template <class Link>
std::string check_cached_other_type(int rank, mixed_device_engine<Link>& dev,
                                    mixed_host_engine& host, cudaStream_t stream) {
  const int world = dev.world_size();
  const test::shape s{world, 40, 256, 4, dev.capacity().num_experts, test::routing::random, 110};
  const auto mine = test::make_input<fp8_e4m3>(s, rank);
  const dispatch_handle host_handle =
      host.dispatch<fp8_e4m3>(
              {s.tokens, s.hidden, s.topk, mine.x, mine.scales, mine.topk_idx, mine.topk_weights})
          .handle;
  const device_input<fp8_e4m3> din(mine, 0);
  const cuda::device_dispatch_handle handle = dev.dispatch(din.view(s), {}, stream).handle;

  const auto rows = test::make_input<float>(s, rank);
  const device_input<float> drows(rows, 0);
  const auto hc = host.dispatch(cached_dispatch_input<float>{rows.x, {}}, host_handle);
  const auto dc = dev.dispatch(cuda::device_cached_dispatch_input<float>{drows.x.data(), nullptr},
                               handle, stream);
  const std::size_t n = hc.num_recv_tokens, h = s.hidden;
  if (dc.num_recv_tokens != hc.num_recv_tokens || dc.recv_x_scales != nullptr)
    return "fp32 rows along an fp8 handle: counts or scales differ from the host engine's";
  if (!same_bytes<float>(device_array<float>::read(dc.recv_x, n * h), hc.recv_x.first(n * h)) ||
      !same_bytes<std::int32_t>(device_array<std::int32_t>::read(dc.recv_src_idx, n),
                                hc.recv_src_idx.first(n)))
    return "fp32 rows along an fp8 handle differ from the host engine's";

  std::vector<float> y(n * h);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = test::uniform(test::hash(111, rank, i, 0));
  const auto hout = host.combine<float>({y, std::nullopt, {}, {}}, host_handle);
  const device_array<float> dy{std::span<const float>(y)};
  device_array<float> out(static_cast<std::size_t>(s.tokens) * h);
  dev.combine({dy.data(), static_cast<long long>(n), nullptr, nullptr, nullptr}, handle, out.data(),
              nullptr, stream);
  if (!same_bytes<float>(out.download(), hout.x))
    return "an fp32 combine of an fp8 dispatch's handle differs from the host engine's";
  return {};
}

// The last rank calls with another type than the others: a dispatch, then
// (after a bf16 dispatch every rank makes) a combine.
template <class Link>
std::string check_type_disagreement(int rank, mixed_device_engine<Link>& dev,
                                    mixed_host_engine& host, cudaStream_t stream) {
  const int world = dev.world_size();
  const int culprit = world - 1;
  const bool odd = rank == culprit;
  const test::shape s{world, 24, 256, 2, dev.capacity().num_experts, test::routing::random, 120};
  const auto as_bf16 = test::make_input<bf16>(s, rank);
  const auto as_fp8 = test::make_input<fp8_e4m3>(s, rank);
  const device_input<bf16> d_bf16(as_bf16, 0);
  const device_input<fp8_e4m3> d_fp8(as_fp8, 0);
  if (auto e = same_failure(
          [&] {
            if (odd)
              host.dispatch<fp8_e4m3>({s.tokens, s.hidden, s.topk, as_fp8.x, as_fp8.scales,
                                       as_fp8.topk_idx, as_fp8.topk_weights});
            else
              host.dispatch<bf16>({s.tokens,
                                   s.hidden,
                                   s.topk,
                                   as_bf16.x,
                                   {},
                                   as_bf16.topk_idx,
                                   as_bf16.topk_weights});
          },
          [&] {
            if (odd)
              dev.dispatch(d_fp8.view(s), {}, stream);
            else
              dev.dispatch(d_bf16.view(s), {}, stream);
          },
          culprit, "token type fp8_e4m3 on that rank disagrees with bf16 on rank 0");
      !e.empty())
    return "an fp8 dispatch among bf16: " + e;

  const auto hres = host.dispatch<bf16>(
      {s.tokens, s.hidden, s.topk, as_bf16.x, {}, as_bf16.topk_idx, as_bf16.topk_weights});
  // In braces, as docs/cuda.md writes it: the buffer's first type.
  const auto dres = dev.dispatch({s.tokens, s.hidden, s.topk, d_bf16.x.data(), nullptr,
                                  d_bf16.topk_idx.data(), d_bf16.topk_weights.data()},
                                 {}, stream);
  const std::size_t n = hres.num_recv_tokens, h = s.hidden;
  const std::vector<bf16> y_bf16 = test::expert_rows(hres, s.hidden, rank);
  std::vector<float> y_fp32(y_bf16.size());
  for (std::size_t i = 0; i < y_fp32.size(); ++i) y_fp32[i] = to_float(y_bf16[i]);
  const device_array<bf16> dy_bf16{std::span<const bf16>(y_bf16)};
  const device_array<float> dy_fp32{std::span<const float>(y_fp32)};
  device_array<bf16> out_bf16(static_cast<std::size_t>(s.tokens) * h);
  device_array<float> out_fp32(static_cast<std::size_t>(s.tokens) * h);
  const auto rows = static_cast<long long>(n);
  if (auto e = same_failure(
          [&] {
            if (odd)
              host.combine<float>({y_fp32, std::nullopt, {}, {}}, hres.handle);
            else
              host.combine<bf16>({y_bf16, std::nullopt, {}, {}}, hres.handle);
          },
          [&] {
            if (odd)
              dev.combine({dy_fp32.data(), rows, nullptr, nullptr, nullptr}, dres.handle,
                          out_fp32.data(), nullptr, stream);
            else
              dev.combine({dy_bf16.data(), rows, nullptr, nullptr, nullptr}, dres.handle,
                          out_bf16.data(), nullptr, stream);
          },
          culprit, "y's element type fp32 on that rank disagrees with bf16 on rank 0");
      !e.empty())
    return "an fp32 combine among bf16: " + e;
  return {};
}

// Every check of this file on `world` ranks over `Link`.
template <class Link = nvlink_ipc::transport>
int check_mixed_types_rank(local_bootstrap& boot) {
  rank_check rc(boot.rank());
  const int rank = rc.rank;
  const cudaStream_t stream = rc.stream;
  const buffer_config cfg{.num_experts = 8 * boot.world_size(),
                          .max_hidden = 512,
                          .max_topk = 4,
                          .max_tokens_per_rank = 96,
                          .timeout = std::chrono::seconds(60)};
  mixed_device_engine<Link> dev(boot, cfg, check_rma_memory);
  mixed_host_engine host(boot, cfg);
  const int world = boot.world_size();
  const int experts = cfg.num_experts;
  using test::routing;
  // fp8, fp32, then bf16 on the same regions: each type's rows over the
  // previous type's, the bf16 ones with a hidden fp8 could not take.
  const scenario fp8{{world, 96, 256, 4, experts, routing::random, 101}, world * 96};
  const scenario fp32{{world, 48, 256, 3, experts, routing::uneven, 102}, 0, true};
  const scenario bf16_generic{{world, 33, 100, 2, experts, routing::random, 103}, 0, false, 1};
  rc.note(describe(fp8, "fp8_e4m3 on a mixed buffer"),
          run_scenario<fp8_e4m3>(rank, dev, host, fp8, stream));
  rc.note(describe(fp32, "fp32 on a mixed buffer"),
          run_scenario<float>(rank, dev, host, fp32, stream));
  rc.note(describe(bf16_generic, "bf16 on a mixed buffer"),
          run_scenario<bf16>(rank, dev, host, bf16_generic, stream));
  rc.note("cached dispatch of another type", check_cached_other_type(rank, dev, host, stream));
  if (world > 1) {
    rc.note("type disagreement", check_type_disagreement(rank, dev, host, stream));
    // Both rejected calls left the buffer as it was.
    const scenario after{{world, 32, 256, 2, experts, routing::random, 104}};
    rc.note("after a type disagreement", run_scenario<fp8_e4m3>(rank, dev, host, after, stream));
  }
  return rc.exit_code();
}

}  // namespace epcomm::gpu_check
