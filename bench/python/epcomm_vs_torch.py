"""epcomm's Python Buffer against the baseline a PyTorch user writes by hand,
`torch.distributed.all_to_all_single` over the same gloo group, with the same
routing, and against a physical bound, side by side in one run.

    /usr/bin/python3 bench/python/epcomm_vs_torch.py --ranks 2 [--tokens 1024,4096]
        [--json r.json] [--plot r.png]

Normal mode, bf16. Each iteration times epcomm, then the baseline, on every rank
between barriers; an op's time is the busiest rank's. Before timing, both
contenders' results are compared and must be equal. The bound is the bytes that
must move (each source row read once and written once per destination rank;
combine the reverse: each row coming back read once, each token written once) over the memory bandwidth every rank's core gets when all
copy at once, measured in the same run: no implementation can beat it, so
`fraction_of_bound` is at most 1 (checked).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import epcomm

OPS = ("dispatch", "combine", "dispatch+combine")


class AllToAllBaseline:
    """Dispatch and combine as two all_to_all_single calls each: the counts,
    then the rows, sent to each destination rank once per token, in token
    order (so the receiver's rows are ordered by (source rank, token), as
    epcomm's are)."""

    def __init__(self, group, world, num_experts):
        self.group, self.world, self.per_rank = group, world, num_experts // world

    def dispatch(self, x, topk_idx):
        dest = torch.where(topk_idx >= 0, topk_idx // self.per_rank, torch.full_like(topk_idx, -1))
        in_rank = torch.stack([(dest == r).any(dim=1) for r in range(self.world)], dim=1)
        # Row order: by destination rank, then token.
        rank_of_row, token_of_row = in_rank.t().nonzero(as_tuple=True)
        send_counts = in_rank.sum(dim=0)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
        # gloo has no 16-bit integer type: bf16 rows travel as int32 pairs.
        rows = x[token_of_row].view(torch.int32)
        recv = torch.empty(sum(recv_split), x.size(1) // 2, dtype=torch.int32)
        dist.all_to_all_single(recv, rows, recv_split, send_split, group=self.group)
        return recv.view(torch.bfloat16), (token_of_row, send_split, recv_split, x.size(0))

    def combine(self, y, handle):
        token_of_row, send_split, recv_split, num_tokens = handle
        back = torch.empty(sum(send_split), y.size(1) // 2, dtype=torch.int32)
        dist.all_to_all_single(back, y.view(torch.int32), send_split, recv_split, group=self.group)
        out = torch.zeros(num_tokens, y.size(1), dtype=torch.float32)
        out.index_add_(0, token_of_row, back.view(torch.bfloat16).float())
        return out.bfloat16()


def copy_bandwidth(group, nbytes=256 << 20, repeats=5):
    """Bytes per second of memory traffic (read + write) one rank gets while
    every rank copies at once: pre-faulted, warm buffers, the best of a few."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.zeros_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier(group=group)
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    slowest = torch.tensor([best], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return 2 * nbytes / slowest.item()


def busiest(seconds, group):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def summary(samples):
    s = sorted(samples)
    return {"median_us": statistics.median(s) * 1e6, "p10_us": s[len(s) // 10] * 1e6,
            "p90_us": s[(len(s) * 9) // 10] * 1e6, "min_us": s[0] * 1e6}


def run_shape(rank, world, args, tokens, buf, baseline, bandwidth):
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    x = torch.randn(tokens, args.hidden, generator=g).bfloat16()
    scores = torch.rand(tokens, args.experts, generator=g)
    topk_idx = scores.topk(args.topk, dim=1).indices.to(torch.int64)
    topk_weights = torch.rand(tokens, args.topk, generator=g)

    def epcomm_dispatch():
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, args.experts)
        recv_x, _, recv_w, _, handle, _ = buf.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
        return recv_x, handle

    def epcomm_combine(recv_x, handle):
        return buf.combine(recv_x, handle)[0]

    # Verified before timing: the same rows in the same order, the same sums.
    recv_x, handle = epcomm_dispatch()
    base_x, base_handle = baseline.dispatch(x, topk_idx)
    if not torch.equal(recv_x, base_x):
        raise SystemExit(f"rank {rank}: dispatch results differ from the baseline's")
    if not torch.equal(epcomm_combine(recv_x, handle), baseline.combine(base_x, base_handle)):
        raise SystemExit(f"rank {rank}: combine results differ from the baseline's")

    # Bytes this rank must move: its tokens read once and written once per
    # destination rank (dispatch); the rows coming back read once and its
    # tokens written once (combine). The busiest rank sets the pace.
    row = args.hidden * 2
    dest = topk_idx // (args.experts // world)
    sent_rows = int(torch.stack([(dest == r).any(dim=1) for r in range(world)], dim=1).sum())
    must_move = torch.tensor([(tokens + sent_rows) * row] * 2, dtype=torch.float64)
    dist.all_reduce(must_move, op=dist.ReduceOp.MAX, group=buf.group)
    bound = {"dispatch": must_move[0].item() / bandwidth,
             "combine": must_move[1].item() / bandwidth}
    bound["dispatch+combine"] = bound["dispatch"] + bound["combine"]

    times = {(who, op): [] for who in ("epcomm", "baseline") for op in OPS}
    for it in range(args.warmup + args.iterations):
        for who, (disp, comb) in (("epcomm", (epcomm_dispatch, epcomm_combine)),
                                  ("baseline", (lambda: baseline.dispatch(x, topk_idx),
                                                baseline.combine))):
            dist.barrier(group=buf.group)
            start = time.perf_counter()
            got, h = disp()
            mid = time.perf_counter()
            comb(got, h)
            end = time.perf_counter()
            if it >= args.warmup:
                times[(who, "dispatch")].append(busiest(mid - start, buf.group))
                times[(who, "combine")].append(busiest(end - mid, buf.group))
                times[(who, "dispatch+combine")].append(busiest(end - start, buf.group))

    records = []
    for op in OPS:
        e, b = summary(times[("epcomm", op)]), summary(times[("baseline", op)])
        fraction = bound[op] * 1e6 / e["min_us"]
        if fraction > 1:
            raise SystemExit(f"{op}: epcomm beat the bound ({fraction:.2f}): the bandwidth "
                             "measurement is wrong")
        records.append({"op": op, "dtype": "bf16", "ranks": world, "tokens": tokens,
                        "hidden": args.hidden, "experts": args.experts, "topk": args.topk,
                        "epcomm": e, "baseline": b, "bound_us": bound[op] * 1e6,
                        "speedup_vs_baseline": b["median_us"] / e["median_us"],
                        "fraction_of_bound": bound[op] * 1e6 / e["median_us"]})
    return records


def rank_main(rank, world, port, args, out_path):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)  # one core per rank, as the C++ bench binds them
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    tokens_list = [int(t) for t in args.tokens.split(",")]
    buf = epcomm.Buffer(None, num_nvl_bytes=0, num_max_tokens_per_rank=max(tokens_list),
                        num_experts=args.experts, hidden=args.hidden, max_topk=args.topk)
    baseline = AllToAllBaseline(buf.group, world, args.experts)
    bandwidth = copy_bandwidth(buf.group, args.copy_mib << 20)
    records = []
    for tokens in tokens_list:
        records += run_shape(rank, world, args, tokens, buf, baseline, bandwidth)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"copy_bandwidth_gbps": bandwidth / 1e9, "records": records}, f)
    # A gloo group left to the interpreter's exit can abort the process
    # ("terminate called without an active exception": its threads outlive
    # it; pytorch/pytorch#190489), as bench_smoke_python did in CI. Released
    # in order, the buffer first, as a DeepEP user does.
    buf.destroy()
    dist.barrier()
    dist.destroy_process_group()


def print_table(result):
    print(f"memory traffic per rank with every rank copying: "
          f"{result['copy_bandwidth_gbps']:.1f} GB/s")
    print(f"{'op':<17} {'tokens':>6} {'epcomm us':>10} {'torch a2a us':>13} {'bound us':>9} "
          f"{'speedup':>8} {'of bound':>9}")
    for r in result["records"]:
        print(f"{r['op']:<17} {r['tokens']:>6} {r['epcomm']['median_us']:>10.0f} "
              f"{r['baseline']['median_us']:>13.0f} {r['bound_us']:>9.0f} "
              f"{r['speedup_vs_baseline']:>7.2f}x {r['fraction_of_bound']:>8.0%}")


def write_plot(path, result):
    """Median time per op against tokens, the three contenders (gnuplot)."""
    script = [f"set terminal pngcairo noenhanced size 1800,640 font ',11'",
              f"set output '{path}'",
              "set multiplot layout 1,3 title 'epcomm vs torch all_to_all_single (gloo) vs "
              "bound, bf16, median per op'",
              "set logscale x 2", "set logscale y 10", "set xlabel 'tokens per rank'",
              "set ylabel 'us (log scale)'", "set grid", "set key outside bottom center horizontal"]
    for op in OPS:
        rows = [r for r in result["records"] if r["op"] == op]
        script.append(f"set title '{op}'")
        script.append("plot '-' using 1:2 with linespoints title 'epcomm', "
                      "'-' using 1:2 with linespoints title 'torch all_to_all_single', "
                      "'-' using 1:2 with linespoints title 'bound'")
        for key in ("epcomm", "baseline", "bound_us"):
            for r in rows:
                value = r[key] if key == "bound_us" else r[key]["median_us"]
                script.append(f"{r['tokens']} {value}")
            script.append("e")
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--tokens", default="4096", help="tokens per rank, comma-separated")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--copy-mib", type=int, default=256,
                   help="size of the copy that measures memory bandwidth (well above the caches)")
    p.add_argument("--json")
    p.add_argument("--plot")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_path = args.json or f"/tmp/epcomm_vs_torch.{os.getpid()}.json"
    mp.spawn(rank_main, args=(args.ranks, port, args, out_path), nprocs=args.ranks)
    with open(out_path) as f:
        result = json.load(f)
    if not args.json:
        os.unlink(out_path)
    print_table(result)
    if args.plot:
        write_plot(args.plot, result)


if __name__ == "__main__":
    sys.exit(main())
