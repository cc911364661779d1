// DeepEP-style fp8 e4m3 quantisation with one float scale per 128 elements.
//
// Every step is pinned down so that a CUDA kernel calling these same
// functions reproduces the host results bit for bit:
//   amax  = max(1e-4f, max_i |x_i|)         (NaNs ignored, like fmaxf)
//   scale = amax * (1.0f / 448)             (dequant multiplier; float mul)
//   inv   = 448.0f / amax                   (quant multiplier; IEEE div)
//   pow2: scale = 2^ceil(log2(amax * (1.0f / 448))), inv = 1.0f / scale (exact)
//   q_i   = to_fp8_e4m3(x_i * inv)          (float mul; RNE, satfinite)
//   x_i  ~= to_float(q_i) * scale           (float mul)
// These are DeepEP's expressions (calculate_fp8_scales), including the
// asymmetry that inv is 448 / amax rather than 1 / scale, so buffers match
// DeepEP's. On the device the multiply and divide go through __fmul_rn /
// __fdiv_rn so neither --use_fast_math's approximate division nor FMA
// contraction can change the bits. Its flush-to-zero cannot either: the amax
// floor keeps scale and inv normal, and a subnormal x or x * inv quantises to
// a signed zero either way.
#pragma once

#include <cassert>
#include <concepts>
#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/core/fp8_cast_lanes.hpp"
#include "epcomm/core/simd_isa.hpp"
#include "epcomm/core/token_types.hpp"

