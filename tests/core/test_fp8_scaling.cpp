// Per-128-element fp8 scaling: the scale arithmetic, error bounds of a
// quantise/dequantise round trip, UE8M0 (power-of-two) scales, and edge blocks.
#include "epcomm/core/fp8_scaling.hpp"
#include "support/simd_isas.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

using epcomm::bf16;
using epcomm::fp8_block;
using epcomm::fp8_e4m3;
using epcomm::detail::bit_cast;

bool is_pow2(float x) { return x > 0 && (bit_cast<std::uint32_t>(x) & 0x7F'FFFFu) == 0; }

// A deterministic row whose blocks span many magnitudes: block b holds values
// up to 2^(b - 8) in size, signed, with a few exact zeros.
std::vector<float> make_row(int hidden, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> row(hidden);
  for (int i = 0; i < hidden; ++i) {
    // Uniform in [-1, 1) from 24 random bits, independent of the standard
    // library's distribution implementation.
    const float u = static_cast<float>(static_cast<std::int32_t>(rng() >> 8) - (1 << 23)) /
                    static_cast<float>(1 << 23);
    row[i] = i % 37 == 0 ? 0.0f : std::ldexp(u, i / fp8_block - 8);
  }
  return row;
}

// Round-trip error bound for one element: e4m3 keeps 4 significant bits, so
// rounding x * inv costs at most 2^-4 of its magnitude, or half the smallest
// subnormal (2^-10) in scaled units; the two float multiplies and
// scale * inv != 1 add a few float ulps on top.
float error_bound(float x, float scale) {
  return std::fmax(std::fabs(x) * 0x1p-4f, scale * 0x1p-10f) * (1 + 0x1p-18f);
}

template <class T>
void check_round_trip(const std::vector<float>& row, bool pow2) {
  const int hidden = static_cast<int>(row.size());
  std::vector<T> in(hidden);
  for (int i = 0; i < hidden; ++i) in[i] = epcomm::from_float<T>(row[i]);
  std::vector<fp8_e4m3> q(hidden);
  std::vector<float> scales(hidden / fp8_block);
  std::vector<float> out(hidden);
  epcomm::quantize_fp8_row(in.data(), hidden, q.data(), scales.data(), pow2);
  epcomm::dequantize_fp8_row(q.data(), scales.data(), hidden, out.data());
  for (int b = 0; b < hidden / fp8_block; ++b) {
    float amax = 0;
    for (int i = 0; i < fp8_block; ++i) {
      amax = std::fmax(amax, std::fabs(epcomm::to_float(in[b * fp8_block + i])));
    }
    CAPTURE(b);
    CHECK(scales[b] == epcomm::fp8_block_scale(amax, pow2));
    if (pow2) CHECK(is_pow2(scales[b]));
    for (int i = 0; i < fp8_block; ++i) {
      const int k = b * fp8_block + i;
      const float x = epcomm::to_float(in[k]);
      CAPTURE(x);
      REQUIRE(out[k] == epcomm::to_float(q[k]) * scales[b]);
      REQUIRE(std::fabs(out[k] - x) <= error_bound(x, scales[b]));
      // The coarse, block-level form of the same bound.
      REQUIRE(std::fabs(out[k] - x) <= amax * 0x1p-4f);
    }
  }
}

}  // namespace

TEST_CASE("fp8_block_scale and inv_scale follow DeepEP's arithmetic") {
  for (const float amax : {1e-4f, 3e-3f, 0.5f, 1.0f, 7.25f, 448.0f, 1000.0f, 3e5f}) {
    CAPTURE(amax);
    CHECK(epcomm::fp8_block_scale(amax, false) == amax * (1.0f / 448.0f));
    CHECK(epcomm::fp8_block_inv_scale(amax, false) == 448.0f / amax);
  }
  // The scale maps amax onto the top of the e4m3 range.
  CHECK(epcomm::fp8_block_scale(448.0f, false) == 1.0f);
  CHECK(epcomm::fp8_block_scale(448.0f * 1024, true) == 1024.0f);
}

TEST_CASE("pow2 scales are the smallest power of two not below amax / 448") {
  for (float amax = 1e-4f; amax < 1e9f; amax *= 1.37f) {
    CAPTURE(amax);
    const float s = epcomm::fp8_block_scale(amax, true);
    const float exact = epcomm::fp8_block_scale(amax, false);
    CHECK(is_pow2(s));
    CHECK(s >= exact);
    CHECK(s / 2 < exact);
    // Power-of-two scales make the multiplier an exact reciprocal.
    CHECK(s * epcomm::fp8_block_inv_scale(amax, true) == 1.0f);
  }
  CHECK(epcomm::fp8_block_scale(448.0f, true) == 1.0f);
  CHECK(epcomm::fp8_block_scale(449.0f, true) == 2.0f);
  CHECK(epcomm::fp8_block_scale(224.0f, true) == 0.5f);
}

TEST_CASE("an all-zero block quantises to zeros with the minimum scale") {
  for (const bool pow2 : {false, true}) {
    CAPTURE(pow2);
    std::array<float, fp8_block> in{};
    std::array<fp8_e4m3, fp8_block> q;
    q.fill(fp8_e4m3{0x55});
    float scale = 0;
    epcomm::quantize_fp8_block(in.data(), fp8_block, q.data(), &scale, pow2);
    for (const fp8_e4m3 v : q) CHECK(v.bits == 0x00);
    CHECK(scale == epcomm::fp8_block_scale(epcomm::fp8_amax_floor, pow2));
    CHECK(scale == (pow2 ? 0x1p-22f : 1e-4f * (1.0f / 448.0f)));
  }
}

TEST_CASE("a short block writes only its n outputs") {
  std::array<float, 5> in{1.0f, -2.0f, 0.25f, 3.5f, -0.0f};
  std::array<fp8_e4m3, 8> q;
  q.fill(fp8_e4m3{0x55});
  float scale = 0;
  epcomm::quantize_fp8_block(in.data(), 5, q.data(), &scale, false);
  CHECK(scale == epcomm::fp8_block_scale(3.5f, false));
  CHECK(q[3].bits == 0x7E);  // amax lands on 448
  CHECK(q[4].bits == 0x80);  // -0 keeps its sign
  for (int i = 5; i < 8; ++i) CHECK(q[i].bits == 0x55);
}

TEST_CASE("NaN elements do not affect the block scale") {
  std::array<float, fp8_block> in{};
  in[0] = 2.0f;
  in[1] = std::numeric_limits<float>::quiet_NaN();
  in[2] = -std::numeric_limits<float>::quiet_NaN();
  std::array<fp8_e4m3, fp8_block> q;
  float scale = 0;
  epcomm::quantize_fp8_block(in.data(), fp8_block, q.data(), &scale, true);
  CHECK(scale == epcomm::fp8_block_scale(2.0f, true));
  CHECK(q[1].bits == 0x7F);
  CHECK(q[2].bits == 0x7F);
}

TEST_CASE("quantize/dequantize round trip stays within e4m3 precision") {
  const std::vector<float> row = make_row(16 * fp8_block, 12345);
  for (const bool pow2 : {false, true}) {
    CAPTURE(pow2);
    check_round_trip<float>(row, pow2);
    check_round_trip<bf16>(row, pow2);
  }
}

TEST_CASE("quantize_fp8_row is quantize_fp8_block per block") {
  const std::vector<float> row = make_row(4 * fp8_block, 7);
  std::vector<fp8_e4m3> by_row(row.size()), by_block(row.size());
  std::array<float, 4> row_scales{}, block_scales{};
  epcomm::quantize_fp8_row(row.data(), 4 * fp8_block, by_row.data(), row_scales.data(), false);
  for (int b = 0; b < 4; ++b) {
    epcomm::quantize_fp8_block(row.data() + b * fp8_block, fp8_block,
                               by_block.data() + b * fp8_block, &block_scales[b], false);
  }
  CHECK(row_scales == block_scales);
  CHECK(by_row == by_block);
}

namespace {

// Rows quantised with every instruction set this CPU runs must equal the
// scalar blocks bit for bit (scales too), whatever the input type and scale.
template <class T>
void check_isas_against_blocks(const std::vector<T>& in, bool pow2) {
  const int hidden = static_cast<int>(in.size());
  std::vector<fp8_e4m3> want(hidden);
  std::vector<float> want_scales(hidden / fp8_block);
  for (int b = 0; b < hidden / fp8_block; ++b)
    epcomm::quantize_fp8_block(in.data() + b * fp8_block, fp8_block, want.data() + b * fp8_block,
                               want_scales.data() + b, pow2);
  for (auto isa : epcomm::test::runnable_simd_isas()) {
    CAPTURE(static_cast<int>(isa));
    std::vector<fp8_e4m3> got(hidden);
    std::vector<float> scales(hidden / fp8_block);
    epcomm::detail::quantize_fp8_row_on(isa, in.data(), hidden, got.data(), scales.data(), pow2);
    for (int b = 0; b < hidden / fp8_block; ++b)
      REQUIRE(bit_cast<std::uint32_t>(scales[b]) == bit_cast<std::uint32_t>(want_scales[b]));
    // The first element that differs, if any (one assertion per row).
    int i = 0;
    while (i < hidden && got[i].bits == want[i].bits) ++i;
    if (i < hidden) {
      CAPTURE(i);
      CAPTURE(bit_cast<std::uint32_t>(epcomm::to_float(in[i])));
      REQUIRE(got[i].bits == want[i].bits);
    }
  }
}

}  // namespace

TEST_CASE("the vectorised row cast gives the scalar blocks' bits on every instruction set") {
  MESSAGE("instruction sets checked: ", epcomm::test::runnable_simd_isas().size(), " of 3");
  for (const bool pow2 : {false, true}) {
    CAPTURE(pow2);
    for (std::uint32_t seed : {1u, 2u, 3u}) {
      const std::vector<float> row = make_row(7168, seed);
      check_isas_against_blocks(row, pow2);
      std::vector<bf16> row16(row.size());
      for (std::size_t i = 0; i < row.size(); ++i) row16[i] = epcomm::to_bf16(row[i]);
      check_isas_against_blocks(row16, pow2);
    }
  }
}

// Each block starts with 448, so its inverse scale is exactly 1 and the other
// 127 elements are cast as they are: every float of magnitude up to 448, NaNs
// included, in strides over the whole range and densely where e4m3 turns from
// subnormal to normal and where it rounds to its largest value.
TEST_CASE("the vectorised cast equals to_fp8_e4m3 across the float range") {
  std::vector<float> row;
  std::uint64_t cast = 0;
  const auto flush = [&] {
    while (row.size() % fp8_block != 0) row.push_back(0.0f);
    check_isas_against_blocks(row, false);
    cast += row.size();
    row.clear();
  };
  const auto add = [&](std::uint32_t bits) {
    const float x = bit_cast<float>(bits);
    if (!(std::fabs(x) <= 448.0f) && !std::isnan(x)) return;  // would raise the block's amax
    if (row.size() % fp8_block == 0) row.push_back(448.0f);
    row.push_back(x);
    if (row.size() == 64 * fp8_block) flush();
  };
  for (std::uint64_t bits = 0; bits <= 0xFFFF'FFFFu; bits += 4099)
    add(static_cast<std::uint32_t>(bits));
  for (std::uint32_t sign : {0u, 0x8000'0000u}) {
    for (std::uint32_t bits = 0x3A00'0000u; bits < 0x3D00'0000u; bits += 3) add(sign | bits);
    for (std::uint32_t bits = 0x43D0'0000u; bits <= 0x43E0'0000u; ++bits) add(sign | bits);
  }
  flush();
  MESSAGE("floats cast: ", cast);
}
