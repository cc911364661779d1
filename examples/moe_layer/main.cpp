// One MoE layer: route, dispatch, apply the local experts, combine, and
// compare every token with a single-process reference. Exits non-zero with the
// first mismatching token. By default N local ranks over shared memory; with
// --launcher env this process is one rank of a job that torchrun / TorchX
// started (RANK, WORLD_SIZE, MASTER_ADDR, ...; epcomm/bootstrap/env.hpp), and
// the ranks talk over libfabric (FI_PROVIDER: efa on AWS, tcp on loopback).
//
//   moe_layer --ranks 4 --tokens 512 --hidden 1024 --experts 16 --topk 4 --dtype bf16
//   moe_layer --mode low-latency --tokens 128 --dtype fp8   (bf16 in, fp8 on the wire)
//   torchrun --nnodes 2 --nproc-per-node 8 ... --no-python moe_layer --launcher env
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/epcomm.hpp"
#include "epcomm/shm/transport.hpp"
#if EPCOMM_EXAMPLE_LIBFABRIC
#include "epcomm/bootstrap/env.hpp"
#include "epcomm/libfabric/transport.hpp"
#endif

namespace {

struct options {
  int ranks = 4;
  int tokens = 512;
  int hidden = 1024;
  int experts = 16;
  int topk = 4;
  std::string dtype = "bf16";
  std::string mode = "normal";  // or "low-latency"
  std::uint64_t seed = 1;
  bool inject_routing_bug = false;  // proves the check can fail
  std::string launcher = "local";   // or "env": one rank of a torchrun / TorchX job
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "moe_layer: %s\nusage: moe_layer [--ranks N] [--tokens T] [--hidden H] "
               "[--experts E] [--topk K] [--dtype bf16|fp8|fp32] [--seed S] "
               "[--mode normal|low-latency] [--launcher local|env] [--inject-routing-bug]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    auto number = [&]() -> long long {
      const std::string v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0') usage(("not a number: " + v).c_str());
      return n;
    };
    if (a == "--ranks")
      o.ranks = static_cast<int>(number());
    else if (a == "--tokens")
      o.tokens = static_cast<int>(number());
    else if (a == "--hidden")
      o.hidden = static_cast<int>(number());
    else if (a == "--experts")
      o.experts = static_cast<int>(number());
    else if (a == "--topk")
      o.topk = static_cast<int>(number());
    else if (a == "--dtype")
      o.dtype = value();
    else if (a == "--seed")
      o.seed = static_cast<std::uint64_t>(number());
    else if (a == "--mode")
      o.mode = value();
    else if (a == "--launcher")
      o.launcher = value();
    else if (a == "--inject-routing-bug")
      o.inject_routing_bug = true;
    else
      usage(("unknown flag " + a).c_str());
  }
  if (o.ranks < 1 || o.tokens < 0 || o.hidden < 1 || o.topk < 1 || o.topk > o.experts)
    usage("need ranks >= 1, tokens >= 0, hidden >= 1, 1 <= topk <= experts");
  if (o.dtype != "bf16" && o.dtype != "fp8" && o.dtype != "fp32")
    usage("dtype must be bf16, fp8 or fp32");
  if (o.mode != "normal" && o.mode != "low-latency") usage("mode must be normal or low-latency");
  if (o.launcher != "local" && o.launcher != "env") usage("launcher must be local or env");
#if !EPCOMM_EXAMPLE_LIBFABRIC
  if (o.launcher == "env") usage("--launcher env needs libfabric, which this build did not find");
#endif
  if (o.mode == "low-latency" && o.dtype == "fp32")
    usage("low-latency mode takes bf16 tokens and sends bf16 or fp8: dtype must be bf16 or fp8");
  return o;
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float uniform(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return static_cast<float>(mix(mix(mix(mix(a) ^ b) ^ c) ^ d) >> 40) / (1 << 23) - 1.0f;
}

// Expert e is a cheap linear map that differs per expert and per channel:
// y[c] = a_e[c] x[c] + b_e x[(c + s_e) % H]. A token handled by the wrong
// expert, or a row returned to the wrong token, changes the result.
struct experts {
  int hidden;
  std::uint64_t seed;
  double apply(int e, const std::vector<float>& x, int c) const {
    const double a = 0.5 + uniform(seed, 0xa, e, c);
    const double b = uniform(seed, 0xb, e, 0);
    const int shift = 1 + e % 7;
    return a * x[c] + b * x[(c + shift) % hidden];
  }
};

