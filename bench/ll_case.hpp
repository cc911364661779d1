// Low-latency (decode / rollout) mode: epcomm::low_latency_buffer over a transport, against the
// MPI all-to-all baseline that produces the same per-expert layout, and the transport's raw
// link, on one workload. Tokens enter in bf16; the wire is bf16 or fp8 (the workload's dtype).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/low_latency/buffer.hpp"
#include "inputs.hpp"
#include "ll_baseline.hpp"
#include "pair_ops.hpp"
#include "peer_copy.hpp"

namespace epcomm::bench {

template <class Transport, class Wire>
class low_latency_case final : public bench_case {
  static constexpr bool fp8 = token_traits<Wire>::has_scales;

 public:
  // Collective over `boot` and `comm` (the same ranks).
  template <bootstrap B>
  low_latency_case(B& boot, MPI_Comm comm, const workload& w)
      : comm_(comm),
        w_(w),
        rank_(boot.rank()),
        world_(boot.world_size()),
        input_(make_input<bf16>(w, rank_)),
        in_{w.tokens, w.topk, input_.x, input_.topk_idx},
        buffer_(boot, config(w)),
        baseline_(comm, w),
        link_(boot, static_cast<std::size_t>(world_) * w.tokens *
                        std::max(dispatch_row_bytes(w), combine_row_bytes(w))) {}

  std::string verify() override {
    const auto mine = buffer_.low_latency_dispatch(in_);
    baseline_.dispatch(input_.x, input_.topk_idx, w_.tokens);
    if (std::string d = compare_dispatch(mine); !d.empty()) return "dispatch: " + d;

    // The "expert" is the identity (fp8 rows dequantised), padding rows stay zero.
    const std::size_t h = w_.hidden, ns = fp8 ? h / fp8_block : 0;
    const std::size_t per_expert = static_cast<std::size_t>(world_) * w_.tokens;
    y_.assign(mine.recv_x.size(), bf16{0});
    for (std::size_t le = 0; le < mine.recv_count.size(); ++le) {
      for (std::size_t i = 0; i < static_cast<std::size_t>(mine.recv_count[le]); ++i) {
        const std::size_t row = le * per_expert + i;
        for (std::size_t c = 0; c < h; ++c) {
          float v = to_float(mine.recv_x[row * h + c]);
          if constexpr (fp8) v *= mine.recv_x_scales[row * ns + c / fp8_block];
          y_[row * h + c] = to_bf16(v);
        }
      }
    }
    handle_ = mine.handle;
    const auto out = buffer_.low_latency_combine(combine_in(), handle_);
    out_.assign(out.begin(), out.end());
    baseline_out_.resize(out_.size());
    baseline_.combine(y_, input_.topk_weights, baseline_out_);
    if (std::memcmp(out_.data(), baseline_out_.data(), out_.size() * sizeof(bf16)) != 0)
      return "combine: epcomm and baseline rows differ";
    if (std::string c = check_combine(); !c.empty()) return "combine: " + c;

    plan_ =
        op_plan(comm_, input_.topk_idx, w_, rank_, dispatch_row_bytes(w_), combine_row_bytes(w_));
    return {};
  }

  std::vector<timed_op> ops() override {
    auto ops = plan_.ops(link_,
                         {[this] { buffer_.low_latency_dispatch(in_); },
                          [this] { baseline_.dispatch(input_.x, input_.topk_idx, w_.tokens); }},
                         {[this] { buffer_.low_latency_combine(combine_in(), handle_); },
                          [this] { baseline_.combine(y_, input_.topk_weights, baseline_out_); }},
                         {[this] {
                            const ll_handle h = buffer_.low_latency_dispatch(in_).handle;
                            buffer_.low_latency_combine(combine_in(), h);
                          },
                          [this] {
                            baseline_.dispatch(input_.x, input_.topk_idx, w_.tokens);
                            baseline_.combine(y_, input_.topk_weights, baseline_out_);
                          }});
    // A low-latency combine answers exactly one dispatch: each timed combine gets a fresh one.
    ops[1].epcomm_setup = [this] { handle_ = buffer_.low_latency_dispatch(in_).handle; };
    return ops;
  }

 private:
  static low_latency_config config(const workload& w) {
    low_latency_config c;
    c.num_experts = w.experts;
    c.hidden = w.hidden;
    c.max_topk = w.topk;
    c.max_tokens_per_rank = w.tokens;
    return c;
  }

