// Normal (throughput) mode: epcomm::buffer over a transport, against the MPI all-to-all baseline
// and the transport's raw link, on one workload.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "baseline.hpp"
#include "bench_case.hpp"
#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/normal/buffer.hpp"
#include "inputs.hpp"
#include "pair_ops.hpp"
#include "peer_copy.hpp"

namespace epcomm::bench {

template <class Transport, token_type Token>
class normal_case final : public bench_case {
  using out_type = combine_type_t<Token>;
  static constexpr bool has_scales = token_traits<Token>::has_scales;

 public:
  // Collective over `boot` and `comm` (the same ranks).
  template <bootstrap B>
  normal_case(B& boot, MPI_Comm comm, const workload& w)
      : comm_(comm),
        w_(w),
        rank_(boot.rank()),
        world_(boot.world_size()),
        input_(make_input<Token>(w, rank_)),
        in_{w.tokens,        w.hidden,           w.topk, input_.x, input_.scales,
            input_.topk_idx, input_.topk_weights},
        buffer_(boot, config(w)),
        baseline_(comm, w),
        link_(boot, link_bytes(w, world_)) {
    // The tokens are produced into dispatch_send_buffer, as a model layer
    // would: an RMA transport puts them from there without staging them; the
    // baseline's all-to-all reads input_.x.
    const auto at = buffer_.dispatch_send_buffer(w.tokens, w.hidden);
    std::copy(input_.x.begin(), input_.x.end(), at.begin());
    in_.x = at;
  }

  std::string verify() override {
    const auto mine = buffer_.dispatch(in_);
    baseline_.dispatch(in_);
    if (std::string d = compare_dispatch(mine); !d.empty()) return "dispatch: " + d;
    handle_ = mine.handle;

    // The "expert" is the identity (fp8 rows dequantised to bf16), so combine must return each
    // token times the number of ranks it went to.
    const std::size_t n = mine.num_recv_tokens, h = w_.hidden, k = w_.topk;
    y_.resize(n * h);
    for (std::size_t row = 0; row < n; ++row)
      for (std::size_t c = 0; c < h; ++c)
        y_[row * h + c] = from_float<out_type>(value(mine.recv_x, mine.recv_x_scales, row, c));
    y_weights_.assign(mine.recv_topk_weights.begin(), mine.recv_topk_weights.begin() + n * k);
    // The expert writes its output into the buffer (combine_send_buffer):
    // peers read it there over shared memory, and an RMA transport puts it
    // from there without staging it (DeepEP's low-latency zero-copy, in
    // normal mode); the baseline's all-to-all copies y_.
    const auto at = buffer_.combine_send_buffer(handle_);
    std::copy(y_.begin(), y_.end(), at.begin());
    y_rows_ = at;

    const std::size_t t = w_.tokens;
    out_x_.resize(t * h);
    out_weights_.resize(t * k);
    baseline_x_.resize(t * h);
    baseline_weights_.resize(t * k);
    buffer_.combine(combine_in(), handle_, out_x_, out_weights_);
    baseline_.combine(y_, y_weights_, baseline_x_, baseline_weights_);
    if (!same(out_x_, baseline_x_)) return "combine: epcomm and baseline rows differ";
    if (!same(out_weights_, baseline_weights_))
      return "combine: epcomm and baseline weights differ";
    if (std::string c = check_combine(); !c.empty()) return "combine: " + c;

    plan_ =
        op_plan(comm_, input_.topk_idx, w_, rank_, dispatch_row_bytes(w_), combine_row_bytes(w_));
    return {};
  }

  std::vector<timed_op> ops() override {
    return plan_.ops(
        link_, {[this] { buffer_.dispatch(in_); }, [this] { baseline_.dispatch(in_); }},
        {[this] { buffer_.combine(combine_in(), handle_, out_x_, out_weights_); },
         [this] { baseline_.combine(y_, y_weights_, baseline_x_, baseline_weights_); }},
        {[this] {
           const auto r = buffer_.dispatch(in_);
           buffer_.combine(combine_in(), r.handle, out_x_, out_weights_);
         },
         [this] {
           baseline_.dispatch(in_);
           baseline_.combine(y_, y_weights_, baseline_x_, baseline_weights_);
         }});
  }

 private:
  static buffer_config config(const workload& w) {
    buffer_config c;
    c.num_experts = w.experts;
    c.max_hidden = w.hidden;
    c.max_topk = w.topk;
    c.max_tokens_per_rank = w.tokens;
    c.max_buffer_bytes = w.max_buffer_bytes;
    return c;
  }

  // Payload bytes of one dispatched row (tokens and fp8 scales) and of one combined row.
  static std::size_t dispatch_row_bytes(const workload& w) {
    return w.hidden * sizeof(Token) + (has_scales ? w.hidden / fp8_block * sizeof(float) : 0);
  }
  static std::size_t combine_row_bytes(const workload& w) { return w.hidden * sizeof(out_type); }