// A rank's gate output: the top-k experts of each token and their weights.
struct routing {
  std::vector<std::int64_t> idx;  // [T][K]
  std::vector<float> w;           // [T][K]
};

// Softmax over random logits, top-k, weights renormalised over the chosen k.
routing route(const options& o, int rank) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(o.tokens) * o.topk, -1);
  std::vector<float> w(idx.size(), 0.0f);
  std::vector<float> p(o.experts);
  std::vector<int> order(o.experts);
  for (int t = 0; t < o.tokens; ++t) {
    for (int e = 0; e < o.experts; ++e) p[e] = std::exp(3.0f * uniform(o.seed, rank, t, 1000 + e));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + o.topk, order.end(),
                      [&](int a, int b) { return p[a] > p[b]; });
    float sum = 0;
    for (int k = 0; k < o.topk; ++k) sum += p[order[k]];
    for (int k = 0; k < o.topk; ++k) {
      idx[t * o.topk + k] = order[k];
      w[t * o.topk + k] = p[order[k]] / sum;
    }
  }
  return {std::move(idx), std::move(w)};
}

struct rank_stats {
  int tokens, sent_rows, recv_rows, mismatches;
  double dispatch_ms, combine_ms;
};

// Single-process reference in float64 from the tokens as they travelled
// (row_of(t, row) fills token t's values). Tolerance: one rounding of each
// rank's (or expert's) partial sum to Out, one of the total.
template <class Out, class RowOf>
int count_mismatches(const options& o, int rank, const experts& ex,
                     const std::vector<std::int64_t>& idx, const std::vector<float>& w,
                     RowOf&& row_of, std::span<const Out> out) {
  const int h = o.hidden;
  const double eps = std::is_same_v<Out, float> ? 1e-5 : std::ldexp(1.0, -7);
  std::vector<float> row(h);
  int mismatches = 0;
  for (int t = 0; t < o.tokens; ++t) {
    row_of(t, row);
    for (int c = 0; c < h; ++c) {
      double ref = 0, mag = 0;
      for (int k = 0; k < o.topk; ++k) {
        const double v =
            w[t * o.topk + k] * ex.apply(static_cast<int>(idx[t * o.topk + k]), row, c);
        ref += v;
        mag += std::fabs(v);
      }
      const double got = epcomm::to_float(out[t * h + c]);
      if (std::fabs(got - ref) > eps * mag + 1e-6) {
        if (mismatches++ == 0)
          std::fprintf(stderr, "rank %d: token %d channel %d: got %.6g, reference %.6g\n", rank, t,
                       c, got, ref);
      }
    }
  }
  return mismatches;
}

// Gathers every rank's numbers; rank 0 prints them.
template <class Boot>
void report(Boot& boot, const options& o, const rank_stats& mine) {
  using namespace epcomm;
  const auto bytes =
      boot.all_gather(std::as_bytes(std::span(&mine, 1)), deadline::after(default_timeout));
  std::vector<rank_stats> all(o.ranks);
  std::memcpy(all.data(), bytes.data(), bytes.size());
  if (boot.rank() == 0) {
    std::printf(
        "moe_layer: %s mode, %d ranks, %d tokens/rank, hidden %d, top-%d of %d experts, %s\n",
        o.mode.c_str(), o.ranks, o.tokens, o.hidden, o.topk, o.experts, o.dtype.c_str());
    std::printf("%6s %8s %10s %10s %12s %12s %11s\n", "rank", "tokens", "rows sent", "rows recv",
                "dispatch ms", "combine ms", "mismatches");
    for (int r = 0; r < o.ranks; ++r)
      std::printf("%6d %8d %10d %10d %12.3f %12.3f %11d\n", r, all[r].tokens, all[r].sent_rows,
                  all[r].recv_rows, all[r].dispatch_ms, all[r].combine_ms, all[r].mismatches);
  }
}

