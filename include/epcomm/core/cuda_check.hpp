// CUDA runtime failures as epcomm::error, so a failed allocation or launch
// names the rank, the operation and the call that failed like every other
// epcomm failure.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "epcomm/core/error.hpp"

namespace epcomm::cuda {

inline void check_cuda(cudaError_t status, int rank, std::string_view op, int peer,
                       std::string_view call) {
  if (status == cudaSuccess) return;
  throw error(rank, op, peer,
              std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
                  cudaGetErrorString(status) + ")");
}

}  // namespace epcomm::cuda
