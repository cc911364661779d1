#include "options.hpp"

#include <charconv>
#include <cmath>
#include <string_view>
#include <system_error>

#include "epcomm/core/enum_names.hpp"

namespace epcomm::bench {
namespace {

// Hidden sizes of common MoE models (Qwen-MoE, Mixtral, Qwen2-57B, DeepSeek-V3).
constexpr int sweep_hidden[] = {2048, 4096, 5120, 7168};

template <class T>
T number(std::string_view flag, std::string_view text) {
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw usage_error(std::string(flag) + ": '" + std::string(text) + "' is not a number");
  return v;
}

int positive(std::string_view flag, std::string_view text) {
  const int v = number<int>(flag, text);
  if (v < 1) throw usage_error(std::string(flag) + " must be >= 1, got " + std::string(text));
  return v;
}

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    out.emplace_back(text.substr(0, comma));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

dtype parse_dtype(std::string_view text) {
  if (text == "bf16") return dtype::bf16;
  if (text == "fp8" || text == "fp8_e4m3") return dtype::fp8_e4m3;
  if (text == "fp32") return dtype::fp32;
  throw usage_error("--dtype: '" + std::string(text) + "' is not bf16, fp8 or fp32");
}

// --quick: small enough for a CTest smoke test on a loaded 2-core machine, every dtype.
void apply_quick(options& o) {
  o.quick = true;
  o.tokens = 512;
  o.hidden = 2048;
  o.experts = 16;
  o.topk = 4;
  o.dtypes = {dtype::bf16, dtype::fp8_e4m3, dtype::fp32};
  o.warmup = 2;
  o.timeout_s = 300;
  o.copy_mib = 64;
}

}  // namespace

const char* name(dtype t) {
  static constexpr auto names = names_for<dtype, dtype::fp32>("bf16", "fp8_e4m3", "fp32");
  return names(t);
}

std::string usage() {
  return "usage: mpirun -np <ranks> epcomm-bench [options]\n"
         "  --tokens N        tokens per rank (default: the mode's reference, normal 4096,\n"
         "                    low-latency 128)\n"
         "  --hidden N        channels per token (default 7168)\n"
         "  --experts N       experts in total, a multiple of the rank count (default 64)\n"
         "  --topk N          experts per token (default 8)\n"
         "  --dtype LIST      bf16, fp8, fp32, comma-separated (default bf16)\n"
         "  --skew S          expert e is picked with weight (e+1)^-S (default 0: uniform)\n"
         "  --seed N          routing and data seed (default 1)\n"
         "  --sweep           tokens over the mode's range at the given hidden, then hidden\n"
         "                    2048..7168 at the given token count\n"
         "  --quick           small shapes, every dtype: a smoke test (well under a minute)\n"
         "  --iterations N    timed iterations per op and contender, >= 20 (default 20)\n"
         "  --warmup N        untimed iterations first (default 3)\n"
         "  --transport LIST  transports to run (default: all built in)\n"
         "  --mode LIST       modes to run: normal, low-latency (default: all built in)\n"
         "  --json FILE       one record per (transport, mode, op, workload)\n"
         "  --plot FILE.png   bandwidth against tokens (needs gnuplot)\n"
         "  --timeout-s N     give up after N seconds, exit status 124 (default 3600)\n"
         "  --copy-mib N      MiB each rank copies, all at once, to measure the memory\n"
         "                    bandwidth of the bound (default 256: well above the caches)\n"
         "  --max-buffer-bytes N  normal mode's byte budget: calls larger than the\n"
         "                    windows it leaves move in rounds (default 0: whole calls)\n"
         "  --help\n";
}

options parse_options(std::span<char* const> args) {
  options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (i > 0) o.command_line += ' ';
    o.command_line += args[i];
  }
  // --quick first, so that flags given with it refine the preset whatever their order.
  for (std::size_t i = 1; i < args.size(); ++i)
    if (std::string_view(args[i]) == "--quick") apply_quick(o);

  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string_view flag = args[i];
    if (flag == "--quick") continue;
    if (flag == "--help") throw usage_error("");
    if (flag == "--sweep") {
      o.sweep = true;
      continue;
    }
    if (i + 1 >= args.size()) throw usage_error(std::string(flag) + ": missing value");
    const std::string_view value = args[++i];
    if (flag == "--tokens") {
      o.tokens = positive(flag, value);
    } else if (flag == "--hidden") {
      o.hidden = positive(flag, value);
    } else if (flag == "--experts") {
      o.experts = positive(flag, value);
    } else if (flag == "--topk") {
      o.topk = positive(flag, value);
    } else if (flag == "--dtype") {
      o.dtypes.clear();
      for (const auto& t : split(value)) o.dtypes.push_back(parse_dtype(t));
    } else if (flag == "--skew") {
      o.skew = number<double>(flag, value);
      if (!(o.skew >= 0.0) || !std::isfinite(o.skew))
        throw usage_error("--skew must be a finite number >= 0");
    } else if (flag == "--seed") {
      o.seed = number<std::uint64_t>(flag, value);
    } else if (flag == "--iterations") {
      o.iterations = positive(flag, value);
      if (o.iterations < 20)
        throw usage_error("--iterations must be >= 20: a median and spread need that many");
    } else if (flag == "--warmup") {
      o.warmup = number<int>(flag, value);
      if (o.warmup < 0) throw usage_error("--warmup must be >= 0");
    } else if (flag == "--transport") {
      o.transports = split(value);
    } else if (flag == "--mode") {
      o.modes = split(value);
    } else if (flag == "--json") {
      o.json_path = value;
    } else if (flag == "--plot") {
      o.plot_path = value;
    } else if (flag == "--timeout-s") {
      o.timeout_s = positive(flag, value);
    } else if (flag == "--copy-mib") {
      o.copy_mib = positive(flag, value);
    } else if (flag == "--max-buffer-bytes") {
      o.max_buffer_bytes = number<std::size_t>(flag, value);
    } else {
      throw usage_error("unknown option " + std::string(flag));
    }
  }
  if (o.dtypes.empty()) throw usage_error("--dtype: no dtype given");
  return o;
}

std::vector<workload> expand(const options& opt, int ranks, int default_tokens,
                             std::span<const int> sweep_tokens) {
  const int tokens = opt.tokens.value_or(default_tokens);
  std::vector<std::pair<int, int>> shapes;  // (tokens, hidden)
  if (opt.sweep) {
    for (int t : sweep_tokens) shapes.emplace_back(t, opt.hidden);
    for (int h : sweep_hidden)
      if (h != opt.hidden) shapes.emplace_back(tokens, h);
  } else {
    shapes.emplace_back(tokens, opt.hidden);
  }
  if (opt.experts < ranks || opt.experts % ranks != 0)
    throw usage_error("--experts " + std::to_string(opt.experts) +
                      " must be a positive multiple of the rank count " + std::to_string(ranks));
  if (opt.topk > opt.experts)
    throw usage_error("--topk " + std::to_string(opt.topk) + " exceeds --experts " +
                      std::to_string(opt.experts));
  std::vector<workload> out;
  for (dtype t : opt.dtypes) {
    for (auto [tok, hid] : shapes) {
      if (t == dtype::fp8_e4m3 && hid % 128 != 0)
        throw usage_error(
            "fp8 needs hidden to be a multiple of 128 (one scale per 128 "
            "channels), got " +
            std::to_string(hid));
      out.push_back({tok, hid, opt.experts, opt.topk, t, opt.skew, opt.seed, opt.max_buffer_bytes});
    }
  }
  return out;
}

}  // namespace epcomm::bench
