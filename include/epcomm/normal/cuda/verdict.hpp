// The decisions a rank takes from what its peers posted, written once for the
// host tests and the CUDA kernels: judge the notify headers of a dispatch and
// the status headers of a combine, and word input errors found on the device.
// The order of checks and the attributed peer follow the host engine
// (normal/buffer.hpp), so on a given set of headers both reach the same verdict.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epcomm/core/config.hpp"
#include "epcomm/normal/count_matrix.hpp"
#include "epcomm/normal/report.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm::cuda {

// Appends text and integers into a fixed char array, always NUL-terminated and
// silently truncated: kernels have neither printf into memory nor allocation.
class cause_text {
 public:
  EPCOMM_HD cause_text(char* out, int capacity) : out_(out), cap_(capacity) {
    if (cap_ > 0) out_[0] = '\0';
  }

  EPCOMM_HD cause_text& operator<<(const char* s) {
    while (*s != '\0') put(*s++);
    return *this;
  }

  EPCOMM_HD cause_text& operator<<(long long v) {
    char digits[20];
    int n = 0;
    // Negate digit by digit so the most negative value needs no special case.
    const bool negative = v < 0;
    do {
      const int d = static_cast<int>(v % 10);
      digits[n++] = static_cast<char>('0' + (d < 0 ? -d : d));
      v /= 10;
    } while (v != 0);
    if (negative) put('-');
    while (n > 0) put(digits[--n]);
    return *this;
  }

 private:
  EPCOMM_HD void put(char c) {
    if (len_ + 1 >= cap_) return;
    out_[len_++] = c;
    out_[len_] = '\0';
  }

  char* out_;
  int cap_;
  int len_ = 0;
};

// The text find_invalid_expert (core/layout.hpp) produces for entry `index` of
// topk_idx[T][topk].
EPCOMM_HD inline void describe_invalid_expert(char* out, int capacity, long long index, int topk,
                                              long long expert, int num_experts) {
  cause_text(out, capacity) << "topk_idx[" << index / topk << "][" << index % topk
                            << "] = " << expert << " is outside [-1, "
                            << static_cast<long long>(num_experts) << ")";
}

// The low-latency host engine's text for a routing that names one expert more
// often than its region has slots (only possible when a token names it twice).
EPCOMM_HD inline void describe_expert_overflow(char* out, int capacity, long long expert,
                                               int max_tokens_per_rank) {
  cause_text(out, capacity) << "expert " << expert << " is named more than max_tokens_per_rank ("
                            << static_cast<long long>(max_tokens_per_rank)
                            << ") times: a token that names an expert twice takes two of its slots";
}

// The host engine's text for a combine input with fewer rows than were received.
EPCOMM_HD inline void describe_short_y(char* out, int capacity, long long y_rows, int hidden,
                                       int num_recv_tokens) {
  cause_text(out, capacity) << "y holds " << y_rows * hidden << " elements, expected N*H with N >= "
                            << static_cast<long long>(num_recv_tokens) << " rows of "
                            << static_cast<long long>(hidden);
}

// Slot `source` of a notify region: the header, then int32 tokens_per_rank[R],
// then int32 tokens_per_local_expert[E/R] for the region owner's experts.
EPCOMM_HD inline const wire::notify_header* notify_header_at(const std::byte* region,
                                                             std::size_t slot_bytes, int source) {
  return reinterpret_cast<const wire::notify_header*>(region + slot_bytes * source);
}
EPCOMM_HD inline const std::int32_t* notify_counts_at(const std::byte* region,
                                                      std::size_t slot_bytes, int source) {
  return reinterpret_cast<const std::int32_t*>(region + slot_bytes * source +
                                               sizeof(wire::notify_header));
}

EPCOMM_HD inline void fail_with(report& r, failure code, int peer) {
  r.code = code;
  r.peer = peer;
}

