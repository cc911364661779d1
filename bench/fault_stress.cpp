// epcomm-fault-stress: the fault matrix (tests/support/fault_cell.hpp) run many times per
// fabric, counting what must never happen when a rank is lost: a survivor that crashes or hangs,
// names the wrong culprit, waits out its deadline for a peer that is already gone, never
// notices, or cannot re-form a group; and /dev/shm entries left once every process of the cell
// has ended. Not a test and not timed: it prints one row per (fabric, ranks, mode, fault) with
// the counts (docs/reliability.md keeps them) and exits 1 when any count is nonzero.
//
//   epcomm-fault-stress [--runs N] [--fabric LIST] [--ranks LIST] [--action LIST] [--point LIST]
//
// The victim is rank 1; its fault fires in its second call pair. Fabrics are bound to loopback.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "epcomm/shm/transport.hpp"
#include "support/fault_cell.hpp"
#ifdef EPCOMM_BENCH_WITH_LIBFABRIC
#include "epcomm/libfabric/transport.hpp"
#endif
#ifdef EPCOMM_BENCH_WITH_UCX
#include "epcomm/ucx/transport.hpp"
#endif

namespace {

using namespace epcomm;
using namespace epcomm::test::faults;

// A fabric: a transport type and the environment that picks its provider.
struct fabric {
  std::string name;
  std::vector<std::pair<std::string, std::string>> env;
  std::function<std::vector<int>(fault::action, fault::point, int, const timing&, shared_reports&)>
      run;
};

template <class Transport>
std::vector<int> run_group(fault::action what, fault::point at, int world, const timing& tm,
                           shared_reports& reports) {
  const std::string spec = fault_spec(what, at, tm);
  return launch_local(world,
                      [&](local_bootstrap& boot) {
                        setenv("EPCOMM_FAULT", spec.c_str(), 1);
                        return run_rank<Transport>(boot, what, at, tm, reports[boot.rank()]);
                      },
                      {std::chrono::seconds(60) + 2 * setup_timeout});
}

std::vector<fabric> all_fabrics() {
  std::vector<fabric> f;
  f.push_back({"shm", {}, run_group<shm::transport>});
#ifdef EPCOMM_BENCH_WITH_LIBFABRIC
  f.push_back({"libfabric-tcp",
               {{"FI_PROVIDER", "tcp;ofi_rxm"}, {"FI_TCP_IFACE", "lo"}},
               run_group<libfabric::transport>});
  f.push_back({"libfabric-shm", {{"FI_PROVIDER", "shm"}}, run_group<libfabric::transport>});
#endif
#ifdef EPCOMM_BENCH_WITH_UCX
  f.push_back(
      {"ucx-tcp", {{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", "lo"}}, run_group<ucx::transport>});
  f.push_back({"ucx-sm", {{"UCX_TLS", "sm"}}, run_group<ucx::transport>});
#endif
  return f;
}

// What went wrong in the runs of one row; every field should stay 0.
struct tally {
  int runs = 0;
  int survivors = 0;
  int crashed = 0;              // a survivor died by a signal, threw past run_rank, or hung
  int unnoticed = 0;            // a survivor's calls all returned
  int wrong_culprit = 0;        // its error named another rank than the victim
  int deadline_waits = 0;       // it waited out its deadline although the victim exited or dropped
  int regroup_failed = 0;       // the survivors' new group failed or computed wrong results
  int leftovers = 0;            // /dev/shm entries left by the cell
  std::int64_t slowest_ms = 0;  // the latest a survivor got its error
  std::set<std::string> crashes;  // how survivors crashed (exit statuses)

  int bad() const {
    return crashed + unnoticed + wrong_culprit + deadline_waits + regroup_failed + leftovers;
  }
};

std::set<std::string> shm_entries() {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    names.insert(e.path().filename().string());
  return names;
}

// One cell: the group runs, each survivor's outcome is classified, and what it left in /dev/shm
// is counted. Not removed: a name alone does not say whose an entry is, and another job's
// segments must not vanish under it (run the target alone, so that nothing else adds entries).
void run_cell(const fabric& f, fault::action what, fault::point at, int world, const timing& tm,
              tally& t) {
  const auto before = shm_entries();
  shared_reports reports;
  const std::vector<int> codes = f.run(what, at, world, tm, reports);
  ++t.runs;
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    ++t.survivors;
    const report& rep = reports[r];
    const int code = codes[r];
    if (code == no_error) {
      ++t.unnoticed;
      continue;
    }
    if (code == regroup_failed || code == wrong_result) ++t.regroup_failed;
    if (code != ok && code != regroup_failed && code != wrong_result && code != leaked) {
      ++t.crashed;
      t.crashes.insert(std::to_string(code));
      continue;
    }
    const std::string text = rep.what;
    const bool wrong = rep.peer != victim;
    const bool waited =
        what != fault::action::stall && text.find("deadline expired") != std::string::npos;
    t.wrong_culprit += wrong;
    t.deadline_waits += waited;
    if (wrong || waited)
      std::fprintf(stderr, "%s %s @ %s, %d ranks: rank %d: %s\n", f.name.c_str(), fault::name(what),
                   fault::name(at), world, r, text.c_str());
    t.slowest_ms = std::max<std::int64_t>(t.slowest_ms, rep.took_us / 1000);
  }
  for (const auto& name : shm_entries())
    if (!before.contains(name)) {
      ++t.leftovers;
      std::fprintf(stderr, "%s %s @ %s, %d ranks: left /dev/shm/%s\n", f.name.c_str(),
                   fault::name(what), fault::name(at), world, name.c_str());
    }
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "epcomm-fault-stress: %s\n"
               "usage: epcomm-fault-stress [--runs N] [--fabric LIST] [--ranks LIST] "
               "[--action LIST] [--point LIST]\n"
               "  fabrics: every one built in by default (shm, libfabric-tcp, libfabric-shm,\n"
               "           ucx-tcp, ucx-sm); ranks 3..%d (default 3,4); actions exit, stall,\n"
               "           drop; points before_notify, mid_dispatch, mid_combine, low_latency\n",
               why.c_str(), max_world);
  std::exit(2);
}

// The enumerators a comma-separated list names, in its order.
template <class Enum, std::size_t N>
std::vector<Enum> parse_names(const std::string& list, const enum_names<Enum, N>& names,
                              const std::string& what) {
  std::vector<Enum> out;
  for (const auto& name : split(list)) {
    const auto e = names.parse(name);
    if (!e) usage("unknown " + what + " '" + name + "'");
    out.push_back(*e);
  }
  return out;
}

struct options {
  int runs = 1;
  std::vector<std::string> fabrics;
  std::vector<int> ranks = {3, 4};
  std::vector<fault::action> actions = every_action;
  std::vector<fault::point> points = every_point;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--runs") {
      o.runs = std::atoi(value.c_str());
      if (o.runs < 1) usage("--runs must be >= 1");
    } else if (arg == "--fabric") {
      o.fabrics = split(value);
    } else if (arg == "--ranks") {
      o.ranks.clear();
      for (const auto& r : split(value)) {
        const int n = std::atoi(r.c_str());
        if (n < 3 || n > max_world) usage("ranks must be within 3.." + std::to_string(max_world));
        o.ranks.push_back(n);
      }
    } else if (arg == "--action") {
      o.actions = parse_names(value, fault::action_names, "action");
    } else if (arg == "--point") {
      o.points = parse_names(value, fault::point_names, "point");
    } else {
      usage("unknown option " + arg);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  std::vector<fabric> fabrics = all_fabrics();
  if (!o.fabrics.empty()) {
    std::vector<fabric> chosen;
    for (const auto& name : o.fabrics) {
      auto it = std::find_if(fabrics.begin(), fabrics.end(),
                             [&](const fabric& f) { return f.name == name; });
      if (it == fabrics.end()) usage("fabric '" + name + "' is not built in");
      chosen.push_back(*it);
    }
    fabrics = chosen;
  }
  const timing tm;
  std::printf(
      "| fabric | ranks | fault | point | runs | survivors | crashed | unnoticed | "
      "wrong culprit | deadline waits | regroup failed | leftovers | slowest error ms |\n"
      "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int bad = 0;
  for (const fabric& f : fabrics) {
    for (const auto& [key, value] : f.env) setenv(key.c_str(), value.c_str(), 1);
    for (int world : o.ranks)
      for (auto at : o.points)
        for (auto what : o.actions) {
          tally t;
          for (int run = 0; run < o.runs; ++run) run_cell(f, what, at, world, tm, t);
          std::string crashes;
          for (const auto& c : t.crashes) crashes += (crashes.empty() ? " (status " : ", ") + c;
          if (!crashes.empty()) crashes += ")";
          std::printf("| %s | %d | %s | %s | %d | %d | %d%s | %d | %d | %d | %d | %d | %lld |\n",
                      f.name.c_str(), world, fault::name(what), fault::name(at), t.runs,
                      t.survivors, t.crashed, crashes.c_str(), t.unnoticed, t.wrong_culprit,
                      t.deadline_waits, t.regroup_failed, t.leftovers,
                      static_cast<long long>(t.slowest_ms));
          std::fflush(stdout);
          bad += t.bad();
        }
    for (const auto& [key, value] : f.env) unsetenv(key.c_str());
  }
  return bad == 0 ? 0 : 1;
}