  // A token on the wire: payload and, for fp8, its scales. What must move is each token once per
  // destination rank, as in normal mode; the low-latency protocol itself sends one record per
  // (token, expert), so its fractions of the copy and of the bound include that choice.
  static std::size_t dispatch_row_bytes(const workload& w) {
    return w.hidden * sizeof(Wire) + (fp8 ? w.hidden / fp8_block * sizeof(float) : 0);
  }

  static std::size_t combine_row_bytes(const workload& w) { return w.hidden * sizeof(bf16); }

  ll_combine_input combine_in() const { return {y_, input_.topk_idx, input_.topk_weights}; }

  std::string compare_dispatch(const ll_dispatch_result<Wire>& mine) const {
    const std::size_t h = w_.hidden, ns = fp8 ? h / fp8_block : 0;
    const std::size_t per_expert = static_cast<std::size_t>(world_) * w_.tokens;
    const auto counts = baseline_.recv_count();
    if (!std::equal(mine.recv_count.begin(), mine.recv_count.end(), counts.begin(), counts.end()))
      return "rows per expert differ";
    const auto ranges = baseline_.recv_range();
    for (std::size_t i = 0; i < ranges.size(); ++i)
      if (mine.recv_range[i].begin != ranges[i].begin ||
          mine.recv_range[i].count != ranges[i].count)
        return "per-source ranges differ";
    for (std::size_t le = 0; le < counts.size(); ++le) {
      const std::size_t first = le * per_expert, n = static_cast<std::size_t>(counts[le]);
      const std::string where = "local expert " + std::to_string(le) + ": ";
      if (std::memcmp(mine.recv_x.data() + first * h, baseline_.recv_x().data() + first * h,
                      n * h * sizeof(Wire)) != 0)
        return where + "token rows differ";
      if (fp8 &&
          std::memcmp(mine.recv_x_scales.data() + first * ns,
                      baseline_.recv_x_scales().data() + first * ns, n * ns * sizeof(float)) != 0)
        return where + "fp8 scales differ";
      for (std::size_t i = first; i < first + n; ++i) {
        const auto& a = mine.recv_src[i];
        const auto& b = baseline_.recv_src()[i];
        if (a.rank != b.rank || a.token != b.token || a.topk_slot != b.topk_slot)
          return where + "sources differ";
      }
    }
    return {};
  }

  // Each token's combined row is the weighted sum, in slot order, of its identity-expert row.
  std::string check_combine() const {
    const std::size_t h = w_.hidden, k = w_.topk, ns = fp8 ? h / fp8_block : 0;
    std::vector<float> row(h);
    std::vector<fp8_e4m3> cast(fp8 ? h : 0);
    std::vector<float> scales(ns);
    for (std::size_t t = 0; t < static_cast<std::size_t>(w_.tokens); ++t) {
      const bf16* x = input_.x.data() + t * h;
      if constexpr (fp8) quantize_fp8_row(x, w_.hidden, cast.data(), scales.data(), false);
      for (std::size_t c = 0; c < h; ++c)
        row[c] =
            fp8 ? to_float(to_bf16(to_float(cast[c]) * scales[c / fp8_block])) : to_float(x[c]);
      for (std::size_t c = 0; c < h; ++c) {
        float sum = 0.0f;
        for (std::size_t j = 0; j < k; ++j)
          if (input_.topk_idx[t * k + j] >= 0) sum += input_.topk_weights[t * k + j] * row[c];
        if (!(to_bf16(sum) == out_[t * h + c]))
          return "token " + std::to_string(t) + " channel " + std::to_string(c) + " is " +
                 std::to_string(to_float(out_[t * h + c])) + ", expected " +
                 std::to_string(to_float(to_bf16(sum)));
      }
    }
    return {};
  }

  MPI_Comm comm_;
  workload w_;
  int rank_;
  int world_;
  rank_input<bf16> input_;
  ll_dispatch_input in_;
  low_latency_buffer<Transport, Wire> buffer_;
  ll_alltoall_baseline<Wire> baseline_;
  raw_link<Transport> link_;

  ll_handle handle_;  // of the last dispatch, for the next combine
  std::vector<bf16> y_;
  std::vector<bf16> out_, baseline_out_;
  op_plan plan_;
};

}  // namespace epcomm::bench
