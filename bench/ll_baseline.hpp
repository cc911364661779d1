// The low-latency baseline: low-latency dispatch and combine the way a framework writes them
// without a dispatcher, over MPI collectives, producing exactly epcomm's low-latency results.
//
//   dispatch  1. count exchange: MPI_Alltoall of the rows for each (rank, local expert); a row
//                is one (token, top-k slot), as in epcomm's low-latency mode;
//             2. pack each row (cast to fp8 once per token on the fp8 wire) with its (token,
//                slot) into one contiguous block per destination rank, by (local expert, token,
//                slot);
//             3. payload: MPI_Alltoallv of the rows, the fp8 scales and the (token, slot) pairs;
//             4. local permutation into expert order: rows arrive by (source, local expert);
//                they are copied into [local expert][source, token, slot], epcomm's layout.
//   combine   the reverse: the expert outputs are permuted back into source order, go back with
//             MPI_Alltoallv, and each token's rows are summed with its top-k weights in fp32,
//             in slot order (epcomm's order, so the results are bitwise equal).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "baseline.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/low_latency/wire.hpp"
#include "options.hpp"

namespace epcomm::bench {

template <class Wire>
class ll_alltoall_baseline {
  static constexpr bool fp8 = token_traits<Wire>::has_scales;

 public:
  // Sized like epcomm's buffer: at most w.tokens tokens per rank.
  ll_alltoall_baseline(MPI_Comm comm, const workload& w)
      : comm_(comm),
        hidden_(w.hidden),
        topk_(w.topk),
        max_tokens_(w.tokens),
        scales_per_row_(fp8 ? w.hidden / fp8_block : 0),
        x_row_(sizeof(Wire) * w.hidden),
        scale_row_(sizeof(float) * scales_per_row_),
        origin_row_(sizeof(origin)),
        y_row_(sizeof(bf16) * w.hidden) {
    MPI_Comm_size(comm, &world_);
    per_rank_ = w.experts / world_;
    const std::size_t rows = static_cast<std::size_t>(per_rank_) * world_ * max_tokens_;
    recv_x_.resize(rows * hidden_);
    recv_scales_.resize(rows * scales_per_row_);
    recv_src_.resize(rows);
    recv_range_.resize(static_cast<std::size_t>(per_rank_) * world_);
    recv_count_.resize(per_rank_);
    for (auto* v : {&send_rows_, &send_at_, &recv_rows_, &recv_at_}) v->resize(world_);
  }

  void dispatch(std::span<const bf16> x, std::span<const std::int64_t> topk_idx, int num_tokens) {
    const std::size_t h = hidden_, k = topk_, ns = scales_per_row_;
    // 1. Count exchange: rows per (destination rank, local expert).
    send_counts_.assign(static_cast<std::size_t>(world_) * per_rank_, 0);
    for (std::size_t i = 0; i < static_cast<std::size_t>(num_tokens) * k; ++i)
      if (topk_idx[i] >= 0) ++send_counts_[topk_idx[i]];  // expert e is entry (e / E_l, e % E_l)
    recv_counts_.resize(send_counts_.size());
    MPI_Alltoall(send_counts_.data(), per_rank_, MPI_INT, recv_counts_.data(), per_rank_, MPI_INT,
                 comm_);
    int sent = 0, received = 0;
    cursor_.resize(send_counts_.size());
    for (int r = 0; r < world_; ++r) {
      send_at_[r] = sent;
      recv_at_[r] = received;
      send_rows_[r] = recv_rows_[r] = 0;
      for (int le = 0; le < per_rank_; ++le) {
        const std::size_t b = static_cast<std::size_t>(r) * per_rank_ + le;
        cursor_[b] = sent + send_rows_[r];
        send_rows_[r] += send_counts_[b];
        recv_rows_[r] += recv_counts_[b];
      }
      sent += send_rows_[r];
      received += recv_rows_[r];
    }
    // 2. Pack by (destination, local expert, token, slot); remember where each (token, slot)
    // went, for combine.
    send_x_.resize(sent * h);
    send_scales_.resize(sent * ns);
    send_origin_.resize(sent);
    row_of_.assign(static_cast<std::size_t>(num_tokens) * k, -1);
    cast_.resize(fp8 ? h : 0);
    cast_scales_.resize(ns);
    for (int t = 0; t < num_tokens; ++t) {
      const bf16* row = x.data() + static_cast<std::size_t>(t) * h;
      const Wire* payload;
      if constexpr (fp8) {
        quantize_fp8_row(row, hidden_, cast_.data(), cast_scales_.data(), false);
        payload = cast_.data();
      } else {
        payload = row;
      }
      for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t e = topk_idx[t * k + j];
        if (e < 0) continue;
        const int at = cursor_[e]++;
        row_of_[t * k + j] = at;
        std::memcpy(send_x_.data() + at * h, payload, h * sizeof(Wire));
        if constexpr (fp8)
          std::memcpy(send_scales_.data() + at * ns, cast_scales_.data(), ns * sizeof(float));
        send_origin_[at] = {t, static_cast<std::int32_t>(j)};
      }
    }
    // 3. Payload.
    arrived_x_.resize(received * h);
    arrived_scales_.resize(received * ns);
    arrived_origin_.resize(received);
    exchange(send_x_.data(), arrived_x_.data(), x_row_, true);
    if constexpr (fp8) exchange(send_scales_.data(), arrived_scales_.data(), scale_row_, true);
    exchange(send_origin_.data(), arrived_origin_.data(), origin_row_, true);
    // 4. Permutation into expert order: expert le's rows by source, then token, then slot.
    const std::size_t per_expert = static_cast<std::size_t>(world_) * max_tokens_;
    for (int le = 0; le < per_rank_; ++le) {
      int filled = 0;
      for (int s = 0; s < world_; ++s) {
        int from = recv_at_[s];
        for (int l = 0; l < le; ++l)
          from += recv_counts_[static_cast<std::size_t>(s) * per_rank_ + l];
        const int n = recv_counts_[static_cast<std::size_t>(s) * per_rank_ + le];
        recv_range_[static_cast<std::size_t>(le) * world_ + s] = {filled, n};
        const std::size_t to = le * per_expert + filled;
        std::memcpy(recv_x_.data() + to * h, arrived_x_.data() + from * h, n * h * sizeof(Wire));
        if constexpr (fp8)
          std::memcpy(recv_scales_.data() + to * ns, arrived_scales_.data() + from * ns,
                      n * ns * sizeof(float));
        for (int i = 0; i < n; ++i) {
          const origin& o = arrived_origin_[from + i];
          recv_src_[to + i] = {s, o.token, o.slot};
        }
        filled += n;
      }
      recv_count_[le] = filled;
    }
  }

