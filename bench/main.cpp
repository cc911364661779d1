// epcomm-bench: dispatch, combine and the pair for every built-in transport and mode, against
// an MPI_Alltoallv baseline, a per-peer copy over the raw link and the host's physical bound,
// all in one run of one set of processes. Start it with mpirun; see docs/performance.md.
#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <span>
#include <string_view>
#include <vector>

#include "driver.hpp"
#include "memory_bound.hpp"

namespace {

// MPI collectives cannot time out, so one stuck rank would hold the others forever: the whole
// run is bounded instead. A rank that exits makes mpirun end the job.
extern "C" void on_timeout(int) {
  static const char message[] = "epcomm-bench: --timeout-s expired; exiting with status 124\n";
  (void)!write(STDERR_FILENO, message, sizeof message - 1);
  _exit(124);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace epcomm::bench;
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  options opt;
  try {
    opt = parse_options(std::span<char* const>(argv, static_cast<std::size_t>(argc)));
    check_options(opt, ranks);
  } catch (const usage_error& e) {
    const bool help = std::string_view(e.what()).empty();
    if (rank == 0)
      std::fprintf(help ? stdout : stderr, "%s%s%s", e.what(), help ? "" : "\n", usage().c_str());
    MPI_Finalize();
    return help ? 0 : 2;
  }
  std::signal(SIGALRM, on_timeout);
  alarm(static_cast<unsigned>(opt.timeout_s));

  int status = 0;
  std::vector<record> records;
  double bandwidth = 0;
  try {
    epcomm::mpi_bootstrap boot(MPI_COMM_WORLD);
    bandwidth = copy_bandwidth(MPI_COMM_WORLD, static_cast<std::size_t>(opt.copy_mib) << 20);
    if (rank == 0) print_header(stdout, opt, ranks, bandwidth);
    run_context ctx{boot, MPI_COMM_WORLD, opt, records, rank == 0, bandwidth};
    run_all(ctx);
  } catch (const verification_failure& e) {
    // Every rank throws this together, after the same collective.
    if (rank == 0) std::fprintf(stderr, "epcomm-bench: FAILED: %s\n", e.what());
    status = 1;
  } catch (const std::exception& e) {
    // One rank's failure (a transport error, no memory): the others may be inside a collective.
    std::fprintf(stderr, "epcomm-bench: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  if (status == 0 && rank == 0) {
    std::printf(
        "epcomm-bench: %zu records; every workload verified: epcomm's dispatch and "
        "combine results equal the baseline's\n",
        records.size());
    try {
      if (!opt.json_path.empty()) write_json(opt.json_path, records, opt, ranks, bandwidth);
      if (!opt.plot_path.empty()) write_plot(opt.plot_path, records, opt);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "epcomm-bench: %s\n", e.what());
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
