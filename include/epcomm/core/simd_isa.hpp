// The x86-64 instruction sets the host engine's hot loops (the combine
// reduction, the fp8 cast) are compiled for besides the baseline, and the
// widest this CPU runs, found once at run time.
//
// A library user compiles for the x86-64 baseline (SSE2) by default, which
// runs these loops at a fraction of the memory's speed. So the same source is
// compiled again inside functions marked EPCOMM_TARGET_AVX2 or
// EPCOMM_TARGET_AVX512 and the caller picks the widest set the CPU has: no
// flag for the user to set, and the bits are those of the baseline build
// where the loop reorders nothing within a lane. flatten inlines everything
// the marked function calls, so that all of it is compiled for the target (a
// callee built for the baseline may be inlined into a wider caller, not the
// other way round).
#pragma once

namespace epcomm::detail {

// Narrowest first: a set runs where every set before it does.
enum class simd_isa { baseline, avx2, avx512 };

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define EPCOMM_SIMD_MULTIVERSION 1
#define EPCOMM_TARGET_AVX2 [[gnu::target("avx2"), gnu::flatten]]
#define EPCOMM_TARGET_AVX512 [[gnu::target("avx512f,avx512bw,avx512vl"), gnu::flatten]]

inline simd_isa widest_simd_isa() noexcept {
  static const simd_isa widest = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
      return simd_isa::avx512;
    return __builtin_cpu_supports("avx2") ? simd_isa::avx2 : simd_isa::baseline;
  }();
  return widest;
}
#else
inline simd_isa widest_simd_isa() noexcept { return simd_isa::baseline; }
#endif

}  // namespace epcomm::detail
