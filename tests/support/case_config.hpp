// The buffer the shared multi-rank cases run on (async_case.hpp,
// cached_dispatch_case.hpp and the handle cases of the dispatch/combine
// suite): 4 experts per rank, top-4, 40 tokens per rank.
#pragma once

#include "epcomm/normal/arguments.hpp"

namespace epcomm::test {

inline buffer_config case_config(int world, int max_hidden) {
  buffer_config cfg;
  cfg.num_experts = 4 * world;
  cfg.max_hidden = max_hidden;
  cfg.max_topk = 4;
  cfg.max_tokens_per_rank = 40;
  return cfg;
}

}  // namespace epcomm::test
