// What both low-latency kernels (dispatch.cuh, combine.cuh) do alike: each
// thread's first reads of its arguments, where a parity's regions and
// signals are, and the reject records and count words that close a call;
// and the headers both build on (the wire, the route, the verdicts, the
// device waits, lost peers and copies), included here once for the two.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/core/input_errors.hpp"
#include "epcomm/core/token_types.hpp"
#include "epcomm/low_latency/cuda/arith.hpp"
#include "epcomm/low_latency/cuda/copy.cuh"
#include "epcomm/low_latency/cuda/launch.hpp"
#include "epcomm/low_latency/cuda/lost_peers.cuh"
#include "epcomm/low_latency/cuda/sync.cuh"
#include "epcomm/low_latency/rma.hpp"
#include "epcomm/low_latency/route.hpp"
#include "epcomm/low_latency/verdict.hpp"
#include "epcomm/low_latency/wire.hpp"
#include "epcomm/proxy/channel.hpp"

namespace epcomm::cuda::device {

// What every thread of a low-latency kernel reads first: the rank's report
// (the kernel does nothing once the rank is broken), the call's shape, this
// rank, the parity (buffer half) the call uses, and the thread's warp and
// lane. A kernel takes it apart: const auto [rep, s, ...] = ll_thread_of(a)
// (lambdas read `a` instead: clang before 16 cannot capture such names).
struct ll_thread {
  ll_report* rep;
  const wire::ll::shape& s;
  int world;
  int rank;
  int p;
  int warp;
  int lane;
};

__device__ __forceinline__ ll_thread ll_thread_of(const ll_args& a) {
  const int thread = static_cast<int>(threadIdx.x);
  return {a.ws.rep,           a.shape,           a.shape.world_size, a.peers.rank, a.parity,
          thread / warp_size, thread % warp_size};
}

// Parity a.parity of the region at `offset` in rank r's buffer, as mapped here.
__device__ __forceinline__ std::byte* ll_region(const ll_args& a, int r, std::size_t offset) {
  return a.peers.buffer[r] + wire::ll::parity_base(a.plan, a.parity) + offset;
}

// This rank's whole buffer; RMA offsets (low_latency/rma.hpp) start here.
__device__ __forceinline__ std::byte* ll_own_buffer(const ll_args& a) {
  return a.peers.buffer[a.peers.rank];
}

__device__ __forceinline__ std::uint64_t* ll_signal(const ll_args& a, int r, std::size_t slot) {
  return a.peers.signals[r] + slot;
}

__device__ __forceinline__ int ll_hidden(const ll_args& a, int compile_time) {
  return compile_time > 0 ? compile_time : a.shape.hidden;
}

// Writes this rank's reject record into `kind`'s slot of every rank's reject
// region (over RMA: of its own, and into its staging for the proxy); thread
// 0 words the cause with describe(char* out). Block-wide.
template <class Describe>
__device__ void post_reject_records(const ll_args& a, wire::ll::reject_kind kind,
                                    std::uint64_t epoch, Describe describe) {
  __shared__ wire::ll::reject_record rec;
  const int world = a.shape.world_size;
  if (threadIdx.x == 0) {
    rec.epoch = epoch;
    for (int i = 0; i < wire::cause_bytes; ++i) rec.cause[i] = '\0';
    describe(rec.cause);
  }
  __syncthreads();
  constexpr int vectors = sizeof(wire::ll::reject_record) / 16;
  static_assert(sizeof(wire::ll::reject_record) % 16 == 0);
  const auto* in = reinterpret_cast<const int4*>(&rec);
  const wire::ll::rma_write staged =
      wire::ll::reject_write(a.shape, a.plan, a.parity, a.peers.rank, kind, a.peers.rank);
  const int targets = a.route.via_proxy != 0 ? 2 : world;
  for (int i = threadIdx.x; i < targets * vectors; i += blockDim.x) {
    const int r = i / vectors;
    std::byte* at = a.route.via_proxy != 0
                        ? ll_own_buffer(a) + (r == 0 ? staged.remote : staged.local)
                        : ll_region(a, r, a.plan.rejects) +
                              (static_cast<std::size_t>(kind) * world + a.peers.rank) *
                                  sizeof(wire::ll::reject_record);
    reinterpret_cast<int4*>(at)[i % vectors] = in[i % vectors];
  }
  // Every record before any count word that announces it.
  __threadfence_system();
  __syncthreads();
}

// Stores a count word (16 bytes) into a peer's region and signals it: the
// release add orders the word, and everything this block made visible
// before, ahead of the counter update the receiver acquires.
__device__ __forceinline__ void publish_count(std::byte* at, std::uint64_t* signal,
                                              const wire::ll::count_word& w) {
  *reinterpret_cast<wire::ll::count_word*>(at) = w;
  add_release(signal, 1);
}

}  // namespace epcomm::cuda::device
