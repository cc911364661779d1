// How the ranks of a buffer agree on the configuration it is built with:
// each rank checks its own (the first requirement it breaks is its cause),
// all ranks exchange a record of it, and every rank fails, naming the
// culprit, unless all are valid and identical. A mismatch would otherwise
// give ranks different plans and hang the ones that agree. Normal mode
// (normal/capacity_agreement.hpp) and low-latency mode (low_latency/validation.hpp)
// agree this way on their own records.
#pragma once

#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/deadline.hpp"
#include "epcomm/core/error.hpp"

namespace epcomm {

// A rank's own verdict on its configuration: the first requirement broken,
// in the order they are checked.
class config_checks {
 public:
  void need(bool ok, const std::string& what) {
    if (!ok && cause_.empty()) cause_ = what;
  }
  // Experts spread evenly over the ranks.
  void need_experts_per_rank(int num_experts, int world) {
    need(num_experts >= world && num_experts % world == 0,
         "num_experts (" + std::to_string(num_experts) + ") must be a positive multiple of " +
             "world_size (" + std::to_string(world) + ")");
  }
  void need_topk_within_experts(int max_topk, int num_experts) {
    need(max_topk > 0 && max_topk <= num_experts, "max_topk must be in [1, num_experts]");
  }
  // Empty when every requirement holds.
  const std::string& cause() const { return cause_; }

 private:
  std::string cause_;
};

// Exchanges `mine` (a trivially copyable record whose `valid` member says
// whether `cause` is empty) with every rank of `boot`, then throws for op
// `op`: this rank's own cause first, else the first peer that rejected its
// config or whose record differs; `must_agree` lists the fields compared.
template <class Record, bootstrap B>
void agree_config(B& boot, const Record& mine, const std::string& cause,
                  std::chrono::milliseconds timeout, const char* op, const char* must_agree) {
  const int world = boot.world_size();
  const auto bytes = boot.all_gather(std::as_bytes(std::span(&mine, 1)), deadline::after(timeout));
  std::vector<Record> all(world);
  std::memcpy(all.data(), bytes.data(), bytes.size());
  if (!cause.empty()) throw error(boot.rank(), op, no_peer, "invalid config: " + cause);
  for (int p = 0; p < world; ++p) {
    if (!all[p].valid) throw error(boot.rank(), op, p, "peer rejected its config");
    if (std::memcmp(&all[p], &mine, sizeof mine) != 0)
      throw error(boot.rank(), op, p,
                  std::string("config differs from this rank's (") + must_agree + " must agree)");
  }
}

}  // namespace epcomm
