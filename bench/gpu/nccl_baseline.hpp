// The baseline users have today on GPUs: dispatch and combine built from NCCL
// point-to-point calls, the way frameworks do it without a dedicated library:
//
//   dispatch  layout (epcomm's layout kernel, so both sides pay the same),
//             an all-to-all of per-rank counts (ncclSend/ncclRecv in a group),
//             a host synchronisation to size the exchange, a pack kernel that
//             permutes rows into per-destination order, and one all-to-all per
//             array (rows, scales, top-k ids, weights, source index);
//   combine   the reverse all-to-all of expert outputs and weights, then a
//             reduction kernel that sums each token's returned rows.
//
// Received rows come out ordered by (source rank, source token), the same
// layout and bits as epcomm's dispatch, so the check program compares them
// directly. NCCL refuses two ranks on one GPU, so this runs only where every
// rank has its own device.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/cuda/launch.hpp"

namespace epcomm::gpu_check {

template <token_type Token>
class nccl_baseline {
 public:
  using combine_t = combine_type_t<Token>;

  nccl_baseline(local_bootstrap& boot, int num_experts, int max_tokens, int hidden, int topk,
                std::chrono::milliseconds timeout);
  nccl_baseline(const nccl_baseline&) = delete;
  nccl_baseline& operator=(const nccl_baseline&) = delete;
  ~nccl_baseline();

  struct received {
    int rows = 0;
    const Token* x = nullptr;
    const float* scales = nullptr;
    const std::int64_t* topk_idx = nullptr;
    const float* topk_weights = nullptr;
    const std::int32_t* src_idx = nullptr;
  };

  received dispatch(const Token* x, const float* scales, const std::int64_t* topk_idx,
                    const float* topk_weights, int num_tokens, cudaStream_t stream);
  void combine(const combine_t* y, const float* y_weights, combine_t* out_x, float* out_weights,
               cudaStream_t stream);

 private:
  void check(ncclResult_t r, const char* what);
  void check(cudaError_t r, const char* what);
  void wait_comm(const char* what);
  void wait_stream(cudaStream_t stream, const char* what);
  // Polls query() for an operation's status until it is no longer `pending`,
  // then checks it; past the timeout, aborts the communicator and throws.
  template <class Status, class Query>
  void settle(Query&& query, Status pending, const char* what);
  // Sends, for every rank p, its from_count[p] rows of `from` (starting at
  // row from_offset[p]) and receives to_count[p] rows into `to` (at row
  // to_offset[p]); rows of row_bytes. Called within a group.
  void exchange_rows(const void* from, const std::vector<int>& from_offset,
                     const std::vector<int>& from_count, void* to,
                     const std::vector<int>& to_offset, const std::vector<int>& to_count,
                     std::size_t row_bytes, cudaStream_t stream);
  // Fills what the pack and reduce kernels' arguments share (routed_rows):
  // the routing of the last dispatch.
  template <class Args>
  void fill_routing(Args& a) const;

  int rank_, world_, experts_, max_tokens_, hidden_, topk_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  int num_tokens_ = 0;
  std::vector<int> send_counts_, recv_counts_, send_offset_, recv_offset_;
  // Device memory: layout workspace, staging, receive arrays.
  void* memory_ = nullptr;
  cuda::workspace ws_{};
  std::int32_t* counts_ = nullptr;  // [2][R]: sent, received
  void* send_x_ = nullptr;
  float* send_scales_ = nullptr;
  std::int64_t* send_idx_ = nullptr;
  float* send_weights_ = nullptr;
  std::int32_t* send_src_ = nullptr;
  void* recv_x_ = nullptr;
  float* recv_scales_ = nullptr;
  std::int64_t* recv_idx_ = nullptr;
  float* recv_weights_ = nullptr;
  std::int32_t* recv_src_ = nullptr;
  void* returned_ = nullptr;
  float* returned_weights_ = nullptr;
};

}  // namespace epcomm::gpu_check