  // No rank sends or receives more than world * tokens rows.
  static std::size_t link_bytes(const workload& w, int world) {
    return static_cast<std::size_t>(world) * w.tokens *
           std::max(dispatch_row_bytes(w), combine_row_bytes(w));
  }

  // Element c of a row as a float: fp8 rows times their block's scale.
  float value(std::span<const Token> x, std::span<const float> scales, std::size_t row,
              std::size_t c) const {
    const std::size_t h = w_.hidden;
    const float v = to_float(x[row * h + c]);
    if constexpr (has_scales) return v * scales[row * (h / fp8_block) + c / fp8_block];
    return v;
  }

  combine_input<out_type> combine_in() const {
    return {y_rows_, std::span<const float>(y_weights_), {}, {}};
  }

  template <class T>
  static bool same(std::span<const T> a, std::span<const T> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
  }
  template <class T>
  static bool same(const std::vector<T>& a, const std::vector<T>& b) {
    return same(std::span<const T>(a), std::span<const T>(b));
  }

  std::string compare_dispatch(const dispatch_result<Token>& mine) const {
    const std::size_t n = mine.num_recv_tokens, h = w_.hidden, k = w_.topk;
    const std::size_t ns = has_scales ? h / fp8_block : 0;
    if (mine.num_recv_tokens != baseline_.num_recv_tokens())
      return "epcomm received " + std::to_string(mine.num_recv_tokens) + " rows, the baseline " +
             std::to_string(baseline_.num_recv_tokens());
    if (!same(mine.recv_x.first(n * h), baseline_.recv_x())) return "token rows differ";
    if (!same(mine.recv_x_scales.first(n * ns), baseline_.recv_x_scales()))
      return "fp8 scales differ";
    if (!same(mine.recv_topk_idx.first(n * k), baseline_.recv_topk_idx()))
      return "top-k ids differ";
    if (!same(mine.recv_topk_weights.first(n * k), baseline_.recv_topk_weights()))
      return "top-k weights differ";
    if (!same(mine.recv_src_idx.first(n), baseline_.recv_src_idx())) return "source indices differ";
    if (mine.num_recv_tokens_per_expert != baseline_.num_recv_tokens_per_expert())
      return "tokens per expert differ";
    return {};
  }

  // Each token's combined row is its identity-expert row summed once per destination rank, in
  // fp32, and its weights come back unchanged (only the owner of an expert returns its weight).
  std::string check_combine() const {
    const std::size_t h = w_.hidden, k = w_.topk;
    const int per_rank = w_.experts / world_;
    std::vector<bool> dest(world_);
    for (std::size_t t = 0; t < static_cast<std::size_t>(w_.tokens); ++t) {
      std::fill(dest.begin(), dest.end(), false);
      int copies = 0;
      for (std::size_t j = 0; j < k; ++j) {
        const std::int64_t e = input_.topk_idx[t * k + j];
        const float expected_w = e >= 0 ? input_.topk_weights[t * k + j] : 0.0f;
        if (out_weights_[t * k + j] != expected_w)
          return "token " + std::to_string(t) + " weight " + std::to_string(j) + " is " +
                 std::to_string(out_weights_[t * k + j]) + ", expected " +
                 std::to_string(expected_w);
        if (e >= 0 && !dest[e / per_rank]) {
          dest[e / per_rank] = true;
          ++copies;
        }
      }
      for (std::size_t c = 0; c < h; ++c) {
        const float y = to_float(from_float<out_type>(value(input_.x, input_.scales, t, c)));
        float sum = 0.0f;
        for (int i = 0; i < copies; ++i) sum += y;
        if (!(from_float<out_type>(sum) == out_x_[t * h + c]))
          return "token " + std::to_string(t) + " channel " + std::to_string(c) + " is " +
                 std::to_string(to_float(out_x_[t * h + c])) + ", expected " +
                 std::to_string(to_float(from_float<out_type>(sum)));
      }
    }
    return {};
  }

  MPI_Comm comm_;
  workload w_;
  int rank_;
  int world_;
  rank_input<Token> input_;
  dispatch_input<Token> in_;
  buffer<Transport, Token> buffer_;
  alltoall_baseline<Token> baseline_;
  raw_link<Transport> link_;

  dispatch_handle handle_;  // of the verified dispatch; every dispatch routes the same way
  std::vector<out_type> y_;
  std::span<const out_type> y_rows_;  // what combine gets as y: y_'s copy in the buffer
  std::vector<float> y_weights_;
  std::vector<out_type> out_x_, baseline_x_;
  std::vector<float> out_weights_, baseline_weights_;
  op_plan plan_;
};

}  // namespace epcomm::bench
