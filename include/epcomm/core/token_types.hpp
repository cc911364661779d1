// Token element types moved by dispatch/combine, and their conversions.
//
// bf16 and fp8_e4m3 are plain bit containers rather than CUDA's __nv_bfloat16 /
// __nv_fp8_e4m3 so that host code needs no CUDA headers, and so that the same
// structs can live in kernels, shared memory and wire buffers. The conversions
// are integer bit manipulation that reproduces CUDA's results bit for bit
// (tests/core/test_token_types_cuda.cpp checks every input against CUDA's headers),
// so a host reference and a kernel agree exactly.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "epcomm/core/config.hpp"

namespace epcomm {

// Aggregates without constructors: trivially copyable and standard layout, so
// they can be memcpy'd through transport buffers and declared in __shared__
// memory (which forbids dynamic initialisation). Equality compares encodings,
// not values: +0 != -0, and a NaN equals itself.
struct bf16 {
  std::uint16_t bits;
  friend constexpr bool operator==(bf16, bf16) = default;
};

struct fp8_e4m3 {
  std::uint8_t bits;
  friend constexpr bool operator==(fp8_e4m3, fp8_e4m3) = default;
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2);
static_assert(sizeof(fp8_e4m3) == 1);

namespace detail {

// __builtin_bit_cast rather than std::bit_cast: nvcc rejects calling the
// (host-only) std::bit_cast from __host__ __device__ code without
// --expt-relaxed-constexpr, while the builtin works in g++, clang and nvcc
// and stays constexpr.
template <class To, class From>
EPCOMM_HD constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From));
  return __builtin_bit_cast(To, from);
}

}  // namespace detail

