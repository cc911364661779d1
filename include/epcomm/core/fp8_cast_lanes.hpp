// The host's fp8 cast of one block, written for vector lanes: to_fp8_e4m3's
// integer formula (token_types.hpp) on GNU vector types of Lanes 32-bit
// elements, which GCC and clang compile to AVX2 or AVX-512 as the enclosing
// function's target says (core/simd_isa.hpp).
//
// Why not the scalar loop: it narrows 32-bit values to bytes, and GCC at -O2
// (its "very cheap" vectorizer cost model) vectorizes no loop that mixes
// element widths, so the block was converted one element at a time: 1.6 ms
// for 128 tokens of hidden 7168 on the development machine, about half of
// a low-latency fp8 dispatch. Spelled in lanes, the width changes are explicit
// (__builtin_convertvector) and no cost model is asked.
//
// Bits: the same integer operations as to_fp8_e4m3 on the product
// x * inv_scale, which is one IEEE multiplication in either form (nothing to
// contract it with), so every lane equals the scalar cast; the tests compare
// the two over the whole float range.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "epcomm/core/simd_isa.hpp"
#include "epcomm/core/token_types.hpp"

#ifdef EPCOMM_SIMD_MULTIVERSION

namespace epcomm::detail {

template <class T, int Lanes>
using lanes_of [[gnu::vector_size(sizeof(T) * Lanes)]] = T;

// out[i] = quantize_fp8(to_float(in[i]), inv_scale) for i in [0, n), n a
// multiple of Lanes: to_fp8_e4m3's steps (see there) on every lane. One
// function body, no vector passed to or returned from a call: a vector
// argument's ABI depends on the target, which the callers choose.
template <int Lanes, class T>
inline void quantize_lanes(const T* in, int n, fp8_e4m3* out, float inv_scale) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>);
  using u32 = lanes_of<std::uint32_t, Lanes>;
  using f32 = lanes_of<float, Lanes>;
  for (int i = 0; i < n; i += Lanes) {
    f32 x;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(&x, in + i, sizeof x);
    } else {  // bf16 is the top half of a float
      lanes_of<std::uint16_t, Lanes> b;
      std::memcpy(&b, in + i, sizeof b);
      x = reinterpret_cast<f32>(__builtin_convertvector(b, u32) << 16);
    }
    const u32 u = reinterpret_cast<u32>(x * inv_scale);
    const u32 mag = u & 0x7FFF'FFFFu;
    const u32 sign = (u >> 24) & 0x80u;
    const u32 normal = ((mag + 0x7FFFFu + ((mag >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
    const u32 e = mag >> 23;
    const u32 m = (mag & 0x7F'FFFFu) | 0x80'0000u;
    // Comparisons give all-ones lanes where true; `a & mask | b & ~mask`
    // selects.
    const u32 subnormal = (((m + 0xFFFFFu + ((m >> 21) & 1u)) >> 21) & (u32)(e == 120u)) |
                          (((m + 0x1FFFFFu + ((m >> 22) & 1u)) >> 22) & (u32)(e == 119u)) |
                          (((m + 0x3FFFFFu + ((m >> 23) & 1u)) >> 23) & (u32)(e == 118u)) |
                          (((m + 0x7FFFFFu + ((m >> 24) & 1u)) >> 24) & (u32)(e == 117u));
    const u32 is_normal = (u32)(mag >= 0x3C80'0000u);
    const u32 saturated = (u32)(mag > 0x43E8'0000u);
    const u32 nan = (u32)(mag > 0x7F80'0000u);
    const u32 r =
        (0x7Eu & saturated) | (((normal & is_normal) | (subnormal & ~is_normal)) & ~saturated);
    const u32 bits = (0x7Fu & nan) | ((sign | r) & ~nan);
    const auto q = __builtin_convertvector(bits, lanes_of<std::uint8_t, Lanes>);
    std::memcpy(out + i, &q, sizeof q);
  }
}

}  // namespace epcomm::detail

#endif
