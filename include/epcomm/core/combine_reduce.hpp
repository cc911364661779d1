// Copyright epcomm contributors. SPDX-License-Identifier: Apache-2.0
//
// The reduction at the end of a combine: one output token is the fp32 sum of
// its biases and of the expert rows that came back for it, rounded once to
// the output type.
//
// Channels go in blocks of 64 with the accumulators in a fixed-size array, so
// that the compiler keeps them in vector registers and reads every row once
// per block (a loop over the whole hidden size per row would stream the
// accumulators through memory once per row). Each channel still sees the same
// additions in the same order (0, bias_0, bias_1, rows in the order given),
// so the result is bit for bit the one of the plain per-channel loop (but for
// which operand's payload a NaN carries, which IEEE 754 leaves open).
//
// This reduction is where a host engine's combine spends its time, and a build
// for the x86-64 baseline (SSE2, what a library user compiles by default) runs
// it at a third of the memory's speed. So on x86-64 the same loops are compiled
// twice more, for AVX2 and for AVX-512, and the widest the CPU has is chosen at
// run time. Only additions are reordered across lanes, never within a channel,
// so the bits stay those of the baseline. Weighted sums stop at AVX2: the
// AVX-512 target brings FMA, and a compiler that contracts w * x + acc into one
// rounding would change the result.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "epcomm/core/simd_isa.hpp"
#include "epcomm/core/token_types.hpp"

namespace epcomm {

namespace detail {

// Channels [c, c + Width) of one output token. Width is a compile-time trip
// count: the compiler vectorizes these loops even at -O2 (no remainder).
// With row weights, row r adds weights[r] * row (the low-latency combine).
template <std::size_t Width, class Out, class Row>
inline void reduce_block(Out* out, std::size_t c, std::span<const Row* const> rows,
                         const float* weights, const Out* bias_0, const Out* bias_1) {
  float acc[Width] = {};
  for (const Out* bias : {bias_0, bias_1})
    if (bias != nullptr)
      for (std::size_t i = 0; i < Width; ++i) acc[i] += to_float(bias[c + i]);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Row* row = rows[r] + c;
    if (weights == nullptr) {
      for (std::size_t i = 0; i < Width; ++i) acc[i] += to_float(row[i]);
    } else {
      const float w = weights[r];
      for (std::size_t i = 0; i < Width; ++i) acc[i] += w * to_float(row[i]);
    }
  }
  for (std::size_t i = 0; i < Width; ++i) out[c + i] = from_float<Out>(acc[i]);
}

template <class Out, class Row>
inline void reduce_channels(Out* out, std::size_t hidden, std::span<const Row* const> rows,
                            const float* weights, const Out* bias_0, const Out* bias_1) {
  constexpr std::size_t block = 64;
  std::size_t c = 0;
  for (; c + block <= hidden; c += block)
    reduce_block<block>(out, c, rows, weights, bias_0, bias_1);
  for (; c < hidden; ++c) reduce_block<1>(out, c, rows, weights, bias_0, bias_1);
}

#ifdef EPCOMM_SIMD_MULTIVERSION
template <class Out, class Row>
EPCOMM_TARGET_AVX2 void reduce_channels_avx2(Out* out, std::size_t hidden,
                                             std::span<const Row* const> rows, const float* weights,
                                             const Out* bias_0, const Out* bias_1) {
  reduce_channels(out, hidden, rows, weights, bias_0, bias_1);
}

template <class Out, class Row>
EPCOMM_TARGET_AVX512 void reduce_channels_avx512(Out* out, std::size_t hidden,
                                                 std::span<const Row* const> rows,
                                                 const float* weights, const Out* bias_0,
                                                 const Out* bias_1) {
  reduce_channels(out, hidden, rows, weights, bias_0, bias_1);
}
#endif

// reduce_channels compiled for `isa`, which must not be wider than
// widest_simd_isa(); weighted sums are done with AVX2 at the widest.
template <class Out, class Row>
inline void reduce_channels_on(simd_isa isa, Out* out, std::size_t hidden,
                               std::span<const Row* const> rows, const float* weights,
                               const Out* bias_0, const Out* bias_1) {
#ifdef EPCOMM_SIMD_MULTIVERSION
  if (isa == simd_isa::avx512 && weights == nullptr)
    return reduce_channels_avx512(out, hidden, rows, weights, bias_0, bias_1);
  if (isa != simd_isa::baseline)
    return reduce_channels_avx2(out, hidden, rows, weights, bias_0, bias_1);
#endif
  (void)isa;
  reduce_channels(out, hidden, rows, weights, bias_0, bias_1);
}

}  // namespace detail

// out[c] = round<Out>(bias_0[c] + bias_1[c] + rows[0][c] + rows[1][c] + ...),
// summed in fp32 in that order, for c in [0, hidden). A null bias is left out.
template <class Out, class Row>
inline void reduce_token(Out* out, std::size_t hidden, std::span<const Row* const> rows,
                         const Out* bias_0 = nullptr, const Out* bias_1 = nullptr) {
  detail::reduce_channels_on(detail::widest_simd_isa(), out, hidden, rows, nullptr, bias_0, bias_1);
}

// out[c] = round<Out>(weights[0] * rows[0][c] + weights[1] * rows[1][c] + ...),
// in fp32, in that order: one weight per row.
template <class Out, class Row>
inline void reduce_token_weighted(Out* out, std::size_t hidden, std::span<const Row* const> rows,
                                  const float* weights) {
  detail::reduce_channels_on<Out, Row>(detail::widest_simd_isa(), out, hidden, rows, weights,
                                       nullptr, nullptr);
}

// Token t's row of an optional [T][H] bias: nullptr when none was given.
template <class T>
inline const T* bias_row(std::span<const T> bias, std::size_t t, std::size_t hidden) {
  return bias.empty() ? nullptr : bias.data() + t * hidden;
}

// A combine's last step, for tokens [0, num_tokens): out_x[t] as
// reduce_token with token t's biases and the rows that rows_of(t, add) hands
// to add(row, weights) in the order it hands them; out_weights[t] (k floats,
// when out_weights is not empty) the sum of those rows' k weights. What each
// host engine's combine ends with, each finding a token's rows its own way.
template <class Row, class Out, class RowsOf>
inline void reduce_tokens(int num_tokens, std::size_t hidden, std::size_t k,
                          std::span<const Out> bias_0, std::span<const Out> bias_1,
                          std::span<Out> out_x, std::span<float> out_weights, RowsOf&& rows_of) {
  std::vector<const Row*> srcs;
  for (int t = 0; t < num_tokens; ++t) {
    const std::size_t at = static_cast<std::size_t>(t);
    float* w = out_weights.empty() ? nullptr : out_weights.data() + at * k;
    if (w != nullptr) std::fill_n(w, k, 0.0f);
    srcs.clear();
    rows_of(t, [&](const Row* row, const float* row_weights) {
      srcs.push_back(row);
      if (w != nullptr)
        for (std::size_t j = 0; j < k; ++j) w[j] += row_weights[j];
    });
    reduce_token<Out, Row>(out_x.data() + at * hidden, hidden, srcs, bias_row(bias_0, at, hidden),
                           bias_row(bias_1, at, hidden));
  }
}

}  // namespace epcomm
