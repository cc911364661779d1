// Whether this process sees a CUDA device: the tests that check kernels on a
// GPU and the setup's refusal without one ask it. Ask it in a rank, after
// fork(): a process that initialised CUDA cannot fork usable children.
#pragma once

#include <cuda_runtime_api.h>

namespace epcomm::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace epcomm::test