template <class Transport, epcomm::token_type Token, class Boot>
int run_rank(Boot& boot, const options& o) {
  using namespace epcomm;
  using out_t = combine_type_t<Token>;
  constexpr bool fp8 = token_traits<Token>::has_scales;
  const int rank = boot.rank();
  const int h = o.hidden;
  const experts ex{h, o.seed};

  // This rank's tokens, as the dispatcher will carry them (fp8: cast + scales).
  std::vector<float> xf(static_cast<std::size_t>(o.tokens) * h);
  for (std::size_t i = 0; i < xf.size(); ++i) xf[i] = uniform(o.seed, 0x7, rank, i);
  std::vector<Token> x(xf.size());
  std::vector<float> scales;
  if constexpr (fp8) {
    scales.resize(static_cast<std::size_t>(o.tokens) * (h / fp8_block));
    for (int t = 0; t < o.tokens; ++t)
      quantize_fp8_row(xf.data() + t * h, h, x.data() + t * h, scales.data() + t * (h / fp8_block),
                       false);
  } else {
    for (std::size_t i = 0; i < xf.size(); ++i) x[i] = from_float<Token>(xf[i]);
  }
  auto row_as_float = [&](const Token* row, const float* row_scales, std::vector<float>& out) {
    for (int c = 0; c < h; ++c)
      out[c] = fp8 ? to_float(row[c]) * row_scales[c / fp8_block] : to_float(row[c]);
  };
  const auto [idx, w] = route(o, rank);

  buffer_config cfg;
  cfg.num_experts = o.experts;
  cfg.max_hidden = h;
  cfg.max_topk = o.topk;
  cfg.max_tokens_per_rank = o.tokens;
  buffer<Transport, Token> buf(boot, cfg);

  const auto t0 = std::chrono::steady_clock::now();
  const auto res = buf.dispatch({o.tokens, h, o.topk, x, scales, idx, w});
  const auto t1 = std::chrono::steady_clock::now();

  // The experts of this rank: y = sum over local experts k of w_k * expert(x).
  const int per_rank = o.experts / o.ranks;
  const int n = res.num_recv_tokens;
  // The experts write their outputs straight into the buffer, where combine
  // reads them in place (no copy of y).
  const std::span<out_t> y = buf.combine_send_buffer(res.handle);
  std::vector<float> row(h);
  for (int i = 0; i < n; ++i) {
    row_as_float(res.recv_x.data() + i * h,
                 fp8 ? res.recv_x_scales.data() + i * (h / fp8_block) : nullptr, row);
    for (int c = 0; c < h; ++c) {
      double acc = 0;
      for (int k = 0; k < o.topk; ++k) {
        std::int64_t local = res.recv_topk_idx[i * o.topk + k];
        if (local < 0) continue;
        if (o.inject_routing_bug && i == 0) local = (local + 1) % per_rank;
        acc += res.recv_topk_weights[i * o.topk + k] *
               ex.apply(static_cast<int>(rank * per_rank + local), row, c);
      }
      y[i * h + c] = from_float<out_t>(static_cast<float>(acc));
    }
  }

  const auto t2 = std::chrono::steady_clock::now();
  const auto out = buf.combine({y, std::nullopt, {}, {}}, res.handle);
  const auto t3 = std::chrono::steady_clock::now();

  const int mismatches = count_mismatches(
      o, rank, ex, idx, w,
      [&](int t, std::vector<float>& r) {
        row_as_float(x.data() + t * h, fp8 ? scales.data() + t * (h / fp8_block) : nullptr, r);
      },
      std::span<const out_t>(out.x));

  rank_stats mine{o.tokens,
                  std::accumulate(res.handle.count_matrix.begin() + rank * o.ranks,
                                  res.handle.count_matrix.begin() + (rank + 1) * o.ranks, 0),
                  n,
                  mismatches,
                  std::chrono::duration<double, std::milli>(t1 - t0).count(),
                  std::chrono::duration<double, std::milli>(t3 - t2).count()};
  report(boot, o, mine);
  return mismatches == 0 ? 0 : 1;
}

