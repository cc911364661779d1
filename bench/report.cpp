#include "report.hpp"

#include <unistd.h>

#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace epcomm::bench {
namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

void put_summary(std::ostream& o, const char* who, const summary& s) {
  o << ", \"" << who << "_us\": " << s.median_us << ", \"" << who << "_p10_us\": " << s.p10_us
    << ", \"" << who << "_p90_us\": " << s.p90_us << ", \"" << who << "_min_us\": " << s.min_us;
}

}  // namespace

void print_header(std::FILE* out, const options& opt, int ranks, double bandwidth) {
  std::fprintf(out,
               "epcomm-bench: %d ranks, %d timed iterations after %d warm-up, interleaved; "
               "times are the slowest rank's, median [p10-p90] in microseconds; GB/s is bytes "
               "per rank (each token once per destination rank) over the median\n"
               "epcomm-bench: copy = the same bytes per peer over the raw link; bound = the "
               "bytes that must move through memory over %.1f GB/s, the memory traffic per rank "
               "with every rank copying %d MiB at once\n",
               ranks, opt.iterations, opt.warmup, bandwidth / 1e9, opt.copy_mib);
  std::fprintf(out,
               "%-9s %-11s %-16s %-8s %6s %6s %3s %4s %5s | %-26s | %-26s | %-26s | %9s | %8s "
               "%8s %8s | %7s %7s %8s\n",
               "transport", "mode", "op", "dtype", "tokens", "hidden", "K", "E", "skew",
               "epcomm us", "baseline us", "copy us", "bound us", "epcomm", "baseline", "copy",
               "x base", "of copy", "of bound");
  std::fflush(out);
}

void print_row(std::FILE* out, const record& r) {
  auto cell = [](const summary& s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%9.1f [%7.1f-%7.1f]", s.median_us, s.p10_us, s.p90_us);
    return std::string(buf);
  };
  std::fprintf(out,
               "%-9s %-11s %-16s %-8s %6d %6d %3d %4d %5.2f | %-26s | %-26s | %-26s | %9.1f | "
               "%8.2f %8.2f %8.2f | %6.2fx %6.1f%% %7.1f%%\n",
               r.transport.c_str(), r.mode.c_str(), r.op.c_str(), name(r.shape.type),
               r.shape.tokens, r.shape.hidden, r.shape.topk, r.shape.experts, r.shape.skew,
               cell(r.epcomm).c_str(), cell(r.baseline).c_str(), cell(r.peer_copy).c_str(),
               r.bound_us, r.gbps(r.epcomm), r.gbps(r.baseline), r.gbps(r.peer_copy),
               r.speedup_vs_baseline(), 100.0 * r.fraction_of_peer_copy(),
               100.0 * r.fraction_of_bound());
  if (!r.bound_holds())
    std::fprintf(out,
                 "# note: the %s call above beat the bound (fastest %.1f us, bound %.1f us): its "
                 "bytes stayed in cache, which the bandwidth measurement does not; its fraction "
                 "of the bound says nothing\n",
                 r.op.c_str(), r.epcomm.min_us, r.bound_us);
  std::fflush(out);
}

void write_json(const std::string& path, const std::vector<record>& records, const options& opt,
                int ranks, double bandwidth) {
  std::ostringstream o;
  o.precision(10);
  o << "{\n  \"benchmark\": \"epcomm-bench\",\n  \"date\": " << json_string(utc_now())
    << ",\n  \"host\": " << json_string(host_name())
    << ",\n  \"cpus\": " << std::thread::hardware_concurrency()
    << ",\n  \"command\": " << json_string(opt.command_line) << ",\n  \"ranks\": " << ranks
    << ",\n  \"iterations\": " << opt.iterations << ",\n  \"warmup\": " << opt.warmup
    << ",\n  \"copy_bandwidth_gbps\": " << bandwidth / 1e9 << ",\n  \"records\": [";
  for (std::size_t i = 0; i < records.size(); ++i) {
    const record& r = records[i];
    o << (i == 0 ? "\n" : ",\n") << "    {\"transport\": " << json_string(r.transport)
      << ", \"mode\": " << json_string(r.mode) << ", \"op\": " << json_string(r.op)
      << ", \"ranks\": " << r.ranks << ", \"tokens\": " << r.shape.tokens
      << ", \"hidden\": " << r.shape.hidden << ", \"topk\": " << r.shape.topk
      << ", \"experts\": " << r.shape.experts << ", \"dtype\": " << json_string(name(r.shape.type))
      << ", \"skew\": " << r.shape.skew << ", \"seed\": " << r.shape.seed
      << ", \"bytes_per_rank\": " << r.bytes << ", \"samples\": " << r.epcomm.samples
      << ", \"verified\": true";
    put_summary(o, "epcomm", r.epcomm);
    put_summary(o, "baseline", r.baseline);
    put_summary(o, "peer_copy", r.peer_copy);
    o << ", \"bound_us\": " << r.bound_us << ", \"epcomm_gbps\": " << r.gbps(r.epcomm)
      << ", \"baseline_gbps\": " << r.gbps(r.baseline)
      << ", \"peer_copy_gbps\": " << r.gbps(r.peer_copy)
      << ", \"speedup_vs_baseline\": " << r.speedup_vs_baseline()
      << ", \"fraction_of_peer_copy\": " << r.fraction_of_peer_copy()
      << ", \"fraction_of_bound\": " << r.fraction_of_bound()
      << ", \"bound_holds\": " << (r.bound_holds() ? "true" : "false") << "}";
  }
  o << "\n  ]\n}\n";
  std::ofstream f(path);
  f << o.str();
  f.close();
  if (!f) throw std::runtime_error("cannot write " + path);
}

