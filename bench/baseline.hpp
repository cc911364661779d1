// The baseline: normal-mode dispatch and combine the way a framework writes them without a
// dispatcher, over MPI collectives. It produces exactly epcomm's results, so the two can be
// checked equal before either is timed.
//
//   dispatch  1. layout: the ranks each token goes to (once per rank, like epcomm);
//             2. count exchange: MPI_Alltoall of the rows and per-expert counts for each rank;
//             3. local permutation: pack the rows (and their top-k ids rewritten to the
//                receiver's local experts, weights, source index, fp8 scales) into one
//                contiguous block per destination rank;
//             4. payload: one MPI_Alltoallv per array. Rows arrive grouped by source rank in
//                each source's token order, which is epcomm's receive order.
//   combine   the reverse: MPI_Alltoallv of the expert outputs (and weights) back to their
//             sources, then the inverse permutation, summing each token's rows in fp32 in rank
//             order (the order epcomm sums in, so the results are bitwise equal).
//
// The layout is computed here independently of epcomm's, so a disagreement shows up.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "epcomm/core/combine_reduce.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/arguments.hpp"
#include "options.hpp"

namespace epcomm::bench {

// An MPI datatype of `bytes` contiguous bytes: one row of an array, so counts stay small.
class row_type {
 public:
  explicit row_type(std::size_t bytes) {
    MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &type_);
    MPI_Type_commit(&type_);
  }
  row_type(const row_type&) = delete;
  row_type& operator=(const row_type&) = delete;
  ~row_type() { MPI_Type_free(&type_); }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

template <token_type Token>
class alltoall_baseline {
 public:
  using out_type = combine_type_t<Token>;

  alltoall_baseline(MPI_Comm comm, const workload& w)
      : comm_(comm),
        hidden_(w.hidden),
        topk_(w.topk),
        scales_per_row_(token_traits<Token>::has_scales ? w.hidden / fp8_block : 0),
        x_row_(sizeof(Token) * w.hidden),
        scale_row_(sizeof(float) * scales_per_row_),
        idx_row_(sizeof(std::int64_t) * w.topk),
        weight_row_(sizeof(float) * w.topk),
        src_row_(sizeof(std::int32_t)),
        out_row_(sizeof(out_type) * w.hidden) {
    MPI_Comm_size(comm, &world_);
    experts_per_rank_ = w.experts / world_;
    send_rows_.resize(world_);
    recv_rows_.resize(world_);
    send_at_.resize(world_);
    recv_at_.resize(world_);
  }

  void dispatch(const dispatch_input<Token>& in) {
    const int t_count = in.num_tokens;
    const std::size_t h = hidden_, k = topk_, ns = scales_per_row_;
    const int per_rank = experts_per_rank_;
    // 1. Layout.
    const std::size_t counts_per_peer = 1 + per_rank;  // rows, then rows per local expert
    send_counts_.assign(world_ * counts_per_peer, 0);
    dest_pos_.assign(static_cast<std::size_t>(t_count) * world_, -1);
    for (int t = 0; t < t_count; ++t) {
      for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t e = in.topk_idx[t * k + j];
        if (e < 0) continue;
        const int r = static_cast<int>(e / per_rank);
        ++send_counts_[r * counts_per_peer + 1 + e % per_rank];
        int& pos = dest_pos_[static_cast<std::size_t>(t) * world_ + r];
        if (pos < 0) pos = send_counts_[r * counts_per_peer]++;
      }
    }
    // 2. Count exchange.
    recv_counts_.resize(send_counts_.size());
    MPI_Alltoall(send_counts_.data(), static_cast<int>(counts_per_peer), MPI_INT,
                 recv_counts_.data(), static_cast<int>(counts_per_peer), MPI_INT, comm_);
    int sent = 0, received = 0;
    tokens_per_expert_.assign(per_rank, 0);
    for (int r = 0; r < world_; ++r) {
      send_rows_[r] = send_counts_[r * counts_per_peer];
      recv_rows_[r] = recv_counts_[r * counts_per_peer];
      send_at_[r] = sent;
      recv_at_[r] = received;
      sent += send_rows_[r];
      received += recv_rows_[r];
      for (int e = 0; e < per_rank; ++e)
        tokens_per_expert_[e] += recv_counts_[r * counts_per_peer + 1 + e];
    }
    num_recv_ = received;
    // 3. Local permutation into destination order.
    send_x_.resize(sent * h);
    send_scales_.resize(sent * ns);
    send_idx_.resize(sent * k);
    send_weights_.resize(sent * k);
    send_src_.resize(sent);
    for (int t = 0; t < t_count; ++t) {
      for (int r = 0; r < world_; ++r) {
        const int pos = dest_pos_[static_cast<std::size_t>(t) * world_ + r];
        if (pos < 0) continue;
        const std::size_t row = static_cast<std::size_t>(send_at_[r] + pos);
        std::memcpy(send_x_.data() + row * h, in.x.data() + t * h, h * sizeof(Token));
        if (ns != 0)
          std::memcpy(send_scales_.data() + row * ns, in.x_scales.data() + t * ns,
                      ns * sizeof(float));
        const std::int64_t first = static_cast<std::int64_t>(r) * per_rank;
        for (std::size_t j = 0; j < k; ++j) {
          const std::int64_t e = in.topk_idx[t * k + j];
          const bool here = e >= first && e < first + per_rank;
          send_idx_[row * k + j] = here ? e - first : -1;
          send_weights_[row * k + j] = here ? in.topk_weights[t * k + j] : 0.0f;
        }
        send_src_[row] = t;
      }
    }
    // 4. Payload.
    recv_x_.resize(received * h);
    recv_scales_.resize(received * ns);
    recv_idx_.resize(received * k);
    recv_weights_.resize(received * k);
    recv_src_.resize(received);
    exchange(send_x_.data(), recv_x_.data(), x_row_, send_rows_, send_at_, recv_rows_, recv_at_);
    if (ns != 0)
      exchange(send_scales_.data(), recv_scales_.data(), scale_row_, send_rows_, send_at_,
               recv_rows_, recv_at_);
    exchange(send_idx_.data(), recv_idx_.data(), idx_row_, send_rows_, send_at_, recv_rows_,
             recv_at_);
    exchange(send_weights_.data(), recv_weights_.data(), weight_row_, send_rows_, send_at_,
             recv_rows_, recv_at_);
    exchange(send_src_.data(), recv_src_.data(), src_row_, send_rows_, send_at_, recv_rows_,
             recv_at_);
  }