namespace epcomm {

inline constexpr int fp8_block = 128;
inline constexpr float fp8_e4m3_max = 448.f;

// The amax floor keeps the scale finite and nonzero for an all-zero block.
inline constexpr float fp8_amax_floor = 1e-4f;

namespace detail {

EPCOMM_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

EPCOMM_HD inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// max(1e-4f, amax) that ignores a NaN amax, as fmaxf does.
EPCOMM_HD constexpr float floor_amax(float amax) noexcept {
  return amax > fp8_amax_floor ? amax : fp8_amax_floor;
}

// Rounds a non-negative float up to a power of two (UE8M0, DeepEP's
// round_scale): a nonzero mantissa carries into the exponent. +inf stays inf.
EPCOMM_HD constexpr float ceil_pow2(float x) noexcept {
  const auto u = detail::bit_cast<std::uint32_t>(x);
  return detail::bit_cast<float>((u + 0x7F'FFFFu) & 0x7F80'0000u);
}

}  // namespace detail

// The dequantisation multiplier for a block whose largest magnitude is amax.
// With pow2 it is a power of two, so the scale fits in 8 bits (UE8M0) and
// rescaling by it is exact.
EPCOMM_HD inline float fp8_block_scale(float amax, bool pow2) {
  const float scale = detail::mul_rn(detail::floor_amax(amax), 1.0f / fp8_e4m3_max);
  return pow2 ? detail::ceil_pow2(scale) : scale;
}

// The quantisation multiplier that pairs with fp8_block_scale(amax, pow2).
EPCOMM_HD inline float fp8_block_inv_scale(float amax, bool pow2) {
  if (pow2) return detail::div_rn(1.0f, fp8_block_scale(amax, true));
  return detail::div_rn(fp8_e4m3_max, detail::floor_amax(amax));
}

EPCOMM_HD inline fp8_e4m3 quantize_fp8(float x, float inv_scale) {
  return to_fp8_e4m3(detail::mul_rn(x, inv_scale));
}

EPCOMM_HD inline float dequantize_fp8(fp8_e4m3 q, float scale) {
  return detail::mul_rn(to_float(q), scale);
}

// The element types the quantisers accept; both widen exactly to float.
template <class T>
concept fp8_source = std::same_as<T, float> || std::same_as<T, bf16>;

namespace detail {

// The largest magnitude of a block's n elements. |x| by clearing the sign
// bit; non-negative floats order as their bits do, so the max is taken on
// signed integers (which SSE2 vectorizes), a NaN's bits counting as 0:
// ignored as fmaxf would. max is order-independent, so a kernel's warp
// reduction gets the same amax.
template <fp8_source T>
EPCOMM_HD inline float block_amax(const T* in, int n) {
  std::int32_t amax_bits = 0;
  for (int i = 0; i < n; ++i) {
    const auto a =
        static_cast<std::int32_t>(detail::bit_cast<std::uint32_t>(to_float(in[i])) & 0x7FFF'FFFFu);
    const std::int32_t kept = a > 0x7F80'0000 ? 0 : a;
    amax_bits = kept > amax_bits ? kept : amax_bits;
  }
  return detail::bit_cast<float>(amax_bits);
}

}  // namespace detail

// Quantises one block of n <= fp8_block elements; *scale receives the
// dequantisation multiplier.
template <fp8_source T>
EPCOMM_HD inline void quantize_fp8_block(const T* in, int n, fp8_e4m3* out, float* scale,
                                         bool pow2) {
  assert(n >= 0 && n <= fp8_block);
  const float amax = detail::block_amax(in, n);
  const float inv = fp8_block_inv_scale(amax, pow2);
  for (int i = 0; i < n; ++i) out[i] = quantize_fp8(to_float(in[i]), inv);
  *scale = fp8_block_scale(amax, pow2);
}

namespace detail {

// quantize_fp8_row one block at a time, as the device does it.
template <fp8_source T>
EPCOMM_HD inline void quantize_fp8_blocks(const T* in, int hidden, fp8_e4m3* out, float* scales,
                                          bool pow2) {
  for (int b = 0; b < hidden / fp8_block; ++b)
    quantize_fp8_block(in + b * fp8_block, fp8_block, out + b * fp8_block, scales + b, pow2);
}

#ifdef EPCOMM_SIMD_MULTIVERSION
// quantize_fp8_row with the cast in Lanes lanes (core/fp8_cast_lanes.hpp).
template <int Lanes, fp8_source T>
inline void quantize_fp8_row_lanes(const T* in, int hidden, fp8_e4m3* out, float* scales,
                                   bool pow2) {
  for (int b = 0; b < hidden / fp8_block; ++b) {
    const T* block = in + b * fp8_block;
    const float amax = block_amax(block, fp8_block);
    quantize_lanes<Lanes>(block, fp8_block, out + b * fp8_block, fp8_block_inv_scale(amax, pow2));
    scales[b] = fp8_block_scale(amax, pow2);
  }
}

template <fp8_source T>
EPCOMM_TARGET_AVX2 void quantize_fp8_row_avx2(const T* in, int hidden, fp8_e4m3* out, float* scales,
                                              bool pow2) {
  quantize_fp8_row_lanes<8>(in, hidden, out, scales, pow2);
}

template <fp8_source T>
EPCOMM_TARGET_AVX512 void quantize_fp8_row_avx512(const T* in, int hidden, fp8_e4m3* out,
                                                  float* scales, bool pow2) {
  quantize_fp8_row_lanes<16>(in, hidden, out, scales, pow2);
}
#endif

// quantize_fp8_row compiled for `isa`, which must not be wider than
// widest_simd_isa(). Every set gives the same bits. The baseline keeps the
// scalar blocks: SSE2 lacks the unsigned compares and narrowing packs the
// lanes need, and 4 lanes of it measured slower than the scalar loop.
template <fp8_source T>
inline void quantize_fp8_row_on(simd_isa isa, const T* in, int hidden, fp8_e4m3* out, float* scales,
                                bool pow2) {
#ifdef EPCOMM_SIMD_MULTIVERSION
  if (isa == simd_isa::avx512) return quantize_fp8_row_avx512(in, hidden, out, scales, pow2);
  if (isa == simd_isa::avx2) return quantize_fp8_row_avx2(in, hidden, out, scales, pow2);
#endif
  (void)isa;
  quantize_fp8_blocks(in, hidden, out, scales, pow2);
}

}  // namespace detail

// Quantises a row of hidden elements (hidden % fp8_block == 0) into
// hidden / fp8_block blocks, one scale each. On an x86-64 host, with the
// widest vectors the CPU has (detail::quantize_fp8_row_on); the same bits.
template <fp8_source T>
EPCOMM_HD inline void quantize_fp8_row(const T* in, int hidden, fp8_e4m3* out, float* scales,
                                       bool pow2) {
  assert(hidden >= 0 && hidden % fp8_block == 0);
#ifdef EPCOMM_SIMD_MULTIVERSION
  detail::quantize_fp8_row_on(detail::widest_simd_isa(), in, hidden, out, scales, pow2);
#else
  detail::quantize_fp8_blocks(in, hidden, out, scales, pow2);
#endif
}

EPCOMM_HD inline void dequantize_fp8_row(const fp8_e4m3* in, const float* scales, int hidden,
                                         float* out) {
  assert(hidden >= 0 && hidden % fp8_block == 0);
  for (int i = 0; i < hidden; ++i) out[i] = dequantize_fp8(in[i], scales[i / fp8_block]);
}

}  // namespace epcomm
