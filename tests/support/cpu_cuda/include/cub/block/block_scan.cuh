// cub::BlockScan for device code run on the CPU (tests/support/cpu_cuda): the
// one scan the kernels use, ExclusiveSum with the block's aggregate, over
// TempStorage shared by the block. Like CUB's, TempStorage may be reused only
// after a __syncthreads() that follows the call: this one reads every
// thread's input after its own barrier, so a caller that skips that barrier
// mixes two tiles' inputs here as it could on a GPU.
#pragma once

namespace cub {

template <class T, int BlockThreads>
class BlockScan {
 public:
  struct TempStorage {
    T input[BlockThreads];
  };

  explicit BlockScan(TempStorage& storage) : storage_(storage) {}

  void ExclusiveSum(T input, T& output, T& aggregate) {
    const int me =
        static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    storage_.input[me] = input;
    __syncthreads();
    T before{};
    T total{};
    for (int i = 0; i < BlockThreads; ++i) {
      if (i == me) before = total;
      total = total + storage_.input[i];
    }
    output = before;
    aggregate = total;
  }

 private:
  TempStorage& storage_;
};

}  // namespace cub