  // y[N][H] and y_weights[N][K] are aligned with the rows the last dispatch received.
  void combine(std::span<const out_type> y, std::span<const float> y_weights,
               std::span<out_type> out_x, std::span<float> out_weights) {
    const std::size_t h = hidden_, k = topk_;
    int sent = 0;
    for (int r = 0; r < world_; ++r) sent += send_rows_[r];
    back_x_.resize(sent * h);
    back_weights_.resize(sent * k);
    // Rows go back the way they came: what this rank received from s returns to s.
    exchange(y.data(), back_x_.data(), out_row_, recv_rows_, recv_at_, send_rows_, send_at_);
    exchange(y_weights.data(), back_weights_.data(), weight_row_, recv_rows_, recv_at_, send_rows_,
             send_at_);
    // Inverse permutation and reduction.
    const std::size_t t_count = dest_pos_.size() / world_;
    // The same reduction kernel as epcomm's, so that the two differ in how
    // the rows travel only.
    reduce_tokens<out_type>(static_cast<int>(t_count), h, k, {}, {}, out_x, out_weights,
                            [&](int t, auto&& add) {
                              for (int r = 0; r < world_; ++r) {
                                const int pos = dest_pos_[static_cast<std::size_t>(t) * world_ + r];
                                if (pos < 0) continue;
                                const std::size_t row = static_cast<std::size_t>(send_at_[r] + pos);
                                add(back_x_.data() + row * h, back_weights_.data() + row * k);
                              }
                            });
  }

  // The last dispatch's results, in epcomm's layout.
  int num_recv_tokens() const { return num_recv_; }
  std::span<const Token> recv_x() const { return recv_x_; }
  std::span<const float> recv_x_scales() const { return recv_scales_; }
  std::span<const std::int64_t> recv_topk_idx() const { return recv_idx_; }
  std::span<const float> recv_topk_weights() const { return recv_weights_; }
  std::span<const std::int32_t> recv_src_idx() const { return recv_src_; }
  const std::vector<int>& num_recv_tokens_per_expert() const { return tokens_per_expert_; }

 private:
  void exchange(const void* send, void* recv, const row_type& type, const std::vector<int>& sc,
                const std::vector<int>& sd, const std::vector<int>& rc,
                const std::vector<int>& rd) {
    MPI_Alltoallv(send, sc.data(), sd.data(), type.get(), recv, rc.data(), rd.data(), type.get(),
                  comm_);
  }

  MPI_Comm comm_;
  int world_ = 0;
  int hidden_;
  int topk_;
  int scales_per_row_;
  int experts_per_rank_ = 0;
  row_type x_row_, scale_row_, idx_row_, weight_row_, src_row_, out_row_;

  std::vector<int> send_counts_, recv_counts_;  // [R][1 + E/R]
  std::vector<int> dest_pos_;                   // [T][R]: row among those sent to r, or -1
  std::vector<int> send_rows_, recv_rows_, send_at_, recv_at_;  // [R], in rows
  std::vector<int> tokens_per_expert_;
  int num_recv_ = 0;

  std::vector<Token> send_x_, recv_x_;
  std::vector<float> send_scales_, recv_scales_;
  std::vector<std::int64_t> send_idx_, recv_idx_;
  std::vector<float> send_weights_, recv_weights_;
  std::vector<std::int32_t> send_src_, recv_src_;
  std::vector<out_type> back_x_;
  std::vector<float> back_weights_;
};

}  // namespace epcomm::bench
