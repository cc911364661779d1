// The physical bound: the bytes an op cannot avoid moving through host memory, over the memory
// bandwidth each rank gets while every rank copies at once. No implementation can beat it on
// this host, so an op's fraction of it is at most 1; the driver checks that and says so when a
// measurement breaks it.
//
// The bytes, the busiest rank's: dispatch reads each of its tokens once and writes it once per
// destination rank; combine is the reverse: it reads each row that comes back to the rank once
// (wherever it lies: a reduction may read it from the expert rank's memory, so nothing obliges
// it to be written on its way back) and writes each of its tokens once. Payload and fp8
// scales; no metadata. The same definition as bench/python/epcomm_vs_torch.py.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "traffic.hpp"

namespace epcomm::bench {

// Bytes per second of memory traffic (read + write) one rank gets while every rank of `comm`
// copies `bytes` at once: pre-faulted buffers, one warm-up copy, then the slowest rank's best
// of five. Collective.
double copy_bandwidth(MPI_Comm comm, std::size_t bytes);

struct memory_traffic {
  double dispatch = 0;  // this rank's bytes read and written
  double combine = 0;
};

// This rank's unavoidable memory traffic for the transfers `t`, with `tokens` source rows of
// `dispatch_row` bytes going out and of `combine_row` bytes coming back.
memory_traffic must_move(const traffic& t, int tokens, std::size_t dispatch_row,
                         std::size_t combine_row);

}  // namespace epcomm::bench
