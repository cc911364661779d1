// epcomm_gpu_check: the program bench/gpu/check.sh runs on a machine with a
// GPU. Ranks are forked processes (launch_local) that share the machine's
// GPUs, several per GPU when there are fewer GPUs than ranks; they reach each
// other through the nvlink_ipc transport (CUDA IPC).
//
//   1. roofline     device-to-device copy bandwidth of the GPU;
//   2. correctness  every scenario of correctness.hpp, for bf16, fp8 and fp32
//                   tokens on each rank count, against the test suite's
//                   reference and the host engine, plus bad input; the three
//                   types on one buffer (mixed_types.hpp);
//   3. failure      a rank that never arrives (rank counts >= 2);
//   4. timing       dispatch and combine with CUDA events, against the
//                   roofline and the NCCL baseline;
//   5. low latency  correctness (ll_correctness.hpp, bf16 and fp8 wire,
//                   against the reference and the host low-latency engine;
//                   both wires on one buffer, ll_wires.hpp),
//                   the absent peer, and the timing of each phase;
//   6. gpu-fed proxy  kernels that drive libfabric and UCX through the proxy
//                   ring (proxy_check.hpp), and both modes' kernels over them
//                   (quick scenarios), when those transports were built.
//
// Prints one table and exits non-zero if anything failed. The parent process
// never touches CUDA: a process that forks after initialising CUDA leaves its
// children unable to use it.
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "correctness.hpp"
#include "epcomm/bootstrap/local.hpp"
#include "ll_correctness.hpp"
#include "ll_timing.hpp"
#include "ll_wires.hpp"
#include "mixed_types.hpp"
#include "timing.hpp"
#if defined(EPCOMM_GPU_PROXY_LIBFABRIC) || defined(EPCOMM_GPU_PROXY_UCX)
#include "proxy_check.hpp"
#endif
#if defined(EPCOMM_GPU_PROXY_LIBFABRIC)
#include "epcomm/libfabric/transport.hpp"
#endif
#if defined(EPCOMM_GPU_PROXY_UCX)
#include "epcomm/ucx/transport.hpp"
#endif

namespace {

using namespace epcomm;
using namespace epcomm::gpu_check;

struct options {
  std::vector<int> ranks{1, 2, 4};
  timing_options timing;
  int timing_tokens = 4096;
  bool quick = false;
  bool run_timing = true;
  bool normal = true;       // normal-mode sections
  bool low_latency = true;  // low-latency sections
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "epcomm_gpu_check: %s\n"
               "usage: epcomm_gpu_check [--ranks 1,2,4] [--iterations N>=20] [--warmup N]\n"
               "                        [--tokens T] [--quick] [--no-timing] [--no-nccl]\n"
               "                        [--no-ll | --ll-only]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage("missing value");
      return argv[++i];
    };
    if (a == "--ranks") {
      o.ranks.clear();
      std::string list = value();
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        const int r = std::atoi(list.substr(at, comma - at).c_str());
        if (r < 1 || r > 8) usage("--ranks takes counts in [1, 8]");
        o.ranks.push_back(r);
        at = comma + 1;
      }
    } else if (a == "--iterations") {
      o.timing.iterations = std::atoi(value());
      if (o.timing.iterations < 20) usage("--iterations must be >= 20 (medians of fewer mislead)");
    } else if (a == "--warmup") {
      o.timing.warmup = std::atoi(value());
      if (o.timing.warmup < 1) usage("--warmup must be >= 1");
    } else if (a == "--tokens") {
      o.timing_tokens = std::atoi(value());
      if (o.timing_tokens < 1) usage("--tokens must be >= 1");
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--no-timing") {
      o.run_timing = false;
    } else if (a == "--no-nccl") {
      o.timing.nccl = false;
    } else if (a == "--no-ll") {
      o.low_latency = false;
    } else if (a == "--ll-only") {
      o.normal = false;
    } else {
      usage(("unknown argument " + std::string(a)).c_str());
    }
  }
  return o;
}

// Runs fn on `world` forked ranks; true when every rank exited 0.
bool run(const std::string& what, int world, const std::function<int(local_bootstrap&)>& fn) {
  local_launch_options lo;
  lo.timeout = std::chrono::minutes(5);
  const auto start = steady::now();
  const auto codes = launch_local(world, fn, lo);
  bool ok = true;
  std::string detail;
  for (int c : codes) {
    ok = ok && c == 0;
    // Two appends, not " " + to_string(c): g++ 12 at -O3 warns (-Wrestrict)
    // on the temporary, and Release builds use -Werror.
    detail += ' ';
    detail += std::to_string(c);
  }
  const double s = std::chrono::duration<double>(steady::now() - start).count();
  std::printf("%-4s %-44s %2d ranks %7.1f s%s\n", ok ? "ok" : "FAIL", what.c_str(), world, s,
              ok ? "" : (" exit codes:" + detail).c_str());
  std::fflush(stdout);
  return ok;
}

