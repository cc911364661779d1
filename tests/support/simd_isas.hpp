// Every instruction set the host's multiversioned loops (core/simd_isa.hpp)
// may run with on this CPU, narrowest first: a test checks each against the
// baseline.
#pragma once

#include <vector>

#include "epcomm/core/simd_isa.hpp"

namespace epcomm::test {

inline std::vector<detail::simd_isa> runnable_simd_isas() {
  std::vector<detail::simd_isa> isas;
  for (auto isa : {detail::simd_isa::baseline, detail::simd_isa::avx2, detail::simd_isa::avx512})
    if (isa <= detail::widest_simd_isa()) isas.push_back(isa);
  return isas;
}

}  // namespace epcomm::test