// float -> bf16, round to nearest even, as __float2bfloat16. Overflow rounds
// to +-inf; every NaN becomes the canonical positive NaN 0x7FFF (CUDA drops the
// sign and payload), so the result does not depend on which NaN came in.
EPCOMM_HD constexpr bf16 to_bf16(float x) noexcept {
  const auto u = detail::bit_cast<std::uint32_t>(x);
  // Adding 0x7FFF plus the kept LSB carries into bit 16 exactly when the
  // discarded half is above 0x8000, or equal to it with an odd kept part.
  const std::uint32_t lsb = (u >> 16) & 1u;
  const std::uint32_t rounded = (u + 0x7FFFu + lsb) >> 16;
  // NaN becomes the canonical 0x7FFF; a select, not a branch, so that loops
  // converting whole rows vectorize.
  const bool nan = (u & 0x7FFF'FFFFu) > 0x7F80'0000u;
  return bf16{static_cast<std::uint16_t>(nan ? 0x7FFFu : rounded)};
}

// Exact: bf16 is the top half of a float. NaN payloads are kept, as in CUDA.
EPCOMM_HD constexpr float to_float(bf16 x) noexcept {
  return detail::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}

// float -> e4m3 (bias 7, no infinities, 0x7F/0xFF = NaN, max finite 448),
// bit-identical to __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3):
//  - round to nearest even, including in the subnormal range (multiples of 2^-9);
//  - |x| > 464 (448 plus half an ulp) and +-inf saturate to +-448;
//  - NaN of either sign becomes 0x7F (CUDA canonicalises the NaN first);
//  - |x| <= 2^-10 keeps its sign: -0.0f and tiny negatives give 0x80.
EPCOMM_HD constexpr fp8_e4m3 to_fp8_e4m3(float x) noexcept {
  // Every case is computed and one selected, with integer operations and
  // constant shifts only, so that a loop converting a block vectorizes even
  // with SSE2 (the host's fp8 cast is on the dispatch path).
  const auto u = detail::bit_cast<std::uint32_t>(x);
  const std::uint32_t mag = u & 0x7FFF'FFFFu;
  const std::uint32_t sign = (u >> 24) & 0x80u;
  // Normal e4m3 (|x| >= 2^-6): keep exponent and 3 mantissa bits (bits
  // 20..30), rounding the 20 dropped bits to nearest even; a carry correctly
  // bumps the exponent. Then rebias the exponent from 127 to 7. The 464 bound
  // below keeps the result <= 0x7E.
  const std::uint32_t normal = ((mag + 0x7FFFFu + ((mag >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  // Subnormal e4m3: |x| / 2^-9 rounded to nearest even, at most 8 (= 0x08,
  // the smallest normal, reached by rounding up). With the implicit bit,
  // |x| = m * 2^(e - 150), so |x| / 2^-9 = m >> (141 - e): one of four
  // shifts for e in 117..120; below 2^-10 (e < 117) it rounds to zero.
  const std::uint32_t e = mag >> 23;
  const std::uint32_t m = (mag & 0x7F'FFFFu) | 0x80'0000u;
  // Masks rather than a chain of conditions, which compilers turn into a
  // switch.
  auto shifted_if = [m, e](std::uint32_t exp, std::uint32_t s) {
    const std::uint32_t mask = 0u - static_cast<std::uint32_t>(e == exp);
    return ((m + (1u << (s - 1)) - 1u + ((m >> s) & 1u)) >> s) & mask;
  };
  const std::uint32_t subnormal =
      shifted_if(120, 21) | shifted_if(119, 22) | shifted_if(118, 23) | shifted_if(117, 24);
  const std::uint32_t r = mag > 0x43E8'0000u    ? 0x7Eu  // above 464.0f: saturate
                          : mag >= 0x3C80'0000u ? normal
                                                : subnormal;
  return fp8_e4m3{static_cast<std::uint8_t>(mag > 0x7F80'0000u ? 0x7Fu : sign | r)};
}

// e4m3 -> float, exact, as __nv_cvt_fp8_to_halfraw followed by half -> float.
// Both NaN encodings (0x7F, 0xFF) give the canonical positive NaN 0x7FFFFFFF:
// CUDA discards the sign on the way through half.
EPCOMM_HD constexpr float to_float(fp8_e4m3 x) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x80u) << 24;
  const std::uint32_t mag = x.bits & 0x7Fu;
  if (mag == 0x7F) return detail::bit_cast<float>(0x7FFF'FFFFu);
  if (mag >= 0x08) {
    // Normal: exponent and mantissa fields sit side by side in both formats,
    // so shift them into place and rebias the exponent from 7 to 127.
    return detail::bit_cast<float>(sign | ((mag + ((127u - 7u) << 3)) << 20));
  }
  if (mag == 0) return detail::bit_cast<float>(sign);
  // Subnormal mag * 2^-9, mag in 1..7: normalise the 3-bit significand.
  const std::uint32_t lz = mag >= 4 ? 0 : mag >= 2 ? 1 : 2;  // leading zeros
  const std::uint32_t frac = ((mag << lz) & 3u) << 21;
  return detail::bit_cast<float>(sign | ((120u - lz) << 23) | frac);
}

// CUDA's __nv_cvt_bfloat16raw_to_fp8 widens to float and converts (there is no
// direct PTX bf16 -> e4m3 instruction), so doing the same is bit-exact.
EPCOMM_HD constexpr fp8_e4m3 to_fp8_e4m3(bf16 x) noexcept { return to_fp8_e4m3(to_float(x)); }

// Identity, so generic code can write to_float(t) for every token type.
EPCOMM_HD constexpr float to_float(float x) noexcept { return x; }

namespace detail {
template <class>
inline constexpr bool always_false = false;
}  // namespace detail

// The inverse of to_float for generic code: from_float<T>(x).
template <class T>
EPCOMM_HD constexpr T from_float(float x) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return to_bf16(x);
  } else if constexpr (std::is_same_v<T, fp8_e4m3>) {
    return to_fp8_e4m3(x);
  } else {
    static_assert(detail::always_false<T>, "from_float: not a token element type");
  }
}

// Per-type facts the layers above need without knowing the type:
//  name       - for logs, errors and benchmark labels;
//  has_scales - whether a token of this type travels with per-block scales;
//  id         - a stable wire id, so a receiver can reject a peer that sends
//               another element type. Never renumber.
// The primary template is left undefined: a type without traits is not a token.
template <class T>
struct token_traits;

template <>
struct token_traits<float> {
  static constexpr std::string_view name = "fp32";
  static constexpr bool has_scales = false;
  static constexpr std::uint8_t id = 1;
};

template <>
struct token_traits<bf16> {
  static constexpr std::string_view name = "bf16";
  static constexpr bool has_scales = false;
  static constexpr std::uint8_t id = 2;
};

template <>
struct token_traits<fp8_e4m3> {
  static constexpr std::string_view name = "fp8_e4m3";
  static constexpr bool has_scales = true;
  static constexpr std::uint8_t id = 3;
};

// A token element type:
//  - trivially copyable, because tokens move as raw bytes through transport
//    buffers (RDMA, NVLink, shared memory) and are never constructed there;
//  - has token_traits, which is what opts a type in: int or double are
//    trivially copyable and convertible to float but are not wire formats;
//  - to_float(t) yields float, so reductions (combine) and reference checks
//    can be written once for every type.
template <class T>
concept token_type = std::is_trivially_copyable_v<T> && requires(const T& t) {
  { token_traits<T>::name } -> std::convertible_to<std::string_view>;
  { token_traits<T>::has_scales } -> std::convertible_to<bool>;
  { token_traits<T>::id } -> std::convertible_to<std::uint8_t>;
  { to_float(t) } -> std::same_as<float>;
};

// The element type of expert outputs and of combine for a dispatched Token.
// fp8 is a dispatch-only format (it needs scales and is too coarse to sum in),
// so experts answer fp8 tokens in bf16, as DeepEP does; other types round-trip.
template <token_type Token>
using combine_type_t = std::conditional_t<std::is_same_v<Token, fp8_e4m3>, bf16, Token>;

// The name of the token type whose token_traits id is `id`: how an error
// names a peer's type, which arrives as its wire id.
inline constexpr std::string_view token_type_name(std::int64_t id) {
  switch (id) {
    case token_traits<float>::id:
      return token_traits<float>::name;
    case token_traits<bf16>::id:
      return token_traits<bf16>::name;
    case token_traits<fp8_e4m3>::id:
      return token_traits<fp8_e4m3>::name;
  }
  return "unknown";
}

// T is one of the types a buffer serves (its dispatch tokens, or their
// combine types): how a buffer built for several token types takes each
// call's type from its arguments.
template <class T, class... Served>
concept one_of = (std::same_as<T, Served> || ...);

}  // namespace epcomm
