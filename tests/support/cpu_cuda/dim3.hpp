// CUDA's dim3 (also the type of threadIdx and blockIdx here), with the
// linear index and the "(x,y,z)" spelling the fault messages use.
#pragma once

#include <string>

namespace epcomm::test::cpu_cuda {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;

  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}

  constexpr unsigned volume() const { return x * y * z; }
  // The index x-major, as CUDA numbers threads into warps.
  constexpr unsigned linear(dim3 extent) const { return x + extent.x * (y + extent.y * z); }
  static constexpr dim3 from_linear(unsigned i, dim3 extent) {
    return {i % extent.x, i / extent.x % extent.y, i / (extent.x * extent.y)};
  }
};

inline std::string to_string(dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

}  // namespace epcomm::test::cpu_cuda
