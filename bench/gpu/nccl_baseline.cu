// NCCL point-to-point dispatch/combine baseline: kernels and host driver.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "epcomm/core/cuda_check.hpp"
#include "epcomm/core/layout.hpp"
#include "epcomm/core/spin_wait.hpp"
#include "epcomm/cuda/warp_copy.cuh"
#include "epcomm/normal/cuda/combine.cuh"
#include "epcomm/normal/cuda/layout.cuh"
#include "epcomm/normal/wire.hpp"
#include "nccl_baseline.hpp"

namespace epcomm::gpu_check {

namespace {

constexpr int warps = 8;

// Where each token's rows go: what the pack and reduce kernels share.
struct routed_rows {
  const std::int32_t* send_pos;  // [T][R]
  int send_offset[cuda::peer_table::max_ranks];
  int num_tokens, hidden, topk, world;
};

struct pack_args : routed_rows {
  const void* x;
  const float* x_scales;
  const std::int64_t* topk_idx;
  const float* topk_weights;
  int experts_per_rank;
  void* send_x;
  float* send_scales;
  std::int64_t* send_idx;
  float* send_weights;
  std::int32_t* send_src;
};

struct reduce_args : routed_rows {
  const void* returned;           // [rows sent][H] combine elements, by destination rank
  const float* returned_weights;  // [rows sent][K] or null
  void* out_x;
  float* out_weights;
};

// The ranks token t goes to, in rank order, gathered by one warp: dest[j] (when not null) is
// the j-th and row_of[j] the token's row in the packed send order there. Returns how many.
__device__ int gather_destinations(const std::int32_t* send_pos, const int* send_offset, int world,
                                   int t, int lane, int* dest, int* row_of) {
  int n = 0;
  for (int base = 0; base < world; base += 32) {
    const int r = base + lane;
    const int pos = r < world ? send_pos[static_cast<std::size_t>(t) * world + r] : -1;
    const unsigned goes = __ballot_sync(0xffffffffu, pos >= 0);
    if (pos >= 0) {
      const int j = n + __popc(goes & ((1u << lane) - 1u));
      if (dest != nullptr) dest[j] = r;
      row_of[j] = send_offset[r] + pos;
    }
    n += __popc(goes);
  }
  __syncwarp();
  return n;
}

// One warp per token: the row is read once and stored at each destination's
// slot of the per-destination send buffers.
template <class Token>
__global__ void __launch_bounds__(warps * 32) pack_kernel(pack_args a) {
  __shared__ std::byte* targets[warps][cuda::peer_table::max_ranks];
  __shared__ int dest[warps][cuda::peer_table::max_ranks];
  __shared__ int row_of[warps][cuda::peer_table::max_ranks];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const std::size_t row_bytes = static_cast<std::size_t>(a.hidden) * sizeof(Token);
  const std::size_t scale_bytes = static_cast<std::size_t>(a.hidden / 128) * sizeof(float);
  for (int t = blockIdx.x * warps + warp; t < a.num_tokens; t += gridDim.x * warps) {
    const int n =
        gather_destinations(a.send_pos, a.send_offset, a.world, t, lane, dest[warp], row_of[warp]);
    for (int j = lane; j < n; j += 32)
      targets[warp][j] = static_cast<std::byte*>(a.send_x) + row_of[warp][j] * row_bytes;
    __syncwarp();
    cuda::device::warp_copy_to_all(static_cast<const std::byte*>(a.x) + t * row_bytes,
                                   targets[warp], n, row_bytes,
                                   row_bytes | reinterpret_cast<std::uintptr_t>(a.send_x), lane);
    if constexpr (token_traits<Token>::has_scales) {
      __syncwarp();
      for (int j = lane; j < n; j += 32)
        targets[warp][j] =
            reinterpret_cast<std::byte*>(a.send_scales) + row_of[warp][j] * scale_bytes;
      __syncwarp();
      cuda::device::warp_copy_to_all(
          reinterpret_cast<const std::byte*>(a.x_scales) + t * scale_bytes, targets[warp], n,
          scale_bytes, scale_bytes | reinterpret_cast<std::uintptr_t>(a.send_scales), lane);
    }
    for (int i = lane; i < n * a.topk; i += 32) {
      const int j = i / a.topk;
      const int k = i % a.topk;
      const std::size_t at = static_cast<std::size_t>(row_of[warp][j]) * a.topk + k;
      const std::int64_t local = local_expert_id(
          a.topk_idx[static_cast<std::size_t>(t) * a.topk + k], dest[warp][j], a.experts_per_rank);
      a.send_idx[at] = local;
      a.send_weights[at] =
          local >= 0 ? a.topk_weights[static_cast<std::size_t>(t) * a.topk + k] : 0.0f;
    }
    for (int j = lane; j < n; j += 32) a.send_src[row_of[warp][j]] = t;
    __syncwarp();
  }
}

// One warp per token: the rows it got back, in rank order, summed in fp32
// (epcomm's own reduction, so the two agree bit for bit).
template <class Out>
__global__ void __launch_bounds__(warps * 32) reduce_kernel(reduce_args a) {
  __shared__ const std::byte* rows[warps][cuda::peer_table::max_ranks];
  __shared__ int row_of[warps][cuda::peer_table::max_ranks];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const std::size_t row_bytes = static_cast<std::size_t>(a.hidden) * sizeof(Out);
  cuda::combine_args c{};
  c.out_x = a.out_x;
  c.hidden = a.hidden;
  for (int t = blockIdx.x * warps + warp; t < a.num_tokens; t += gridDim.x * warps) {
    const int n =
        gather_destinations(a.send_pos, a.send_offset, a.world, t, lane, nullptr, row_of[warp]);
    for (int j = lane; j < n; j += 32)
      rows[warp][j] = static_cast<const std::byte*>(a.returned) + row_of[warp][j] * row_bytes;
    __syncwarp();
    cuda::device::reduce_token<Out, 0>(c, t, rows[warp], n, lane);
    if (a.out_weights != nullptr) {
      for (int k = lane; k < a.topk; k += 32) {
        float w = 0.0f;
        for (int j = 0; j < n; ++j)
          w += a.returned_weights[static_cast<std::size_t>(row_of[warp][j]) * a.topk + k];
        a.out_weights[static_cast<std::size_t>(t) * a.topk + k] = w;
      }
    }
    __syncwarp();
  }
}

unsigned blocks(int items) {
  return static_cast<unsigned>(std::clamp((items + warps - 1) / warps, 1, 1024));
}

template <class Token>
void launch_pack(const pack_args& a, cudaStream_t stream) {
  pack_kernel<Token><<<blocks(a.num_tokens), warps * 32, 0, stream>>>(a);
}

template <class Out>
void launch_reduce(const reduce_args& a, cudaStream_t stream) {
  reduce_kernel<Out><<<blocks(a.num_tokens), warps * 32, 0, stream>>>(a);
}

void launch_layout(const cuda::dispatch_args& a, cudaStream_t stream) {
  const int world = a.peers.world_size;
  cuda::device::layout_kernel<0>
      <<<world, cuda::device::layout_threads,
         static_cast<std::size_t>(a.num_experts / world) * sizeof(int), stream>>>(a);
}

}  // namespace

template <token_type Token>
nccl_baseline<Token>::nccl_baseline(local_bootstrap& boot, int num_experts, int max_tokens,
                                    int hidden, int topk, std::chrono::milliseconds timeout)
    : rank_(boot.rank()),
      world_(boot.world_size()),
      experts_(num_experts),
      max_tokens_(max_tokens),
      hidden_(hidden),
      topk_(topk),
      timeout_(timeout),
      send_counts_(world_),
      recv_counts_(world_),
      send_offset_(world_),
      recv_offset_(world_) {
  ncclUniqueId id{};
  if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  const auto ids = boot.all_gather(std::as_bytes(std::span(&id, 1)), deadline::after(timeout_));
  std::memcpy(&id, ids.data(), sizeof id);  // rank 0's
  // Non-blocking, so that initialisation and every exchange can be abandoned
  // at a deadline instead of hanging on a lost peer.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t init = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
  if (init != ncclInProgress) check(init, "ncclCommInitRankConfig");
  wait_comm("ncclCommInitRankConfig");

  const std::size_t r = world_;
  const std::size_t sent_rows = static_cast<std::size_t>(max_tokens) * std::min(topk, world_);
  const std::size_t recv_rows = static_cast<std::size_t>(max_tokens) * world_;
  const std::size_t h = hidden, k = topk;
  const std::size_t scales = token_traits<Token>::has_scales ? h / 128 : 0;
  wire::carver regions;
  const std::size_t o_pos = regions.take(sizeof(int) * max_tokens * r);
  const std::size_t o_rank = regions.take(sizeof(int) * r);
  const std::size_t o_expert = regions.take(sizeof(int) * num_experts);
  const std::size_t o_invalid = regions.take(sizeof(std::uint64_t));
  const std::size_t o_report = regions.take(sizeof(cuda::report));
  const std::size_t o_counts = regions.take(sizeof(int) * 2 * r);
  const std::size_t o_sx = regions.take(sent_rows * h * sizeof(Token));
  const std::size_t o_ss = regions.take(sent_rows * scales * sizeof(float));
  const std::size_t o_si = regions.take(sent_rows * k * sizeof(std::int64_t));
  const std::size_t o_sw = regions.take(sent_rows * k * sizeof(float));
  const std::size_t o_src = regions.take(sent_rows * sizeof(std::int32_t));
  const std::size_t o_rx = regions.take(recv_rows * h * sizeof(Token));
  const std::size_t o_rs = regions.take(recv_rows * scales * sizeof(float));
  const std::size_t o_ri = regions.take(recv_rows * k * sizeof(std::int64_t));
  const std::size_t o_rw = regions.take(recv_rows * k * sizeof(float));
  const std::size_t o_rsrc = regions.take(recv_rows * sizeof(std::int32_t));
  const std::size_t o_ret = regions.take(sent_rows * h * sizeof(combine_t));
  const std::size_t o_retw = regions.take(sent_rows * k * sizeof(float));
  check(cudaMalloc(&memory_, regions.at()), "cudaMalloc");
  check(cudaMemset(memory_, 0, regions.at()), "cudaMemset");
  auto* m = static_cast<std::byte*>(memory_);
  ws_.send_pos = reinterpret_cast<std::int32_t*>(m + o_pos);
  ws_.tokens_per_rank = reinterpret_cast<std::int32_t*>(m + o_rank);
  ws_.tokens_per_expert = reinterpret_cast<std::int32_t*>(m + o_expert);
  ws_.first_invalid = reinterpret_cast<std::uint64_t*>(m + o_invalid);
  ws_.rep = reinterpret_cast<cuda::report*>(m + o_report);
  counts_ = reinterpret_cast<std::int32_t*>(m + o_counts);
  send_x_ = m + o_sx;
  send_scales_ = reinterpret_cast<float*>(m + o_ss);
  send_idx_ = reinterpret_cast<std::int64_t*>(m + o_si);
  send_weights_ = reinterpret_cast<float*>(m + o_sw);
  send_src_ = reinterpret_cast<std::int32_t*>(m + o_src);
  recv_x_ = m + o_rx;
  recv_scales_ = reinterpret_cast<float*>(m + o_rs);
  recv_idx_ = reinterpret_cast<std::int64_t*>(m + o_ri);
  recv_weights_ = reinterpret_cast<float*>(m + o_rw);
  recv_src_ = reinterpret_cast<std::int32_t*>(m + o_rsrc);
  returned_ = m + o_ret;
  returned_weights_ = reinterpret_cast<float*>(m + o_retw);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

template <token_type Token>
nccl_baseline<Token>::~nccl_baseline() {
  if (comm_ != nullptr) ncclCommDestroy(comm_);
  if (memory_ != nullptr) cudaFree(memory_);
}

template <token_type Token>
void nccl_baseline<Token>::check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  throw error(rank_, "nccl baseline", no_peer,
              std::string(what) + " failed: " + ncclGetErrorString(r));
}

template <token_type Token>
void nccl_baseline<Token>::check(cudaError_t r, const char* what) {
  cuda::check_cuda(r, rank_, "nccl baseline", no_peer, what);
}

template <token_type Token>
void nccl_baseline<Token>::wait_comm(const char* what) {
  settle(
      [&] {
        ncclResult_t state = ncclInProgress;
        check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
        return state;
      },
      ncclInProgress, what);
}

template <token_type Token>
void nccl_baseline<Token>::wait_stream(cudaStream_t stream, const char* what) {
  settle([&] { return cudaStreamQuery(stream); }, cudaErrorNotReady, what);
}

template <token_type Token>
template <class Status, class Query>
void nccl_baseline<Token>::settle(Query&& query, Status pending, const char* what) {
  Status status = pending;
  if (detail::spin_wait(
          [&] {
            status = query();
            return status != pending;
          },
          deadline::after(timeout_), [] {})) {
    check(status, what);
    return;
  }
  // Aborted, so that no later call on the communicator hangs.
  ncclCommAbort(comm_);
  comm_ = nullptr;
  throw error(rank_, "nccl baseline", no_peer, std::string(what) + " did not complete in time");
}

template <token_type Token>
void nccl_baseline<Token>::exchange_rows(const void* from, const std::vector<int>& from_offset,
                                         const std::vector<int>& from_count, void* to,
                                         const std::vector<int>& to_offset,
                                         const std::vector<int>& to_count, std::size_t row_bytes,
                                         cudaStream_t stream) {
  if (row_bytes == 0) return;
  for (int p = 0; p < world_; ++p) {
    check(ncclSend(static_cast<const std::byte*>(from) + from_offset[p] * row_bytes,
                   from_count[p] * row_bytes, ncclUint8, p, comm_, stream),
          "ncclSend");
    check(ncclRecv(static_cast<std::byte*>(to) + to_offset[p] * row_bytes, to_count[p] * row_bytes,
                   ncclUint8, p, comm_, stream),
          "ncclRecv");
  }
}

template <token_type Token>
template <class Args>
void nccl_baseline<Token>::fill_routing(Args& a) const {
  a.send_pos = ws_.send_pos;
  std::copy(send_offset_.begin(), send_offset_.end(), a.send_offset);
  a.num_tokens = num_tokens_;
  a.hidden = hidden_;
  a.topk = topk_;
  a.world = world_;
}

template <token_type Token>
auto nccl_baseline<Token>::dispatch(const Token* x, const float* scales,
                                    const std::int64_t* topk_idx, const float* topk_weights,
                                    int num_tokens, cudaStream_t stream) -> received {
  num_tokens_ = num_tokens;
  cuda::dispatch_args layout{};
  layout.peers.world_size = world_;
  layout.ws = ws_;
  layout.topk_idx = topk_idx;
  layout.num_tokens = num_tokens;
  layout.topk = topk_;
  layout.num_experts = experts_;
  launch_layout(layout, stream);

  // Counts: an all-to-all of one int per peer, then the host synchronisation
  // that sizes the payload exchange.
  check(ncclGroupStart(), "ncclGroupStart");
  for (int p = 0; p < world_; ++p) {
    check(ncclSend(ws_.tokens_per_rank + p, 1, ncclInt32, p, comm_, stream), "ncclSend(count)");
    check(ncclRecv(counts_ + world_ + p, 1, ncclInt32, p, comm_, stream), "ncclRecv(count)");
  }
  const ncclResult_t g = ncclGroupEnd();
  if (g != ncclInProgress) check(g, "ncclGroupEnd(counts)");
  wait_comm("counts all-to-all");
  check(cudaMemcpyAsync(send_counts_.data(), ws_.tokens_per_rank, sizeof(int) * world_,
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(counts)");
  check(cudaMemcpyAsync(recv_counts_.data(), counts_ + world_, sizeof(int) * world_,
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(counts)");
  wait_stream(stream, "counts exchange");
  int sent = 0, got = 0;
  for (int p = 0; p < world_; ++p) {
    send_offset_[p] = sent;
    recv_offset_[p] = got;
    sent += send_counts_[p];
    got += recv_counts_[p];
  }

  pack_args pa{};
  fill_routing(pa);
  pa.x = x;
  pa.x_scales = scales;
  pa.topk_idx = topk_idx;
  pa.topk_weights = topk_weights;
  pa.experts_per_rank = experts_ / world_;
  pa.send_x = send_x_;
  pa.send_scales = send_scales_;
  pa.send_idx = send_idx_;
  pa.send_weights = send_weights_;
  pa.send_src = send_src_;
  launch_pack<Token>(pa, stream);
  check(cudaGetLastError(), "pack kernel launch");

  const std::size_t row = static_cast<std::size_t>(hidden_) * sizeof(Token);
  const std::size_t srow = token_traits<Token>::has_scales ? hidden_ / 128 * sizeof(float) : 0;
  const std::size_t k = topk_;
  auto exchange = [&](const void* from, void* to, std::size_t row_bytes) {
    exchange_rows(from, send_offset_, send_counts_, to, recv_offset_, recv_counts_, row_bytes,
                  stream);
  };
  check(ncclGroupStart(), "ncclGroupStart");
  exchange(send_x_, recv_x_, row);
  exchange(send_scales_, recv_scales_, srow);
  exchange(send_idx_, recv_idx_, k * sizeof(std::int64_t));
  exchange(send_weights_, recv_weights_, k * sizeof(float));
  exchange(send_src_, recv_src_, sizeof(std::int32_t));
  const ncclResult_t e = ncclGroupEnd();
  if (e != ncclInProgress) check(e, "ncclGroupEnd(payload)");
  wait_comm("payload all-to-all");
  return {got,      static_cast<const Token*>(recv_x_), recv_scales_, recv_idx_, recv_weights_,
          recv_src_};
}

template <token_type Token>
void nccl_baseline<Token>::combine(const combine_t* y, const float* y_weights, combine_t* out_x,
                                   float* out_weights, cudaStream_t stream) {
  const std::size_t row = static_cast<std::size_t>(hidden_) * sizeof(combine_t);
  const std::size_t wrow = static_cast<std::size_t>(topk_) * sizeof(float);
  // The dispatch's exchange reversed: rows go back where they came from.
  check(ncclGroupStart(), "ncclGroupStart");
  exchange_rows(y, recv_offset_, recv_counts_, returned_, send_offset_, send_counts_, row, stream);
  if (y_weights != nullptr)
    exchange_rows(y_weights, recv_offset_, recv_counts_, returned_weights_, send_offset_,
                  send_counts_, wrow, stream);
  const ncclResult_t e = ncclGroupEnd();
  if (e != ncclInProgress) check(e, "ncclGroupEnd(combine)");
  wait_comm("combine all-to-all");

  reduce_args ra{};
  fill_routing(ra);
  ra.returned = returned_;
  ra.returned_weights = returned_weights_;
  ra.out_x = out_x;
  ra.out_weights = y_weights != nullptr ? out_weights : nullptr;
  launch_reduce<combine_t>(ra, stream);
  check(cudaGetLastError(), "reduce kernel launch");
}

template class nccl_baseline<bf16>;
template class nccl_baseline<fp8_e4m3>;
template class nccl_baseline<float>;

}  // namespace epcomm::gpu_check