#if defined(EPCOMM_GPU_PROXY_LIBFABRIC) || defined(EPCOMM_GPU_PROXY_UCX)
// One rank's GPU-fed proxy check, its failure explained on stderr.
int proxy_rank(local_bootstrap& b, proxy_check_outcome (*check)(local_bootstrap&)) {
  const proxy_check_outcome out = check(b);
  if (out.code != 0) std::fprintf(stderr, "rank %d: %s\n", b.rank(), out.text.c_str());
  return out.code;
}
#endif

void print_table(const shared_results& r) {
  const double bw = r.copy_bytes_per_s;
  std::printf("\nepcomm on %s; roofline: device-to-device copy at %.0f GB/s\n", r.device, bw / 1e9);
  std::printf(
      "times: median over ranks' medians, the slowest rank; roofline%% = (bytes moved on the "
      "busiest GPU / copy bandwidth) / epcomm time\n");
  std::printf("%-34s %5s %4s | %8s %9s %9s %9s %7s | %8s %9s %9s %9s %7s\n", "case", "ranks",
              "GPUs", "disp MB", "epcomm us", "roofline%", "nccl us", "x nccl", "comb MB",
              "epcomm us", "roofline%", "nccl us", "x nccl");
  for (int i = 0; i < r.rows; ++i) {
    const timing_row& t = r.row[i];
    auto part = [&](double bytes, double us, double nccl_us) {
      const double roof_us = bytes / bw * 1e6;
      std::printf(" %8.1f %9.1f %8.1f%% ", bytes / 1e6, us, 100.0 * roof_us / us);
      if (nccl_us > 0)
        std::printf("%9.1f %6.2fx |", nccl_us, nccl_us / us);
      else
        std::printf("%9s %7s |", "-", "-");
    };
    std::printf("%-34s %5d %4d |", t.label, t.world, t.gpus);
    part(t.dispatch_bytes, t.epcomm_dispatch_us, t.nccl_dispatch_us);
    part(t.combine_bytes, t.epcomm_combine_us, t.nccl_combine_us);
    std::printf("%s%s\n", t.nccl_dispatch_us < 0 ? " nccl: " : "",
                t.nccl_dispatch_us < 0 ? t.nccl_note : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const options opt = parse(argc, argv);
  auto* shared = static_cast<shared_results*>(mmap(
      nullptr, sizeof(shared_results), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  std::memset(shared, 0, sizeof *shared);
  auto* ll_shared = static_cast<ll_shared_results*>(mmap(nullptr, sizeof(ll_shared_results),
                                                         PROT_READ | PROT_WRITE,
                                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (ll_shared == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  std::memset(ll_shared, 0, sizeof *ll_shared);
  int failures = 0;
  auto check = [&](bool ok) { failures += ok ? 0 : 1; };

  if (!run("copy roofline", 1,
           [&](local_bootstrap& b) { return measure_copy(b, shared, opt.timing); })) {
    std::printf("\nFAIL: no usable GPU (see the rank's error above); nothing else was run\n");
    return 1;
  }
  for (int world : opt.ranks) {
    if (!opt.normal) break;
    check(run("correctness bf16", world,
              [&](local_bootstrap& b) { return check_rank<bf16>(b, opt.quick); }));
    check(run("correctness fp8_e4m3", world,
              [&](local_bootstrap& b) { return check_rank<fp8_e4m3>(b, opt.quick); }));
    check(run("correctness fp32", world,
              [&](local_bootstrap& b) { return check_rank<float>(b, opt.quick); }));
    check(run("bf16, fp8 and fp32 on one buffer", world, check_mixed_types_rank<>));
    if (world < 2) continue;
    check(run("absent peer: deadline, then the abort relay", world, check_absent_peer<>));
    check(run("exited peer: the exit watch", world,
              check_absent_peer<nvlink_ipc::transport, absence::exited>));
  }
  for (int world : opt.ranks) {
    if (!opt.low_latency) break;
    check(run("low-latency correctness bf16", world,
              [&](local_bootstrap& b) { return check_ll_rank<bf16>(b, opt.quick); }));
    check(run("low-latency correctness fp8_e4m3", world,
              [&](local_bootstrap& b) { return check_ll_rank<fp8_e4m3>(b, opt.quick); }));
    check(run("low-latency bf16 and fp8 on one buffer", world, check_ll_wires_rank<>));
    if (world < 2) continue;
    check(run("low-latency absent peer: deadline, then the abort relay", world,
              check_ll_absent_peer<>));
    check(run("low-latency exited peer: the exit watch", world,
              check_ll_absent_peer<nvlink_ipc::transport, absence::exited>));
    for (const ll_loss how : {ll_loss::after_a_call, ll_loss::at_dispatch, ll_loss::before_combine})
      check(run("low-latency mask_lost_ranks: a rank leaves", world,
                [how](local_bootstrap& b) { return check_ll_lost_rank<>(b, how); }));
  }
  // Between nodes: the same kernels through the GPU-fed proxy, both modes
  // (their quick scenarios), on loopback unless FI_PROVIDER / UCX_TLS say
  // otherwise; on the first rank count >= 2 only, to stay in the budget.
  for (int world : opt.ranks) {
    if (world < 2) continue;
#if defined(EPCOMM_GPU_PROXY_LIBFABRIC) || defined(EPCOMM_GPU_PROXY_UCX)
    default_to_loopback();
#endif
#if defined(EPCOMM_GPU_PROXY_LIBFABRIC)
    using fabric = libfabric::transport;
    if (opt.normal) {
      check(run("normal over libfabric bf16", world,
                [&](local_bootstrap& b) { return check_rank<bf16, fabric>(b, true); }));
      check(run("normal over libfabric fp8_e4m3", world,
                [&](local_bootstrap& b) { return check_rank<fp8_e4m3, fabric>(b, true); }));
      check(run("normal over libfabric: absent peer", world, check_absent_peer<fabric>));
      check(run("normal over libfabric: bf16, fp8 and fp32 on one buffer", world,
                check_mixed_types_rank<fabric>));
    }
    if (opt.low_latency) {
      check(run("low-latency over libfabric bf16", world,
                [&](local_bootstrap& b) { return check_ll_rank<bf16, fabric>(b, true); }));
      check(run("low-latency over libfabric fp8_e4m3", world,
                [&](local_bootstrap& b) { return check_ll_rank<fp8_e4m3, fabric>(b, true); }));
      check(run("low-latency over libfabric: absent peer", world, check_ll_absent_peer<fabric>));
      check(run("low-latency over libfabric: mask_lost_ranks", world, [](local_bootstrap& b) {
        return check_ll_lost_rank<fabric>(b, ll_loss::at_dispatch);
      }));
      check(run("low-latency over libfabric: bf16 and fp8 on one buffer", world,
                check_ll_wires_rank<fabric>));
    }
#endif
#if defined(EPCOMM_GPU_PROXY_UCX)
    if (opt.normal)
      check(run("normal over ucx bf16", world,
                [&](local_bootstrap& b) { return check_rank<bf16, ucx::transport>(b, true); }));
    if (opt.low_latency)
      check(run("low-latency over ucx bf16", world,
                [&](local_bootstrap& b) { return check_ll_rank<bf16, ucx::transport>(b, true); }));
#endif
    break;
  }

  for (int world : opt.ranks) {
    if (!opt.normal || world < 2) continue;
#if defined(EPCOMM_GPU_PROXY_LIBFABRIC)
    check(run("gpu-fed proxy over libfabric", world,
              [](local_bootstrap& b) { return proxy_rank(b, gpu_fed_exchange_libfabric); }));
#endif
#if defined(EPCOMM_GPU_PROXY_UCX)
    check(run("gpu-fed proxy over ucx", world,
              [](local_bootstrap& b) { return proxy_rank(b, gpu_fed_exchange_ucx); }));
#endif
  }

  if (opt.run_timing && opt.normal) {
    for (int world : opt.ranks) {
      const timing_case tc{world, opt.timing_tokens, 7168, 8, 64};
      auto add = [&](const char* what, auto fn) {
        if (shared->rows == static_cast<int>(std::size(shared->row))) return;
        timing_row* row = &shared->row[shared->rows];
        const bool ok = run(what, world, [&](local_bootstrap& b) { return fn(b, row); });
        check(ok);
        if (ok) {
          check(row->valid != 0);
          if (!row->valid) std::printf("FAIL %s: timed results were wrong\n", row->label);
          ++shared->rows;
        }
      };
      add("timing bf16", [&](local_bootstrap& b, timing_row* row) {
        return time_rank<bf16>(b, tc, opt.timing, row);
      });
      add("timing fp8_e4m3", [&](local_bootstrap& b, timing_row* row) {
        return time_rank<fp8_e4m3>(b, tc, opt.timing, row);
      });
    }
    print_table(*shared);
  }
  if (opt.run_timing && opt.low_latency) {
    for (int world : opt.ranks) {
      // DeepEP's low-latency test shape; 64 experts divide every rank count.
      const ll_timing_case tc{world, 128, 7168, 8, 64};
      auto add = [&](const char* what, auto fn) {
        if (ll_shared->rows == static_cast<int>(std::size(ll_shared->row))) return;
        ll_timing_row* row = &ll_shared->row[ll_shared->rows];
        const bool ok = run(what, world, [&](local_bootstrap& b) { return fn(b, row); });
        check(ok);
        if (ok) {
          check(row->valid != 0);
          if (!row->valid) std::printf("FAIL %s: timed results were wrong\n", row->label);
          ++ll_shared->rows;
        }
      };
      add("low-latency timing bf16", [&](local_bootstrap& b, ll_timing_row* row) {
        return time_ll_rank<bf16>(b, tc, opt.timing, row);
      });
      add("low-latency timing fp8_e4m3", [&](local_bootstrap& b, ll_timing_row* row) {
        return time_ll_rank<fp8_e4m3>(b, tc, opt.timing, row);
      });
    }
    print_ll_table(*ll_shared, shared->copy_bytes_per_s);
  }
  std::printf("\n%s: %d failure(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  munmap(shared, sizeof(shared_results));
  munmap(ll_shared, sizeof(ll_shared_results));
  return failures == 0 ? 0 : 1;
}
