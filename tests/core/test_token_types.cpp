// Token element types: layout, traits, the token_type concept, and conversion
// values picked at the edges of each format. Exhaustive agreement with CUDA is
// in test_token_types_cuda.cpp, which needs the CUDA headers.
#include "epcomm/core/token_types.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace {

using epcomm::bf16;
using epcomm::fp8_e4m3;
using epcomm::from_float;
using epcomm::to_bf16;
using epcomm::to_float;
using epcomm::to_fp8_e4m3;
using epcomm::detail::bit_cast;

struct no_traits {
  float x;
};

// Usable in kernels, shared memory and wire buffers.
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);
static_assert(std::is_trivially_copyable_v<fp8_e4m3> && std::is_standard_layout_v<fp8_e4m3>);
static_assert(std::is_aggregate_v<bf16> && std::is_aggregate_v<fp8_e4m3>);
static_assert(std::is_trivially_default_constructible_v<bf16>);
static_assert(std::is_trivially_default_constructible_v<fp8_e4m3>);

static_assert(epcomm::token_type<float>);
static_assert(epcomm::token_type<bf16>);
static_assert(epcomm::token_type<fp8_e4m3>);
// Trivially copyable and convertible to float, but not opted in with traits.
static_assert(!epcomm::token_type<int>);
static_assert(!epcomm::token_type<double>);
static_assert(!epcomm::token_type<no_traits>);

static_assert(std::is_same_v<epcomm::combine_type_t<fp8_e4m3>, bf16>);
static_assert(std::is_same_v<epcomm::combine_type_t<bf16>, bf16>);
static_assert(std::is_same_v<epcomm::combine_type_t<float>, float>);

// The conversions are constexpr, so tables of constants can be built from them.
static_assert(to_bf16(1.0f) == bf16{0x3F80});
static_assert(to_fp8_e4m3(448.0f) == fp8_e4m3{0x7E});
static_assert(to_float(fp8_e4m3{0x38}) == 1.0f);

float from_bits(std::uint32_t u) { return bit_cast<float>(u); }
std::uint32_t bits_of(float f) { return bit_cast<std::uint32_t>(f); }

constexpr float pos_inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("token_traits: names and stable wire ids") {
  using epcomm::token_traits;
  CHECK(token_traits<float>::name == "fp32");
  CHECK(token_traits<bf16>::name == "bf16");
  CHECK(token_traits<fp8_e4m3>::name == "fp8_e4m3");
  CHECK(token_traits<float>::id == 1);
  CHECK(token_traits<bf16>::id == 2);
  CHECK(token_traits<fp8_e4m3>::id == 3);
  CHECK_FALSE(token_traits<float>::has_scales);
  CHECK_FALSE(token_traits<bf16>::has_scales);
  CHECK(token_traits<fp8_e4m3>::has_scales);
}

TEST_CASE("equality compares encodings") {
  CHECK(bf16{0x3F80} == bf16{0x3F80});
  CHECK(bf16{0x0000} != bf16{0x8000});      // +0 and -0
  CHECK(fp8_e4m3{0x7F} == fp8_e4m3{0x7F});  // the same NaN
  CHECK(fp8_e4m3{0x00} != fp8_e4m3{0x80});
}

