// The words for a rejected input, written once for the host engines and the
// CUDA kernels, so that a rank reports a given mistake identically whichever
// producer found it. Kernels have neither allocation nor printf into memory:
// each text is written into a fixed char array (cause_text), and the host
// wraps the same function into a std::string (input_error_text).
#pragma once

#include <string>
#include <type_traits>

#include "epcomm/core/config.hpp"

namespace epcomm {

// Appends text and integers into a fixed char array, always NUL-terminated and
// silently truncated.
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

// Entry `index` of topk_idx[T][topk] names an expert outside [-1, E).
EPCOMM_HD inline void describe_invalid_expert(char* out, int capacity, long long index, int topk,
                                              long long expert, int num_experts) {
  cause_text(out, capacity) << "topk_idx[" << index / topk << "][" << index % topk
                            << "] = " << expert << " is outside [-1, "
                            << static_cast<long long>(num_experts) << ")";
}

// Low-latency mode: a routing that names one expert more often than its
// region has slots (only possible when a token names it twice).
EPCOMM_HD inline void describe_expert_overflow(char* out, int capacity, long long expert,
                                               int max_tokens_per_rank) {
  cause_text(out, capacity) << "expert " << expert << " is named more than max_tokens_per_rank ("
                            << static_cast<long long>(max_tokens_per_rank)
                            << ") times: a token that names an expert twice takes two of its slots";
}

// Normal-mode combine: a y of `y_elements` holds fewer than the received rows.
EPCOMM_HD inline void describe_short_y(char* out, int capacity, long long y_elements,
                                       long long hidden, long long num_recv_tokens) {
  cause_text(out, capacity) << "y holds " << y_elements
                            << " elements, expected N*H with N >= " << num_recv_tokens
                            << " rows of " << hidden;
}

// fp8 rows carry one scale per 128 channels: a hidden that is no multiple of it.
EPCOMM_HD inline void describe_unscaled_hidden(char* out, int capacity, long long hidden) {
  cause_text(out, capacity) << "hidden " << hidden << " is not a multiple of 128 (fp8 scales)";
}

// Normal mode: a dispatch handle of another rank or group than the caller's
// (combine, or a dispatch from a cached handle).
EPCOMM_HD inline void describe_foreign_handle(char* out, int capacity, long long handle_rank,
                                              long long handle_world) {
  cause_text(out, capacity) << "handle belongs to rank " << handle_rank << " of a world of "
                            << handle_world;
}

// Normal mode: a handle whose fields no dispatch of this buffer could have
// returned (a handle is plain data a caller can alter).
EPCOMM_HD inline void describe_malformed_handle(char* out, int capacity) {
  cause_text(out, capacity) << "handle is malformed (not one this buffer's dispatch returned)";
}

// An argument holding `held` values where the call's shape needs
// `expected`: "x holds 10 elements, expected T*H = 12".
EPCOMM_HD inline void describe_wrong_size(char* out, int capacity, const char* what, long long held,
                                          const char* unit, const char* shape, long long expected) {
  cause_text(out, capacity) << what << " holds " << held << " " << unit << ", expected " << shape
                            << " = " << expected;
}

// One of the describe_* texts as a std::string, for the host engines; room
// for every text above with the longest integers, so nothing is truncated.
template <class... Args>
std::string input_error_text(void (*describe)(char*, int, Args...),
                             std::type_identity_t<Args>... args) {
  char out[256];
  describe(out, static_cast<int>(sizeof out), args...);
  return out;
}

}  // namespace epcomm
