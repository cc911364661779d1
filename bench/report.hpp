// Results of a run: one record per (transport, mode, op, workload), printed as a table, written
// as JSON and drawn as bandwidth against tokens.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "options.hpp"
#include "timing.hpp"

namespace epcomm::bench {

struct record {
  std::string transport;
  std::string mode;
  std::string op;
  int ranks = 0;
  workload shape;
  double bytes = 0;  // the most any rank sends (each token once per destination rank)
  summary epcomm;
  summary baseline;
  summary peer_copy;
  double bound_us = 0;  // the physical bound (memory_bound.hpp)

  // Algorithmic bandwidth, GB/s per rank: bytes over the median time.
  double gbps(const summary& s) const { return s.median_us > 0 ? bytes / s.median_us / 1e3 : 0; }
  double speedup_vs_baseline() const { return baseline.median_us / epcomm.median_us; }
  double fraction_of_peer_copy() const { return peer_copy.median_us / epcomm.median_us; }
  double fraction_of_bound() const { return bound_us / epcomm.median_us; }
  // At most 1 unless the bandwidth measurement is wrong for this op (its bytes stayed in cache):
  // even the fastest timed call may not beat the bound.
  bool bound_holds() const { return bound_us <= epcomm.min_us; }
};

// `bandwidth`: copy_bandwidth's bytes per second, which the bound divides by.
void print_header(std::FILE* out, const options& opt, int ranks, double bandwidth);
void print_row(std::FILE* out, const record& r);

// Throws std::runtime_error when the file cannot be written.
void write_json(const std::string& path, const std::vector<record>& records, const options& opt,
                int ranks, double bandwidth);

// Bandwidth against tokens for epcomm, baseline, per-peer copy and bound, one panel per op, one
// line set per (transport, mode); records of the first dtype at the reference hidden size. Runs
// gnuplot; throws std::runtime_error when it fails or there is nothing to draw.
void write_plot(const std::string& path, const std::vector<record>& records, const options& opt);

}  // namespace epcomm::bench