// Low-latency mode: bf16 tokens in, Wire (bf16, or fp8 with scales) on the
// wire. Each (token, top-k slot) is one row of its expert; the expert answers
// unweighted and the source applies the weights while reducing.
template <class Transport, class Wire, class Boot>
int run_low_latency_rank(Boot& boot, const options& o) {
  using namespace epcomm;
  constexpr bool fp8 = token_traits<Wire>::has_scales;
  const int rank = boot.rank();
  const int h = o.hidden;
  const experts ex{h, o.seed};

  std::vector<bf16> x(static_cast<std::size_t>(o.tokens) * h);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = to_bf16(uniform(o.seed, 0x7, rank, i));
  const auto [idx, w] = route(o, rank);

  low_latency_config cfg;
  cfg.num_experts = o.experts;
  cfg.hidden = h;
  cfg.max_topk = o.topk;
  cfg.max_tokens_per_rank = std::max(o.tokens, 1);
  low_latency_buffer<Transport, Wire> buf(boot, cfg);

  const auto t0 = std::chrono::steady_clock::now();
  const auto res = buf.low_latency_dispatch({o.tokens, o.topk, x, idx});
  const auto t1 = std::chrono::steady_clock::now();

  // The experts write straight into the combine send buffer (zero copy).
  const int per_rank = o.experts / o.ranks;
  const std::size_t rows_per_expert = static_cast<std::size_t>(o.ranks) * cfg.max_tokens_per_rank;
  const auto y = buf.combine_send_buffer(res.handle);
  std::vector<float> row(h);
  int recv_rows = 0;
  for (int le = 0; le < per_rank; ++le) {
    for (int i = 0; i < res.recv_count[le]; ++i) {
      const std::size_t r = le * rows_per_expert + i;
      for (int c = 0; c < h; ++c)
        row[c] = fp8 ? to_float(res.recv_x[r * h + c]) *
                           res.recv_x_scales[r * (h / fp8_block) + c / fp8_block]
                     : to_float(res.recv_x[r * h + c]);
      int expert = rank * per_rank + le;
      if (o.inject_routing_bug && le == 0 && i == 0) expert = (expert + 1) % o.experts;
      for (int c = 0; c < h; ++c)
        y[r * h + c] = to_bf16(static_cast<float>(ex.apply(expert, row, c)));
    }
    recv_rows += res.recv_count[le];
  }

  const auto t2 = std::chrono::steady_clock::now();
  const auto out = buf.low_latency_combine({y, idx, w}, res.handle);
  const auto t3 = std::chrono::steady_clock::now();

  // The tokens as they travelled: bf16, or the fp8 cast of the bf16 row.
  std::vector<fp8_e4m3> q(h);
  std::vector<float> q_scales(fp8 ? h / fp8_block : 0);
  const int mismatches = count_mismatches(
      o, rank, ex, idx, w,
      [&](int t, std::vector<float>& r) {
        const bf16* src = x.data() + static_cast<std::size_t>(t) * h;
        if constexpr (fp8) {
          quantize_fp8_row(src, h, q.data(), q_scales.data(), false);
          dequantize_fp8_row(q.data(), q_scales.data(), h, r.data());
        } else {
          for (int c = 0; c < h; ++c) r[c] = to_float(src[c]);
        }
      },
      out);

  const int sent_rows =
      static_cast<int>(std::count_if(idx.begin(), idx.end(), [](auto e) { return e >= 0; }));
  report(boot, o,
         {o.tokens, sent_rows, recv_rows, mismatches,
          std::chrono::duration<double, std::milli>(t1 - t0).count(),
          std::chrono::duration<double, std::milli>(t3 - t2).count()});
  return mismatches == 0 ? 0 : 1;
}

// This rank's part of the layer in the mode and dtype asked for.
template <class Transport, class Boot>
int run_any(Boot& boot, const options& o) {
  if (o.mode == "low-latency")
    return o.dtype == "fp8" ? run_low_latency_rank<Transport, epcomm::fp8_e4m3>(boot, o)
                            : run_low_latency_rank<Transport, epcomm::bf16>(boot, o);
  if (o.dtype == "fp8") return run_rank<Transport, epcomm::fp8_e4m3>(boot, o);
  if (o.dtype == "fp32") return run_rank<Transport, float>(boot, o);
  return run_rank<Transport, epcomm::bf16>(boot, o);
}

#if EPCOMM_EXAMPLE_LIBFABRIC
// One rank of a launcher's job over libfabric; rank 0 prints the table. The
// launcher (torchrun) fails the job when any rank exits non-zero.
int run_as_launched(options o) {
  try {
    auto boot = epcomm::env_bootstrap::from_environment();
    o.ranks = boot.world_size();
    if (o.experts % o.ranks != 0) usage("experts must be a multiple of WORLD_SIZE");
    const int code = run_any<epcomm::libfabric::transport>(boot, o);
    if (code == 0 && boot.rank() == 0)
      std::printf("moe_layer: every token of rank 0 matches the reference\n");
    return code;
  } catch (const epcomm::error& e) {
    std::fprintf(stderr, "moe_layer: %s\n", e.what());
    return 1;
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
#if EPCOMM_EXAMPLE_LIBFABRIC
  if (o.launcher == "env") return run_as_launched(o);
#endif
  const auto codes = epcomm::launch_local(o.ranks, [&](epcomm::local_bootstrap& boot) {
    return run_any<epcomm::shm::transport>(boot, o);
  });
  int failed = 0;
  for (std::size_t r = 0; r < codes.size(); ++r)
    if (codes[r] != 0) ++failed;
  if (failed != 0) {
    std::fprintf(stderr, "moe_layer: FAILED on %d of %zu ranks\n", failed, codes.size());
    return 1;
  }
  std::printf("moe_layer: every token matches the reference\n");
  return 0;
}