void write_plot(const std::string& path, const std::vector<record>& records, const options& opt) {
  const dtype type = opt.dtypes.front();
  const char* ops[] = {"dispatch", "combine", "dispatch+combine"};
  // (transport, mode) -> op -> tokens -> record
  std::map<std::pair<std::string, std::string>, std::map<std::string, std::map<int, record>>> data;
  for (const record& r : records)
    if (r.shape.type == type && r.shape.hidden == opt.hidden)
      data[{r.transport, r.mode}][r.op][r.shape.tokens] = r;
  if (data.empty()) throw std::runtime_error("--plot: no records to draw");

  std::ostringstream s;
  s << "set terminal pngcairo noenhanced size 1800,640 font ',11'\n"
    << "set output " << json_string(path) << "\n"
    << "set multiplot layout 1,3 title "
    << json_string(
           std::string("epcomm-bench: ") + name(type) + ", hidden " + std::to_string(opt.hidden) +
           ", top-" + std::to_string(opt.topk) + " of " + std::to_string(opt.experts) +
           " experts; algorithmic bandwidth per rank (median); baseline: MPI_Alltoallv, copy: "
           "raw copy of the same bytes per peer, bound: the bytes through memory at the host's "
           "copy bandwidth")
    << "\nset logscale x 2\nset logscale y 10\nset xlabel 'tokens per rank'\n"
    << "set ylabel 'GB/s per rank (log scale)'\nset grid\nset key outside bottom center horizontal "
       "maxcols 4 font ',9'\n";
  const char* series[] = {"epcomm", "baseline", "copy", "bound"};
  // Median microseconds of series i, the bound as if it were a time measured like the others.
  const auto us = [](const record& r, int i) {
    return i == 0   ? r.epcomm.median_us
           : i == 1 ? r.baseline.median_us
           : i == 2 ? r.peer_copy.median_us
                    : r.bound_us;
  };
  for (const char* op : ops) {
    s << "set title '" << op << "'\nplot ";
    bool first = true;
    int colour = 0;
    for (const auto& [key, by_op] : data) {
      ++colour;
      if (!by_op.contains(op)) continue;
      const std::string label = key.first + "/" + key.second;
      for (int i = 0; i < 4; ++i) {
        s << (first ? "" : ", ") << "'-' using 1:2 with linespoints lc " << colour << " dt "
          << i + 1 << " pt " << 5 + 2 * i << " title '" << label << " " << series[i] << "'";
        first = false;
      }
    }
    s << "\n";
    for (const auto& [key, by_op] : data) {
      const auto it = by_op.find(op);
      if (it == by_op.end()) continue;
      for (int i = 0; i < 4; ++i) {
        for (const auto& [tokens, r] : it->second)
          s << tokens << " " << (us(r, i) > 0 ? r.bytes / us(r, i) / 1e3 : 0) << "\n";
        s << "e\n";
      }
    }
  }
  s << "unset multiplot\n";

  std::FILE* gp = popen("gnuplot", "w");
  if (gp == nullptr) throw std::runtime_error("--plot: cannot start gnuplot");
  const std::string script = s.str();
  std::fwrite(script.data(), 1, script.size(), gp);
  const int status = pclose(gp);
  if (status != 0)
    throw std::runtime_error("--plot: gnuplot failed (exit status " + std::to_string(status) +
                             "); is gnuplot installed?");
}

}  // namespace epcomm::bench
