// Exhaustive agreement of epcomm's conversions with CUDA's own, on the host:
// CUDA's headers are compiled by the host compiler here, so their host code
// paths are the reference. Only this test includes them; the library never does.
//
// The two 2^32-input sweeps are split into slices, one doctest case each, that
// CMake registers as separate CTest tests so ctest -j runs them in parallel.
// They are marked skip() so the plain test binary stays quick.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "epcomm/core/token_types.hpp"

namespace {

using epcomm::bf16;
using epcomm::fp8_e4m3;
using epcomm::detail::bit_cast;

// Counts disagreements of got(i) and want(i) over [begin, end) and keeps the
// first few for the failure message.
template <class Got, class Want>
void sweep(std::uint64_t begin, std::uint64_t end, Got got, Want want) {
  std::uint64_t mismatches = 0;
  std::string first;
  for (std::uint64_t i = begin; i < end; ++i) {
    const auto input = static_cast<std::uint32_t>(i);
    const std::uint32_t g = got(input);
    const std::uint32_t w = want(input);
    if (g != w) {
      if (++mismatches <= 8) {
        char line[80];
        std::snprintf(line, sizeof line, "input 0x%08x: got 0x%x, CUDA 0x%x\n", input, g, w);
        first += line;
      }
    }
  }
  INFO(first);
  CHECK(mismatches == 0);
}

std::uint32_t epcomm_f32_to_bf16(std::uint32_t u) {
  return epcomm::to_bf16(bit_cast<float>(u)).bits;
}
std::uint32_t cuda_f32_to_bf16(std::uint32_t u) {
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16(bit_cast<float>(u))).x;
}

std::uint32_t epcomm_f32_to_fp8(std::uint32_t u) {
  return epcomm::to_fp8_e4m3(bit_cast<float>(u)).bits;
}
std::uint32_t cuda_f32_to_fp8(std::uint32_t u) {
  return __nv_cvt_float_to_fp8(bit_cast<float>(u), __NV_SATFINITE, __NV_E4M3);
}

constexpr std::uint64_t slice_count = 4;

void sweep_f32_to_bf16(std::uint64_t slice) {
  const std::uint64_t size = (std::uint64_t{1} << 32) / slice_count;
  sweep(slice * size, (slice + 1) * size, epcomm_f32_to_bf16, cuda_f32_to_bf16);
}

void sweep_f32_to_fp8(std::uint64_t slice) {
  const std::uint64_t size = (std::uint64_t{1} << 32) / slice_count;
  sweep(slice * size, (slice + 1) * size, epcomm_f32_to_fp8, cuda_f32_to_fp8);
}

}  // namespace

// Test-case names must stay in sync with tests/CMakeLists.txt, which selects
// them with --test-case.
TEST_CASE("f32_to_bf16 slice 0" * doctest::skip()) { sweep_f32_to_bf16(0); }
TEST_CASE("f32_to_bf16 slice 1" * doctest::skip()) { sweep_f32_to_bf16(1); }
TEST_CASE("f32_to_bf16 slice 2" * doctest::skip()) { sweep_f32_to_bf16(2); }
TEST_CASE("f32_to_bf16 slice 3" * doctest::skip()) { sweep_f32_to_bf16(3); }
TEST_CASE("f32_to_fp8 slice 0" * doctest::skip()) { sweep_f32_to_fp8(0); }
TEST_CASE("f32_to_fp8 slice 1" * doctest::skip()) { sweep_f32_to_fp8(1); }
TEST_CASE("f32_to_fp8 slice 2" * doctest::skip()) { sweep_f32_to_fp8(2); }
TEST_CASE("f32_to_fp8 slice 3" * doctest::skip()) { sweep_f32_to_fp8(3); }

TEST_CASE("bf16 to float: all 2^16 inputs match __bfloat162float") {
  sweep(
      0, 1u << 16,
      [](std::uint32_t u) {
        return bit_cast<std::uint32_t>(epcomm::to_float(bf16{static_cast<std::uint16_t>(u)}));
      },
      [](std::uint32_t u) {
        __nv_bfloat16_raw raw;
        raw.x = static_cast<unsigned short>(u);
        return bit_cast<std::uint32_t>(__bfloat162float(__nv_bfloat16(raw)));
      });
}

TEST_CASE("fp8 to float: all 256 inputs match __nv_cvt_fp8_to_halfraw then __half2float") {
  sweep(
      0, 256,
      [](std::uint32_t u) {
        return bit_cast<std::uint32_t>(epcomm::to_float(fp8_e4m3{static_cast<std::uint8_t>(u)}));
      },
      [](std::uint32_t u) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(u), __NV_E4M3);
        return bit_cast<std::uint32_t>(__half2float(__half(h)));
      });
}

TEST_CASE("bf16 to fp8: all 2^16 inputs match __nv_cvt_bfloat16raw_to_fp8") {
  sweep(
      0, 1u << 16,
      [](std::uint32_t u) {
        return std::uint32_t{epcomm::to_fp8_e4m3(bf16{static_cast<std::uint16_t>(u)}).bits};
      },
      [](std::uint32_t u) {
        __nv_bfloat16_raw raw;
        raw.x = static_cast<unsigned short>(u);
        return std::uint32_t{__nv_cvt_bfloat16raw_to_fp8(raw, __NV_SATFINITE, __NV_E4M3)};
      });
}
