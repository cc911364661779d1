// The RMA transports' symmetric buffer in CUDA device memory (libfabric
// FI_HMEM, UCX memory type CUDA), for producers that run on the GPU. Built
// twice: without EPCOMM_WITH_CUDA, where asking for device memory must be
// refused on every rank with an error that says how to get it; and linked
// with epcomm::cuda, where it must either work (bytes put from one GPU
// buffer land in the peer's, counted by the signal) or fail on every rank
// with an epcomm::error naming the rank, the setup and the CUDA or fabric
// call that refused (no GPU, or a provider built without CUDA), never crash.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/core/error.hpp"
#include "support/exit_codes.hpp"

#if defined(EPCOMM_TEST_LIBFABRIC)
#include "epcomm/libfabric/transport.hpp"
#endif
#if defined(EPCOMM_TEST_UCX)
#include "epcomm/ucx/transport.hpp"
#endif
#if defined(EPCOMM_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

using namespace epcomm;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

#if defined(EPCOMM_WITH_CUDA)
bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// With a GPU and a fabric that registers it: rank 0 puts a pattern from its
// device buffer into rank 1's, and rank 1 reads it back after the signal.
template <class Transport>
int round_trip(Transport& t, int rank, const deadline& dl) {
  constexpr std::size_t bytes = 1 << 16;
  if (!t.local_buffer_on_device())
    return test::fail_rank(rank, "local buffer is not device memory");
  std::vector<unsigned char> host(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i * 7 + 3);
  auto buf = t.local_buffer();
  if (rank == 0) {
    if (cudaMemcpy(buf.data(), host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
      return test::fail_rank(rank, "cudaMemcpy to the buffer failed");
    t.put_signal(1, 0, bytes, bytes, 0, 1);
    while (t.completed() < 1) {
      if (dl.expired()) return test::fail_rank(rank, "put_signal never completed");
      t.progress();
    }
  } else {
    t.wait(0, 1, dl, {"device round trip", 0, "the pattern"});
    std::vector<unsigned char> seen(bytes);
    if (cudaMemcpy(seen.data(), buf.data() + bytes, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
      return test::fail_rank(rank, "cudaMemcpy from the buffer failed");
    if (seen != host) return test::fail_rank(rank, "the pattern did not arrive intact");
  }
  t.barrier(dl);
  return 0;
}
#endif

// Every rank of two asks for device memory; `refusal` is what an error must
// contain where device memory cannot be had.
template <class Transport, class Options>
void check_device_memory(const char* setup_op) {
  const auto codes = launch_local(2, [&](local_bootstrap& boot) {
    const int rank = boot.rank();
    const deadline dl = deadline::after(std::chrono::seconds(60));
    Options opt;
    opt.memory.kind = proxy::memory_kind::cuda_device;
    const std::string prefix = "epcomm: rank " + std::to_string(rank) + ": " + setup_op;
    try {
      Transport t(boot, 2 << 16, 1, dl, opt);
#if defined(EPCOMM_WITH_CUDA)
      return round_trip(t, rank, dl);
#else
      return test::fail_rank(rank, "device memory granted without EPCOMM_WITH_CUDA");
#endif
    } catch (const error& e) {
      const std::string what = e.what();
      if (!contains(what, prefix))
        return test::fail_rank(rank, "error does not name rank and op: " + what);
#if defined(EPCOMM_WITH_CUDA)
      // A fabric library built without CUDA says so in its call (fi_getinfo
      // or the registration); with no GPU, the CUDA call that failed does.
      const bool fabric_refused =
          contains(what, "FI_HMEM") || contains(what, "UCS_MEMORY_TYPE_CUDA");
      const bool explained = fabric_refused || (!have_gpu() && contains(what, "failed: cudaError"));
      if (!explained) return test::fail_rank(rank, "unexpected refusal: " + what);
      MESSAGE("rank " << rank << " refused device memory: " << what);
      return 0;
#else
      return contains(what, "built without EPCOMM_WITH_CUDA (link epcomm::cuda)")
                 ? 0
                 : test::fail_rank(rank, "unexpected error: " + what);
#endif
    }
  });
  CHECK(test::all_ok(codes, setup_op));
}

}  // namespace

#if defined(EPCOMM_TEST_LIBFABRIC)
TEST_CASE("libfabric: a buffer in CUDA device memory is registered with FI_HMEM or refused") {
  check_device_memory<libfabric::transport, libfabric::options>("libfabric setup");
}
#endif

#if defined(EPCOMM_TEST_UCX)
TEST_CASE("ucx: a buffer in CUDA device memory is mapped as CUDA memory or refused") {
  check_device_memory<ucx::transport, ucx::options>("ucx setup");
}
#endif