// Judges the R notify slots this rank received for call `epoch`. On success
// r.code stays none; otherwise r says what is wrong and with whom.
EPCOMM_HD inline void judge_notify(const std::byte* region, std::size_t slot_bytes, int world,
                                   int rank, std::uint64_t epoch, int max_recv_tokens, report& r) {
  for (int s = 0; s < world; ++s) {
    const wire::notify_header& h = *notify_header_at(region, slot_bytes, s);
    if (h.magic != wire::magic || h.epoch != epoch) {
      fail_with(r, failure::notify_mismatch, s);
      r.expected = static_cast<std::int64_t>(epoch);
      r.seen = static_cast<std::int64_t>(h.epoch);
      return;
    }
    if (h.state != wire::status::ok) {
      fail_with(r, s == rank ? failure::invalid_input : failure::peer_invalid_input,
                s == rank ? no_peer : s);
      cause_text(r.cause, wire::cause_bytes) << h.cause;
      return;
    }
  }
  const wire::notify_header& ref = *notify_header_at(region, slot_bytes, 0);
  for (int s = 1; s < world; ++s) {
    const wire::notify_header& h = *notify_header_at(region, slot_bytes, s);
    const std::int32_t there[] = {h.hidden, h.topk, h.token_id, h.num_experts};
    const std::int32_t on0[] = {ref.hidden, ref.topk, ref.token_id, ref.num_experts};
    for (int f = 0; f < 4; ++f) {
      if (there[f] != on0[f]) {
        fail_with(r, failure::disagreement, s);
        r.field = static_cast<header_field>(f);
        r.seen = there[f];
        r.expected = on0[f];
        return;
      }
    }
  }
  for (int dst = 0; dst < world; ++dst) {
    long long total = 0;
    for (int s = 0; s < world; ++s) total += notify_counts_at(region, slot_bytes, s)[dst];
    const int bound = notify_header_at(region, slot_bytes, dst)->recv_bound;
    if (total > max_recv_tokens || (bound > 0 && total > bound)) {
      const bool capacity = total > max_recv_tokens;
      fail_with(r, capacity ? failure::over_capacity : failure::over_bound, dst);
      r.seen = total;
      r.expected = capacity ? max_recv_tokens : bound;
      return;
    }
  }
}

// counts[s * R + r] = tokens rank s sends to rank r, from the R notify slots;
// only meaningful once judge_notify accepted them.
EPCOMM_HD inline void gather_count_matrix(const std::byte* region, std::size_t slot_bytes,
                                          int world, std::int32_t* counts) {
  for (int s = 0; s < world; ++s) {
    const std::int32_t* c = notify_counts_at(region, slot_bytes, s);
    for (int r = 0; r < world; ++r) counts[s * world + r] = c[r];
  }
}

// Judges the R combine headers this rank received for combine call `epoch`.
EPCOMM_HD inline void judge_combine(const std::byte* region, std::size_t slot_bytes, int world,
                                    int rank, std::uint64_t epoch, report& r) {
  for (int s = 0; s < world; ++s) {
    const auto& h = *reinterpret_cast<const wire::combine_header*>(region + slot_bytes * s);
    if (h.epoch != epoch) {
      fail_with(r, failure::combine_mismatch, s);
      r.expected = static_cast<std::int64_t>(epoch);
      r.seen = static_cast<std::int64_t>(h.epoch);
      return;
    }
    if (h.state != wire::status::ok) {
      fail_with(r, s == rank ? failure::invalid_input : failure::peer_invalid_input,
                s == rank ? no_peer : s);
      cause_text(r.cause, wire::cause_bytes) << h.cause;
      return;
    }
  }
  const auto* first = reinterpret_cast<const wire::combine_header*>(region);
  for (int s = 1; s < world; ++s) {
    const auto& h = *reinterpret_cast<const wire::combine_header*>(region + slot_bytes * s);
    if (h.with_weights != first->with_weights) {
      fail_with(r, failure::weights_mismatch, s);
      return;
    }
  }
}

}  // namespace epcomm::cuda