  // y[E_local][R * max_tokens][H] is aligned with the last dispatch's recv_x; writes out[T][H].
  void combine(std::span<const bf16> y, std::span<const float> topk_weights, std::span<bf16> out) {
    const std::size_t h = hidden_, k = topk_;
    const std::size_t per_expert = static_cast<std::size_t>(world_) * max_tokens_;
    int received = 0, sent = 0;
    for (int r = 0; r < world_; ++r) {
      received += recv_rows_[r];
      sent += send_rows_[r];
    }
    // Inverse permutation: back into (source, local expert) order.
    back_send_.resize(received * h);
    for (int s = 0; s < world_; ++s) {
      int to = recv_at_[s];
      for (int le = 0; le < per_rank_; ++le) {
        const auto& range = recv_range_[static_cast<std::size_t>(le) * world_ + s];
        std::memcpy(back_send_.data() + static_cast<std::size_t>(to) * h,
                    y.data() + (le * per_expert + range.begin) * h, range.count * h * sizeof(bf16));
        to += range.count;
      }
    }
    back_recv_.resize(sent * h);
    exchange(back_send_.data(), back_recv_.data(), y_row_, false);
    // Each token's rows, weighted, in slot order.
    acc_.resize(h);
    const std::size_t tokens = row_of_.size() / k;
    for (std::size_t t = 0; t < tokens; ++t) {
      std::fill(acc_.begin(), acc_.end(), 0.0f);
      for (std::size_t j = 0; j < k; ++j) {
        const int at = row_of_[t * k + j];
        if (at < 0) continue;
        const float w = topk_weights[t * k + j];
        const bf16* row = back_recv_.data() + static_cast<std::size_t>(at) * h;
        for (std::size_t c = 0; c < h; ++c) acc_[c] += w * to_float(row[c]);
      }
      for (std::size_t c = 0; c < h; ++c) out[t * h + c] = to_bf16(acc_[c]);
    }
  }

  // The last dispatch's results, in epcomm's low-latency layout (rows past recv_count are
  // padding).
  std::span<const Wire> recv_x() const { return recv_x_; }
  std::span<const float> recv_x_scales() const { return recv_scales_; }
  std::span<const std::int32_t> recv_count() const { return recv_count_; }
  std::span<const wire::ll::source> recv_src() const { return recv_src_; }
  std::span<const wire::ll::range> recv_range() const { return recv_range_; }

 private:
  struct origin {
    std::int32_t token;
    std::int32_t slot;
  };

  // forward: by send_rows_/recv_rows_ (dispatch); otherwise the other way round (combine).
  void exchange(const void* send, void* recv, const row_type& type, bool forward) {
    const auto& sc = forward ? send_rows_ : recv_rows_;
    const auto& sd = forward ? send_at_ : recv_at_;
    const auto& rc = forward ? recv_rows_ : send_rows_;
    const auto& rd = forward ? recv_at_ : send_at_;
    MPI_Alltoallv(send, sc.data(), sd.data(), type.get(), recv, rc.data(), rd.data(), type.get(),
                  comm_);
  }

  MPI_Comm comm_;
  int world_ = 0;
  int per_rank_ = 0;
  int hidden_;
  int topk_;
  int max_tokens_;
  int scales_per_row_;
  row_type x_row_, scale_row_, origin_row_, y_row_;

  std::vector<int> send_counts_, recv_counts_;  // [R][E_local]
  std::vector<int> cursor_;                     // [R][E_local]: next send row while packing
  std::vector<int> send_rows_, send_at_, recv_rows_, recv_at_;  // [R], in rows
  std::vector<int> row_of_;  // [T][K]: send row of (token, slot), -1 when not routed

  std::vector<Wire> send_x_, arrived_x_, recv_x_;
  std::vector<float> send_scales_, arrived_scales_, recv_scales_;
  std::vector<origin> send_origin_, arrived_origin_;
  std::vector<wire::ll::source> recv_src_;
  std::vector<wire::ll::range> recv_range_;
  std::vector<std::int32_t> recv_count_;
  std::vector<bf16> back_send_, back_recv_;
  std::vector<Wire> cast_;          // one token on the fp8 wire
  std::vector<float> cast_scales_;  // and its scales
  std::vector<float> acc_;          // one token's sums
};

}  // namespace epcomm::bench
