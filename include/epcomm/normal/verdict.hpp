// What every rank of a normal-mode call concludes from the headers all ranks
// posted (dispatch's notify round, combine's status round), shared by the
// flat buffer and the hierarchical one. Every rank holds the same R headers,
// so every rank reaches the same verdict: either all go on to move payload
// or all throw the same error here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epcomm/core/error.hpp"
#include "epcomm/normal/arguments.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm {

// Whether rank s takes part in a call: every rank unless `members` (one flag
// per rank, identical on every rank) leaves some out (mask_lost_ranks).
inline bool takes_part(const std::vector<bool>& members, int s) {
  return members.empty() || members[s];
}

// A notify record is anything with a wire::notify_header `header` and
// `tokens_per_rank` (R counts). Records of ranks outside `members` are not
// read; their counts must be zero.
template <class Record>
void judge_notify(int rank, std::uint64_t epoch, int max_recv_tokens,
                  const std::vector<Record>& all, const std::vector<bool>& members = {}) {
  const int world = static_cast<int>(all.size());
  int first = -1;
  for (int s = 0; s < world; ++s) {
    if (!takes_part(members, s)) continue;
    if (first < 0) first = s;
    const auto& h = all[s].header;
    if (h.magic != wire::magic || h.epoch != epoch)
      throw error(rank, "dispatch", s,
                  "protocol mismatch: notify epoch " + std::to_string(h.epoch) + ", expected " +
                      std::to_string(epoch));
    if (h.state != wire::status::ok)
      throw error(
          rank, "dispatch", s == rank ? no_peer : s,
          std::string(s == rank ? "invalid input: " : "invalid input on that rank: ") + h.cause);
  }
  const auto& ref = all[first].header;
  for (int s = first + 1; s < world; ++s) {
    if (!takes_part(members, s)) continue;
    const auto& h = all[s].header;
    auto differs = [&](const char* what, int there, int on_first) {
      if (there != on_first)
        throw error(rank, "dispatch", s,
                    std::string(what) + " " + std::to_string(there) +
                        " on that rank disagrees with " + std::to_string(on_first) + " on rank " +
                        std::to_string(first));
    };
    differs("hidden", h.hidden, ref.hidden);
    differs("topk", h.topk, ref.topk);
    differs("token type id", h.token_id, ref.token_id);
    differs("num_experts", h.num_experts, ref.num_experts);
  }
  for (int r = 0; r < world; ++r) {
    if (!takes_part(members, r)) continue;  // nothing is sent to it
    long long total = 0;
    for (int s = 0; s < world; ++s) total += all[s].tokens_per_rank[r];
    const int bound = all[r].header.recv_bound;
    if (total > max_recv_tokens)
      throw error(rank, "dispatch", r,
                  "that rank would receive " + std::to_string(total) +
                      " tokens, more than its buffer holds (max_recv_tokens " +
                      std::to_string(max_recv_tokens) + ")");
    if (bound > 0 && total > bound)
      throw error(rank, "dispatch", r,
                  "that rank would receive " + std::to_string(total) +
                      " tokens, more than its worst_case_recv_tokens " + std::to_string(bound));
  }
}

inline void judge_combine_status(int rank, std::uint64_t epoch,
                                 const std::vector<wire::combine_header>& all,
                                 const std::vector<bool>& members = {}) {
  const int world = static_cast<int>(all.size());
  int first = -1;
  for (int s = 0; s < world; ++s) {
    if (!takes_part(members, s)) continue;
    if (first < 0) first = s;
    if (all[s].epoch != epoch)
      throw error(rank, "combine", s,
                  "protocol mismatch: combine epoch " + std::to_string(all[s].epoch) +
                      ", expected " + std::to_string(epoch));
    if (all[s].state != wire::status::ok)
      throw error(rank, "combine", s == rank ? no_peer : s,
                  std::string(s == rank ? "invalid input: " : "invalid input on that rank: ") +
                      all[s].cause);
  }
  for (int s = first + 1; s < world; ++s)
    if (takes_part(members, s) && all[s].with_weights != all[first].with_weights)
      throw error(rank, "combine", s,
                  "topk_weights given on some ranks only (every rank passes them or none)");
}

// The handle of an accepted dispatch: the full count matrix from the records
// and this rank's own placement of its tokens.
template <class Record>
dispatch_handle make_dispatch_handle(int rank, int num_tokens, int hidden, int topk,
                                     const std::vector<Record>& all,
                                     const std::vector<int>& send_pos) {
  const int world = static_cast<int>(all.size());
  dispatch_handle h;
  h.world_size = world;
  h.rank = rank;
  h.num_tokens = num_tokens;
  h.hidden = hidden;
  h.topk = topk;
  h.count_matrix.resize(static_cast<std::size_t>(world) * world);
  for (int s = 0; s < world; ++s)
    for (int r = 0; r < world; ++r) h.count_matrix[s * world + r] = all[s].tokens_per_rank[r];
  h.num_recv_tokens = h.recv_offset(world, rank);
  h.send_pos = send_pos;
  return h;
}

}  // namespace epcomm
