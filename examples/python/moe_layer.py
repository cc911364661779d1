"""One MoE layer on N local ranks through epcomm's DeepEP-compatible Buffer,
checked token by token against a single-process reference: the Python
counterpart of examples/moe_layer.

Each rank gates its tokens, picks the top-k experts, dispatches the tokens to
the ranks holding those experts, runs its local experts (a small MLP each) on
what it received, and combines the weighted outputs back to the tokens'
ranks. Every rank also computes the whole layer in one process from the same
seeds and compares its own tokens with it. Exits non-zero on any mismatch.

    python moe_layer.py --ranks 4
    python moe_layer.py --ranks 4 --dtype fp8          (tokens travel as e4m3 + scales)
    python moe_layer.py --ranks 4 --inject-routing-bug (the check must then fail)
"""

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import epcomm as deep_ep
# torch 1.13 has no float8 dtype: fp8 tokens travel as their e4m3 bytes in uint8.
from epcomm.fp8 import per_token_cast_back, per_token_cast_to_fp8


def parse_args():
    parser = argparse.ArgumentParser(
        description='One MoE layer over epcomm, checked against a reference')
    parser.add_argument('--ranks', type=int, default=4, help='processes to spawn (default: 4)')
    parser.add_argument('--tokens', type=int, default=256, help='tokens per rank (default: 256)')
    parser.add_argument('--hidden', type=int, default=512,
                        help='hidden size, a multiple of 128 (default: 512)')
    parser.add_argument('--ffn', type=int, default=128,
                        help="each expert's inner size (default: 128)")
    parser.add_argument('--experts', type=int, default=16, help='experts in all (default: 16)')
    parser.add_argument('--topk', type=int, default=4, help='experts per token (default: 4)')
    parser.add_argument('--dtype', choices=('bf16', 'fp8'), default='bf16',
                        help='how tokens travel to the experts (default: bf16)')
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--inject-routing-bug', action='store_true',
                        help="rank 0 runs its first local expert's tokens through the next expert")
    args = parser.parse_args()
    if args.experts % args.ranks or not 1 <= args.topk <= args.experts or args.hidden % 128:
        parser.error('need experts divisible by ranks, 1 <= topk <= experts, '
                     'hidden a multiple of 128')
    return args


# -- the layer -----------------------------------------------------------------------------------

class MoELayer:
    """Gate and experts, drawn from one seed, so every rank builds the same
    layer. Expert e: silu(x @ w1[e]) @ w2[e]."""

    def __init__(self, args):
        generator = torch.Generator().manual_seed(args.seed)
        h, f, e = args.hidden, args.ffn, args.experts
        self.topk = args.topk
        self.gate = torch.randn((h, e), generator=generator) / h ** 0.5
        self.w1 = torch.randn((e, h, f), generator=generator) / h ** 0.5
        self.w2 = torch.randn((e, f, h), generator=generator) / f ** 0.5

    def route(self, x: torch.Tensor):
        """(topk_idx [T][K] int64, topk_weights [T][K] float32): softmax over
        the gate's logits, the k largest, renormalised over those k."""
        probs = torch.softmax(x.float() @ self.gate, dim=-1)
        weights, idx = torch.topk(probs, self.topk, dim=-1)
        return idx, weights / weights.sum(dim=-1, keepdim=True)

    def expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(rows.float() @ self.w1[e]) @ self.w2[e]


def tokens_of(args, rank: int) -> torch.Tensor:
    """Rank `rank`'s input, bf16 [T][H]: any rank can draw any rank's tokens."""
    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + 1 + rank)
    return torch.randn((args.tokens, args.hidden), generator=generator).to(torch.bfloat16)


def as_travelled(args, x: torch.Tensor) -> torch.Tensor:
    """What the experts see of x: the bf16 values, or their fp8 cast."""
    return per_token_cast_back(*per_token_cast_to_fp8(x)) if args.dtype == 'fp8' else x.float()


def reference(args, layer: MoELayer):
    """The whole layer in one process, float64: (output, magnitude) per
    rank, each [T][H]; magnitude is the sum of |w * expert(x)| over a token's
    experts, the scale of the rounding the distributed layer may add."""
    results = []
    for rank in range(args.ranks):
        x = tokens_of(args, rank)
        idx, weights = layer.route(x)
        rows = as_travelled(args, x)
        out = torch.zeros((args.tokens, args.hidden), dtype=torch.float64)
        magnitude = torch.zeros_like(out)
        for e in range(args.experts):
            chosen = (idx == e).nonzero()  # (token, slot)
            if chosen.numel():
                term = weights[chosen[:, 0], chosen[:, 1]].double().unsqueeze(1) * \
                    layer.expert(e, rows[chosen[:, 0]]).double()
                out.index_add_(0, chosen[:, 0], term)
                magnitude.index_add_(0, chosen[:, 0], term.abs())
        results.append((out, magnitude))
    return results


