// What epcomm-bench is asked to measure: its command line, parsed into options, and the
// workloads (per-rank problem shapes) those options expand to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace epcomm::bench {

enum class dtype { bf16, fp8_e4m3, fp32 };

const char* name(dtype t);

// The problem every rank runs: `tokens` tokens of `hidden` channels, each routed to `topk` of
// `experts` experts.
struct workload {
  int tokens = 0;
  int hidden = 0;
  int experts = 0;
  int topk = 0;
  dtype type = dtype::bf16;
  // Expert e is picked with weight (e + 1)^-skew: 0 is uniform; larger values load the low
  // experts, hence the low ranks, more.
  double skew = 0.0;
  std::uint64_t seed = 1;
  // Normal mode's byte budget (buffer_config::max_buffer_bytes); 0: whole calls.
  std::size_t max_buffer_bytes = 0;
};

struct options {
  std::optional<int> tokens;  // unset: each mode's own default (see modes.hpp)
  int hidden = 7168;          // DeepEP's reference shape: hidden 7168, top-8 of 64 experts
  int experts = 64;
  int topk = 8;
  std::vector<dtype> dtypes{dtype::bf16};
  double skew = 0.0;
  std::uint64_t seed = 1;
  bool sweep = false;  // tokens and hidden over each mode's scaling ranges
  bool quick = false;
  int iterations = 20;  // timed iterations per (workload, op, contender); at least 20
  int warmup = 3;
  std::vector<std::string> transports;  // empty: every registered transport
  std::vector<std::string> modes;       // empty: every registered mode
  std::string json_path;
  std::string plot_path;
  int timeout_s = 3600;  // the whole run; a rank still running then exits with 124
  int copy_mib = 256;    // what each rank copies to measure the bound's bandwidth
  std::size_t max_buffer_bytes = 0;
  std::string command_line;
};

// A command line that cannot be run; what() says why.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws usage_error.
options parse_options(std::span<char* const> args);

std::string usage();

// The workloads to run for a mode whose default token count is `default_tokens` and whose
// --sweep token counts are `sweep_tokens`: the reference shape (or the command line's), or the
// sweep (every token count at the reference hidden, then every sweep hidden at the reference
// token count), each for every dtype. Throws usage_error for a shape that `ranks` ranks cannot
// run.
std::vector<workload> expand(const options& opt, int ranks, int default_tokens,
                             std::span<const int> sweep_tokens);

}  // namespace epcomm::bench