TEST_CASE("to_bf16: known values") {
  CHECK(to_bf16(1.0f).bits == 0x3F80);
  CHECK(to_bf16(-2.5f).bits == 0xC020);
  CHECK(to_bf16(0.0f).bits == 0x0000);
  CHECK(to_bf16(-0.0f).bits == 0x8000);
  CHECK(to_bf16(pos_inf).bits == 0x7F80);
  CHECK(to_bf16(-pos_inf).bits == 0xFF80);
  // Round to nearest even: exact ties go to the even neighbour.
  CHECK(to_bf16(from_bits(0x3F80'8000)).bits == 0x3F80);
  CHECK(to_bf16(from_bits(0x3F81'8000)).bits == 0x3F82);
  CHECK(to_bf16(from_bits(0x3F80'8001)).bits == 0x3F81);
  CHECK(to_bf16(from_bits(0x3F80'7FFF)).bits == 0x3F80);
  // The largest floats round up to infinity, as IEEE requires.
  CHECK(to_bf16(std::numeric_limits<float>::max()).bits == 0x7F80);
  CHECK(to_bf16(-std::numeric_limits<float>::max()).bits == 0xFF80);
  // Float subnormals are rounded, not flushed.
  CHECK(to_bf16(from_bits(0x0000'8001)).bits == 0x0001);
  CHECK(to_bf16(from_bits(0x8000'8000)).bits == 0x8000);
  // Any NaN, whatever its sign or payload, becomes the canonical 0x7FFF.
  CHECK(to_bf16(qnan).bits == 0x7FFF);
  CHECK(to_bf16(-qnan).bits == 0x7FFF);
  CHECK(to_bf16(from_bits(0xFF80'0001)).bits == 0x7FFF);
  CHECK(to_bf16(from_bits(0x7FFF'FFFF)).bits == 0x7FFF);
}

TEST_CASE("to_float(bf16) is exact and keeps NaN payloads") {
  CHECK(to_float(bf16{0x3F80}) == 1.0f);
  CHECK(to_float(bf16{0xC020}) == -2.5f);
  CHECK(std::signbit(to_float(bf16{0x8000})));
  CHECK(bits_of(to_float(bf16{0xFFC1})) == 0xFFC1'0000);
}

TEST_CASE("to_fp8_e4m3: known values") {
  CHECK(to_fp8_e4m3(1.0f).bits == 0x38);
  CHECK(to_fp8_e4m3(-2.5f).bits == 0xC2);
  CHECK(to_fp8_e4m3(240.0f).bits == 0x77);
  CHECK(to_fp8_e4m3(448.0f).bits == 0x7E);
  CHECK(to_fp8_e4m3(-448.0f).bits == 0xFE);
  CHECK(to_fp8_e4m3(0.015625f).bits == 0x08);  // 2^-6, the smallest normal
  // Round to nearest even between normals: 1 + 1/16 is halfway to 1 + 1/8.
  CHECK(to_fp8_e4m3(1.0625f).bits == 0x38);
  CHECK(to_fp8_e4m3(1.1875f).bits == 0x3A);
  CHECK(to_fp8_e4m3(std::nextafter(1.0625f, 2.0f)).bits == 0x39);
}

TEST_CASE("to_fp8_e4m3: SATFINITE saturates everything beyond 448, infinities included") {
  CHECK(to_fp8_e4m3(449.0f).bits == 0x7E);
  CHECK(to_fp8_e4m3(464.0f).bits == 0x7E);  // the halfway point rounds to even, 448
  CHECK(to_fp8_e4m3(464.5f).bits == 0x7E);
  CHECK(to_fp8_e4m3(480.0f).bits == 0x7E);
  CHECK(to_fp8_e4m3(-449.0f).bits == 0xFE);
  CHECK(to_fp8_e4m3(1e30f).bits == 0x7E);
  CHECK(to_fp8_e4m3(std::numeric_limits<float>::max()).bits == 0x7E);
  CHECK(to_fp8_e4m3(pos_inf).bits == 0x7E);
  CHECK(to_fp8_e4m3(-pos_inf).bits == 0xFE);
}

TEST_CASE("to_fp8_e4m3: subnormals, underflow and signed zero") {
  const float sub = std::ldexp(1.0f, -9);  // the smallest e4m3 subnormal
  CHECK(to_fp8_e4m3(sub).bits == 0x01);
  CHECK(to_fp8_e4m3(-sub).bits == 0x81);
  CHECK(to_fp8_e4m3(7 * sub).bits == 0x07);
  CHECK(to_fp8_e4m3(sub / 2).bits == 0x00);  // tie with 0 rounds to even
  CHECK(to_fp8_e4m3(std::nextafter(sub / 2, 1.0f)).bits == 0x01);
  CHECK(to_fp8_e4m3(1.5f * sub).bits == 0x02);  // tie between 1 and 2
  CHECK(to_fp8_e4m3(2.5f * sub).bits == 0x02);  // tie between 2 and 3
  CHECK(to_fp8_e4m3(7.5f * sub).bits == 0x08);  // rounds up into the normals
  CHECK(to_fp8_e4m3(0.0f).bits == 0x00);
  CHECK(to_fp8_e4m3(-0.0f).bits == 0x80);
  CHECK(to_fp8_e4m3(-1e-10f).bits == 0x80);  // underflow keeps the sign
  CHECK(to_fp8_e4m3(from_bits(0x0000'0001)).bits == 0x00);
}

TEST_CASE("to_fp8_e4m3: NaN of either sign becomes 0x7F") {
  CHECK(to_fp8_e4m3(qnan).bits == 0x7F);
  CHECK(to_fp8_e4m3(-qnan).bits == 0x7F);
  CHECK(to_fp8_e4m3(from_bits(0xFF80'0001)).bits == 0x7F);
  CHECK(to_fp8_e4m3(bf16{0xFFC0}).bits == 0x7F);
}

TEST_CASE("to_float(fp8_e4m3): known values") {
  CHECK(to_float(fp8_e4m3{0x38}) == 1.0f);
  CHECK(to_float(fp8_e4m3{0xC2}) == -2.5f);
  CHECK(to_float(fp8_e4m3{0x7E}) == 448.0f);
  CHECK(to_float(fp8_e4m3{0xFE}) == -448.0f);
  CHECK(to_float(fp8_e4m3{0x08}) == std::ldexp(1.0f, -6));
  CHECK(to_float(fp8_e4m3{0x01}) == std::ldexp(1.0f, -9));
  CHECK(to_float(fp8_e4m3{0x07}) == std::ldexp(7.0f, -9));
  CHECK(to_float(fp8_e4m3{0x00}) == 0.0f);
  CHECK(std::signbit(to_float(fp8_e4m3{0x80})));
  // Both NaN encodings give the positive canonical NaN, as CUDA does.
  CHECK(bits_of(to_float(fp8_e4m3{0x7F})) == 0x7FFF'FFFF);
  CHECK(bits_of(to_float(fp8_e4m3{0xFF})) == 0x7FFF'FFFF);
}

TEST_CASE("round trips through float are the identity on non-NaN encodings") {
  for (unsigned b = 0; b < 256; ++b) {
    const fp8_e4m3 q{static_cast<std::uint8_t>(b)};
    if ((b & 0x7F) == 0x7F) continue;
    CAPTURE(b);
    CHECK(to_fp8_e4m3(to_float(q)) == q);
    CHECK(from_float<fp8_e4m3>(to_float(q)) == q);
    // Every e4m3 value is a bf16 value, so the detour through bf16 is exact.
    CHECK(to_fp8_e4m3(to_bf16(to_float(q))) == q);
  }
  for (unsigned b = 0; b < 0x1'0000; ++b) {
    const bf16 h{static_cast<std::uint16_t>(b)};
    if ((b & 0x7FFF) > 0x7F80) continue;
    if (to_bf16(to_float(h)) != h || from_float<bf16>(to_float(h)) != h) {
      CAPTURE(b);
      FAIL("bf16 does not round-trip");
    }
  }
  CHECK(from_float<float>(-2.5f) == -2.5f);
  CHECK(to_float(-2.5f) == -2.5f);
}

TEST_CASE("to_fp8_e4m3 is monotonic and within half an ulp of its input") {
  // Every float of [-500, 500] on a grid much finer than the e4m3 ulp.
  float prev = -pos_inf;
  for (int i = -500 * 256; i <= 500 * 256; ++i) {
    const float x = static_cast<float>(i) / 256.0f;
    const float q = to_float(to_fp8_e4m3(x));
    REQUIRE(q >= prev);
    prev = q;
    const float ax = std::fabs(x);
    if (ax > 448.0f) continue;
    // Half an ulp: 2^(e - 4) for |x| in [2^e, 2^(e+1)), 2^-10 below 2^-6.
    const float half_ulp =
        ax < 0.015625f ? std::ldexp(1.0f, -10) : std::ldexp(1.0f, std::ilogb(ax) - 4);
    REQUIRE(std::fabs(q - x) <= half_ulp);
  }
}