def run_rank(rank: int, args, port: int):
    # Every rank is a process on shared cores: one intra-op thread each.
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}',
                            world_size=args.ranks, rank=rank)
    group = dist.new_group(list(range(args.ranks)))
    layer = MoELayer(args)
    experts_per_rank = args.experts // args.ranks

    x = tokens_of(args, rank)
    topk_idx, topk_weights = layer.route(x)
    # Room for every rank's tokens at bf16, above DeepEP's NVL size hint for these shapes.
    buffer = deep_ep.Buffer(group, int(32e6), 0)

    start = time.perf_counter()
    num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank, _ = \
        buffer.get_dispatch_layout(topk_idx, args.experts)
    recv_x, recv_topk_idx, recv_topk_weights, _, handle, _ = buffer.dispatch(
        per_token_cast_to_fp8(x) if args.dtype == 'fp8' else x,
        num_tokens_per_rank=num_tokens_per_rank, num_tokens_per_rdma_rank=num_tokens_per_rdma_rank,
        is_token_in_rank=is_token_in_rank, num_tokens_per_expert=num_tokens_per_expert,
        topk_idx=topk_idx, topk_weights=topk_weights)
    dispatch_s = time.perf_counter() - start

    # The local experts: each received token gets the weighted sum of its
    # local experts' outputs (combine then adds up the ranks' sums).
    rows = per_token_cast_back(*recv_x) if args.dtype == 'fp8' else recv_x.float()
    y = torch.zeros(rows.shape, dtype=torch.float32)
    for local in range(experts_per_rank):
        chosen = (recv_topk_idx == local).nonzero()  # (received row, slot)
        if chosen.numel() == 0:
            continue
        expert = rank * experts_per_rank + local
        if args.inject_routing_bug and rank == 0 and local == 0:
            expert = (expert + 1) % args.experts
        y.index_add_(0, chosen[:, 0], recv_topk_weights[chosen[:, 0], chosen[:, 1]].unsqueeze(1) *
                     layer.expert(expert, rows[chosen[:, 0]]))

    start = time.perf_counter()
    combined_x, _, _ = buffer.combine(y.to(torch.bfloat16), handle)
    combine_s = time.perf_counter() - start

    # One rounding of each rank's partial sum to bf16 and one of the total.
    expected, magnitude = reference(args, layer)[rank]
    error = (combined_x.double() - expected).abs()
    bad = error > 2 ** -7 * magnitude + 1e-5
    if bad.any():
        t, c = bad.nonzero()[0].tolist()
        print(f'rank {rank}: token {t} channel {c}: got {combined_x[t, c].item():.6g}, '
              f'reference {expected[t, c].item():.6g}', file=sys.stderr, flush=True)

    mine = {'mismatches': int(bad.sum()), 'max_error': error.max().item(),
            'rows_sent': is_token_in_rank.sum().item(), 'dispatch_s': dispatch_s,
            'combine_s': combine_s}
    stats = [None] * args.ranks
    dist.all_gather_object(stats, mine, group=group)
    mismatches = sum(s['mismatches'] for s in stats)
    if rank == 0:
        failed = sum(1 for s in stats if s['mismatches'])
        verdict = f'FAILED on {failed} of {args.ranks} ranks ({mismatches} values)' if mismatches \
            else 'every token matches the reference'
        print(f'moe_layer: {args.ranks} ranks, {args.tokens} tokens/rank, hidden {args.hidden}, '
              f'top-{args.topk} of {args.experts} experts, {args.dtype}: '
              f'{sum(s["rows_sent"] for s in stats)} rows dispatched, '
              f'dispatch {max(s["dispatch_s"] for s in stats) * 1e3:.1f} ms, '
              f'combine {max(s["combine_s"] for s in stats) * 1e3:.1f} ms, '
              f'max error {max(s["max_error"] for s in stats):.2e}: {verdict}', flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if mismatches:
        sys.exit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


if __name__ == '__main__':
    args = parse_args()
    # The ranks meet on loopback only.
    os.environ.setdefault('GLOO_SOCKET_IFNAME', 'lo')
    port = int(os.environ.get('MASTER_PORT', 0)) or free_port()
    try:
        mp.spawn(run_rank, args=(args, port), nprocs=args.ranks)
    except mp.ProcessExitedException:
        sys.exit(1)  # a rank found a mismatch; rank 0 has printed the verdict
