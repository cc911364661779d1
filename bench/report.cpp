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

void print_header(std::FILE* out, const options& opt, int ranks) {
  std::fprintf(out,
               "epcomm-bench: %d ranks, %d timed iterations after %d warm-up, interleaved; "
               "times are the slowest rank's, median [p10-p90] in microseconds; GB/s is bytes "
               "per rank (each token once per destination rank) over the median\n",
               ranks, opt.iterations, opt.warmup);
  std::fprintf(out,
               "%-9s %-11s %-16s %-8s %6s %6s %3s %4s %5s | %-26s | %-26s | %-26s | %8s %8s "
               "%8s | %7s %7s\n",
               "transport", "mode", "op", "dtype", "tokens", "hidden", "K", "E", "skew",
               "epcomm us", "baseline us", "roofline us", "epcomm", "baseline", "roofline",
               "x base", "of roof");
  std::fflush(out);
}

void print_row(std::FILE* out, const record& r) {
  auto cell = [](const summary& s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%9.1f [%7.1f-%7.1f]", s.median_us, s.p10_us, s.p90_us);
    return std::string(buf);
  };
  std::fprintf(out,
               "%-9s %-11s %-16s %-8s %6d %6d %3d %4d %5.2f | %-26s | %-26s | %-26s | %8.2f %8.2f "
               "%8.2f | %6.2fx %6.1f%%\n",
               r.transport.c_str(), r.mode.c_str(), r.op.c_str(), name(r.shape.type),
               r.shape.tokens, r.shape.hidden, r.shape.topk, r.shape.experts, r.shape.skew,
               cell(r.epcomm).c_str(), cell(r.baseline).c_str(), cell(r.roofline).c_str(),
               r.gbps(r.epcomm), r.gbps(r.baseline), r.gbps(r.roofline), r.speedup_vs_baseline(),
               100.0 * r.fraction_of_roofline());
  std::fflush(out);
}

void write_json(const std::string& path, const std::vector<record>& records, const options& opt,
                int ranks) {
  std::ostringstream o;
  o.precision(10);
  o << "{\n  \"benchmark\": \"epcomm-bench\",\n  \"date\": " << json_string(utc_now())
    << ",\n  \"host\": " << json_string(host_name())
    << ",\n  \"cpus\": " << std::thread::hardware_concurrency()
    << ",\n  \"command\": " << json_string(opt.command_line) << ",\n  \"ranks\": " << ranks
    << ",\n  \"iterations\": " << opt.iterations << ",\n  \"warmup\": " << opt.warmup
    << ",\n  \"records\": [";
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
    put_summary(o, "roofline", r.roofline);
    o << ", \"epcomm_gbps\": " << r.gbps(r.epcomm) << ", \"baseline_gbps\": " << r.gbps(r.baseline)
      << ", \"roofline_gbps\": " << r.gbps(r.roofline)
      << ", \"speedup_vs_baseline\": " << r.speedup_vs_baseline()
      << ", \"fraction_of_roofline\": " << r.fraction_of_roofline() << "}";
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
           " experts; algorithmic bandwidth per rank (median); baseline: MPI_Alltoallv, roofline: "
           "raw copy of the same bytes")
    << "\nset logscale x 2\nset logscale y 10\nset xlabel 'tokens per rank'\n"
    << "set ylabel 'GB/s per rank (log scale)'\nset grid\nset key outside bottom center horizontal "
       "maxcols 3 font ',9'\n";
  for (const char* op : ops) {
    s << "set title '" << op << "'\nplot ";
    bool first = true;
    int colour = 0;
    for (const auto& [key, by_op] : data) {
      ++colour;
      if (!by_op.contains(op)) continue;
      const std::string label = key.first + "/" + key.second;
      const char* series[] = {"epcomm", "baseline", "roofline"};
      const int dash[] = {1, 2, 3};
      for (int i = 0; i < 3; ++i) {
        s << (first ? "" : ", ") << "'-' using 1:2 with linespoints lc " << colour << " dt "
          << dash[i] << " pt " << 5 + 2 * i << " title '" << label << " " << series[i] << "'";
        first = false;
      }
    }
    s << "\n";
    for (const auto& [key, by_op] : data) {
      const auto it = by_op.find(op);
      if (it == by_op.end()) continue;
      for (int i = 0; i < 3; ++i) {
        for (const auto& [tokens, r] : it->second) {
          const summary& sm = i == 0 ? r.epcomm : i == 1 ? r.baseline : r.roofline;
          s << tokens << " " << r.gbps(sm) << "\n";
        }
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
