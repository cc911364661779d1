// Runs every selected (transport, mode, workload): builds the case, checks epcomm against the
// baseline, then times the three contenders of each op in one interleaved loop.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "epcomm/bootstrap/mpi.hpp"
#include "options.hpp"
#include "registry.hpp"
#include "report.hpp"

namespace epcomm::bench {

// A mismatch between epcomm and the baseline: nothing about that case was timed.
struct verification_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Verifies `c` on every rank, then times it; returns one record per op (filled in but for the
// labels in `label`), its bound at `bandwidth` (copy_bandwidth). Throws verification_failure on
// every rank when any rank's check fails.
std::vector<record> measure(bench_case& c, const record& label, const options& opt, MPI_Comm comm,
                            double bandwidth);

struct run_context {
  mpi_bootstrap& boot;
  MPI_Comm comm;
  const options& opt;
  std::vector<record>& records;
  bool print;        // this rank prints the table
  double bandwidth;  // copy_bandwidth, measured once per run
};

template <class Transport, class Mode, class Token>
void run_workload(run_context& ctx, const workload& w) {
  record label;
  label.transport = transport_name<Transport>;
  label.mode = Mode::name;
  label.ranks = ctx.boot.world_size();
  label.shape = w;
  typename Mode::template case_type<Transport, Token> c(ctx.boot, ctx.comm, w);
  for (record& r : measure(c, label, ctx.opt, ctx.comm, ctx.bandwidth)) {
    if (ctx.print) print_row(stdout, r);
    ctx.records.push_back(std::move(r));
  }
}

// A dtype the mode does not carry over this transport (fp32 in low-latency mode) is skipped,
// with a note.
template <class Transport, class Mode, class Token>
void run_if_supported(run_context& ctx, const workload& w) {
  if constexpr (Mode::template supports<Transport, Token>) {
    run_workload<Transport, Mode, Token>(ctx, w);
  } else if (ctx.print) {
    std::printf("# %s/%s: %s is not supported by this mode over this transport; skipped\n",
                transport_name<Transport>, Mode::name, name(w.type));
  }
}

template <class Transport, class Mode>
void run_mode(run_context& ctx) {
  const auto& sweep = Mode::sweep_tokens;
  for (const workload& w : expand(ctx.opt, ctx.boot.world_size(), Mode::default_tokens, sweep)) {
    switch (w.type) {
      case dtype::bf16:
        run_if_supported<Transport, Mode, bf16>(ctx, w);
        break;
      case dtype::fp8_e4m3:
        run_if_supported<Transport, Mode, fp8_e4m3>(ctx, w);
        break;
      case dtype::fp32:
        run_if_supported<Transport, Mode, float>(ctx, w);
        break;
    }
  }
}

// Whether `name` is among the names given on the command line (all when none were given).
bool selected(const std::vector<std::string>& wanted, const char* name);

// Every registered transport and mode the options select.
inline void run_all(run_context& ctx) {
  for_each_type(transports{}, [&]<class T>(std::type_identity<T>) {
    if (!selected(ctx.opt.transports, transport_name<T>)) return;
    for_each_type(modes{}, [&]<class M>(std::type_identity<M>) {
      if (selected(ctx.opt.modes, M::name)) run_mode<T, M>(ctx);
    });
  });
}

// Throws usage_error unless every name given to --transport and --mode is built in and every
// selected mode can run its workloads on `ranks` ranks, so that a bad command line fails before
// anything runs.
void check_options(const options& opt, int ranks);

}  // namespace epcomm::bench
