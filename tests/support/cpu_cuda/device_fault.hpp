// What a CPU-run kernel did that CUDA leaves undefined or that never ends (a
// barrier or warp collective not every named thread reaches, a kernel past its
// deadline): launch() throws it on the calling thread once the grid stopped.
#pragma once

#include <stdexcept>
#include <string>

namespace epcomm::test::cpu_cuda {

struct device_fault : std::runtime_error {
  explicit device_fault(const std::string& what) : std::runtime_error("cpu_cuda: " + what) {}
};

}  // namespace epcomm::test::cpu_cuda
