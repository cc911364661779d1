// A buffer whose producer stores straight into peers' memory (the host
// engines over a peer-mapped transport, the CUDA kernels over nvlink_ipc)
// needs every rank mapped into this process; one that is not fails the
// construction on this rank, naming that rank.
#pragma once

#include <string>

#include "epcomm/core/error.hpp"

namespace epcomm {

// Throws for op `op` at the first of the `world` ranks that `t` does not map;
// `needs` says what the caller needs ("... needs every rank on one node").
template <class Transport>
void require_peer_mapped(const Transport& t, int rank, int world, const char* op,
                         const char* needs) {
  for (int p = 0; p < world; ++p)
    if (!t.is_peer_mapped(p))
      throw error(rank, op, p, std::string("rank is not peer-mapped from here; ") + needs);
}

}  // namespace epcomm
