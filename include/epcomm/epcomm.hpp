// epcomm's host API in one include: both modes' buffers (normal,
// low-latency, hierarchical), the bootstraps that need no other library
// (local, env, subgroup), and everything they take and return. Transports
// are components of their own (epcomm/shm/transport.hpp, epcomm/libfabric/...,
// epcomm/ucx/..., epcomm/nvlink_ipc/...), as are the MPI bootstrap
// (epcomm/bootstrap/mpi.hpp) and the CUDA buffers (epcomm/normal/cuda/,
// epcomm/low_latency/cuda/): each needs its own library.
#pragma once

#include "epcomm/bootstrap/env.hpp"
#include "epcomm/bootstrap/local.hpp"
#include "epcomm/bootstrap/subgroup.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/hierarchical/buffer.hpp"
#include "epcomm/low_latency/buffer.hpp"
#include "epcomm/normal/buffer.hpp"
