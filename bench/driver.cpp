#include "driver.hpp"

#include <algorithm>
#include <array>

namespace epcomm::bench {

bool selected(const std::vector<std::string>& wanted, const char* name) {
  return wanted.empty() || std::find(wanted.begin(), wanted.end(), name) != wanted.end();
}

void check_options(const options& opt, int ranks) {
  std::vector<std::string> known_transports, known_modes;
  for_each_type(transports{}, [&]<class T>(std::type_identity<T>) {
    static_assert(transport_name<T> != nullptr, "a transport of the list has no transport_name");
    known_transports.push_back(transport_name<T>);
  });
  for_each_type(modes{}, [&]<class M>(std::type_identity<M>) { known_modes.push_back(M::name); });
  auto check = [](const std::vector<std::string>& wanted, const std::vector<std::string>& known,
                  const char* flag) {
    for (const auto& w : wanted) {
      if (std::find(known.begin(), known.end(), w) != known.end()) continue;
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw usage_error(std::string(flag) + ": '" + w + "' is not built in (built in: " + list +
                        ")");
    }
  };
  check(opt.transports, known_transports, "--transport");
  check(opt.modes, known_modes, "--mode");
  for_each_type(modes{}, [&]<class M>(std::type_identity<M>) {
    if (selected(opt.modes, M::name)) expand(opt, ranks, M::default_tokens, M::sweep_tokens);
  });
}

std::vector<record> measure(bench_case& c, const record& label, const options& opt, MPI_Comm comm,
                            double bandwidth) {
  const std::string problem = c.verify();
  int ok = problem.empty() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (all_ok == 0) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    const std::string where = label.transport + "/" + label.mode + " " + name(label.shape.type) +
                              " tokens " + std::to_string(label.shape.tokens) + " hidden " +
                              std::to_string(label.shape.hidden);
    if (!problem.empty())
      std::fprintf(stderr, "epcomm-bench: rank %d: %s: MISMATCH between epcomm and baseline: %s\n",
                   rank, where.c_str(), problem.c_str());
    throw verification_failure(where + ": epcomm and the baseline disagree");
  }

  std::vector<timed_op> ops = c.ops();
  // samples[op][contender]: epcomm, baseline, per-peer copy
  std::vector<std::array<std::vector<double>, 3>> samples(ops.size());
  for (int it = 0; it < opt.warmup + opt.iterations; ++it) {
    for (std::size_t o = 0; o < ops.size(); ++o) {
      const std::array<std::function<void()>*, 3> contender{&ops[o].epcomm, &ops[o].baseline,
                                                            &ops[o].peer_copy};
      // Each contender runs first, second and third equally often, so drift in the machine and
      // the cache left by the one before weigh on all three alike.
      for (int slot = 0; slot < 3; ++slot) {
        const int who = (slot + it) % 3;
        if (who == 0 && ops[o].epcomm_setup) ops[o].epcomm_setup();
        const double us = time_collective(comm, *contender[who]);
        if (it >= opt.warmup) samples[o][who].push_back(us);
      }
    }
  }

  std::vector<record> out;
  for (std::size_t o = 0; o < ops.size(); ++o) {
    record r = label;
    r.op = ops[o].name;
    r.bytes = ops[o].bytes;
    r.epcomm = summarize(std::move(samples[o][0]));
    r.baseline = summarize(std::move(samples[o][1]));
    r.peer_copy = summarize(std::move(samples[o][2]));
    r.bound_us = ops[o].must_move / bandwidth * 1e6;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace epcomm::bench
