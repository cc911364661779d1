"""Low-latency dispatch and combine, written as a DeepEP user writes them
(DeepEP's tests/test_low_latency.py is the model): every result is checked
against what this script computes itself in plain torch.

    python test_low_latency.py --num-processes 4
"""

import argparse
import random
import time

import torch
import torch.distributed as dist

import epcomm as deep_ep
from epcomm.fp8 import E4M3_MAX
from test_intranode import (calc_diff, gather, identify_rows, init_dist, per_token_cast_back,
                            rank_parser, spawn_ranks)

device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')


def fp8_error_bound(reference: torch.Tensor, round_scale: bool) -> torch.Tensor:
    """How far a value may move when cast to e4m3 with one scale per 128
    channels and back to bf16: 3 mantissa bits round it by at most 1/16 of
    itself, bf16 by 1/256 more; below e4m3's normal range the step is 2^-9
    of the scale, so rounding moves a value by at most 2^-10 of it. The scale
    is amax / 448, or at most twice that when rounded up to a power of two."""
    blocks = reference.float().unflatten(-1, (-1, 128))
    scale = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4) / E4M3_MAX
    if round_scale:
        scale = scale * 2
    return (blocks.abs() * (1 / 16 + 1 / 256) + scale * 2 ** -10).flatten(-2)


def test_main(num_tokens: int, hidden: int, num_experts: int, num_topk: int, rank: int,
              num_ranks: int, group: dist.ProcessGroup, buffer: deep_ep.Buffer, seed: int = 0):
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    assert num_experts % num_ranks == 0
    num_local_experts = num_experts // num_ranks

    # Token rows: `x` says where it came from (the rank in every channel but
    # the last 128, which hold the token index), `x_pure_rand` is noise of
    # varying size per token, so that the fp8 scales differ.
    x = torch.ones((num_tokens, hidden), dtype=torch.bfloat16, device=device) * rank
    x[:, -128:] = torch.arange(num_tokens, device=device).to(torch.bfloat16).view(-1, 1)
    x_pure_rand = (torch.randn((num_tokens, hidden), dtype=torch.float32, device=device) *
                   torch.rand((num_tokens, 1), device=device) * 4).to(torch.bfloat16)

    scores = torch.randn((num_tokens, num_experts), dtype=torch.float32, device=device).abs() + 1
    topk_idx = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=True)[1]
    topk_weights = torch.randn((num_tokens, num_topk), dtype=torch.float32, device=device).abs()
    # Some slots select no expert.
    for _ in range(10):
        topk_idx[random.randint(0, num_tokens - 1), random.randint(0, num_topk - 1)] = -1

    all_topk_idx = gather(topk_idx, group)
    all_rows = {'rank-valued': gather(x.float(), group),
                'random': gather(x_pure_rand.float(), group)}

    def cast_back_packed(packed_recv_x):
        """[E_local][rows][H] bf16 of the fp8 rows and their scales."""
        recv_x, recv_scales = packed_recv_x[0], packed_recv_x[1].contiguous()
        return per_token_cast_back(recv_x.view(-1, hidden),
                                   recv_scales.view(-1, hidden // 128)).view(recv_x.shape)

    def check_dispatch(kind, packed_recv_x, packed_recv_count, cumulative_stats, use_fp8,
                       round_scale):
        """Each local expert holds exactly the (rank, token) pairs that chose
        it, in any order (DeepEP's order is by arrival), each as sent: bf16
        bit for bit, fp8 within its rounding. Returns the rows as bf16."""
        assert packed_recv_count.dtype == torch.int32
        assert packed_recv_count.numel() == num_local_experts
        assert torch.equal(cumulative_stats, packed_recv_count)
        recv_values = cast_back_packed(packed_recv_x) if use_fp8 else packed_recv_x
        if round_scale:
            scales = torch.cat([packed_recv_x[1][i, :packed_recv_count[i]]
                                for i in range(num_local_experts)])
            assert torch.equal(torch.exp2(torch.log2(scales).round()), scales), \
                'scales not powers of two'
        for i in range(num_local_experts):
            expert_id = rank * num_local_experts + i
            expected = (all_topk_idx == expert_id).any(dim=2).nonzero()  # (rank, token)
            num_valid_tokens = packed_recv_count[i].item()
            num_selections = (all_topk_idx == expert_id).sum().item()
            assert num_valid_tokens == expected.size(0) == num_selections, \
                f'expert {expert_id}: {num_valid_tokens} rows, {num_selections} expected'
            rows = recv_values[i, :num_valid_tokens].float()
            if kind == 'rank-valued' and round_scale:
                # A power-of-two scale leaves token indices above 16 inexact in
                # e4m3 (126 and 127 both come back as 128), so these rows name
                # only their rank, which a small integer keeps exact.
                assert torch.equal(rows[:, :-128].amin(dim=1), rows[:, :-128].amax(dim=1))
                assert torch.equal(torch.sort(rows[:, 0].long()).values, expected[:, 0])
                continue
            sources = identify_rows(rows, all_rows[kind])
            assert torch.equal(torch.sort(sources[:, 0] * num_tokens + sources[:, 1]).values,
                               expected[:, 0] * num_tokens + expected[:, 1]), \
                f'expert {expert_id}: wrong rows'
            sent = all_rows[kind][sources[:, 0], sources[:, 1]]
            if use_fp8:
                assert bool(((rows - sent).abs() <= fp8_error_bound(sent, round_scale)).all())
            else:
                assert torch.equal(rows, sent)
        return recv_values

    def check_combine(combined_x, current_x, use_fp8, round_scale):
        """Each token comes back as the sum of its valid slots' weights times
        the row its experts got (here the experts return their input)."""
        weight_sum = topk_weights.masked_fill(topk_idx == -1, 0).sum(dim=1, keepdim=True)
        ref = current_x.float() * weight_sum
        assert combined_x.dtype == torch.bfloat16 and combined_x.shape == current_x.shape
        assert torch.isnan(combined_x).sum().item() == 0
        # fp32 accumulation rounded once to bf16; fp8 adds each slot's rounding.
        bound = ref.abs() * 2 ** -8 + 1e-6
        if use_fp8:
            bound = bound + weight_sum * fp8_error_bound(current_x, round_scale)
        assert bool(((combined_x.float() - ref).abs() <= bound).all()), \
            f'max error {(combined_x.float() - ref).abs().max().item()}'
        diff = calc_diff(combined_x, ref)
        if not round_scale:
            assert diff < (9e-4 if use_fp8 else 1e-5), f'{diff=}, {use_fp8=}'

    cases = [(kind, current_x, return_recv_hook, use_fp8, round_scale, zero_copy)
             for kind, current_x in (('rank-valued', x), ('random', x_pure_rand))
             for return_recv_hook in (False, True)
             for use_fp8 in (False, True)
             for round_scale in ((False, True) if use_fp8 else (False, ))
             for zero_copy in (False, True)]
    for num_times, (kind, current_x, return_recv_hook, use_fp8, round_scale, zero_copy) in \
            enumerate(cases):
        # Every other case dispatches twice, so that both halves of the
        # buffer serve a dispatch that is then combined.
        for _ in range((num_times % 2) + 1):
            cumulative_local_expert_recv_stats = torch.zeros((num_local_experts, ), dtype=torch.int,
                                                             device=device)
            packed_recv_x, packed_recv_count, handle, event, hook = buffer.low_latency_dispatch(
                current_x, topk_idx, num_tokens, num_experts,
                cumulative_local_expert_recv_stats=cumulative_local_expert_recv_stats,
                use_fp8=use_fp8, round_scale=round_scale, async_finish=not return_recv_hook,
                return_recv_hook=return_recv_hook)
            hook() if return_recv_hook else event.current_stream_wait()
        simulated_gemm_x = check_dispatch(kind, packed_recv_x, packed_recv_count,
                                          cumulative_local_expert_recv_stats, use_fp8,
                                          round_scale).clone()

        if zero_copy:
            combine_x = buffer.get_next_low_latency_combine_buffer(handle)
            combine_x[:, :, :] = simulated_gemm_x
        else:
            combine_x = simulated_gemm_x
        out = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=device)
        combined_x, event, hook = buffer.low_latency_combine(
            combine_x, topk_idx, topk_weights, handle, zero_copy=zero_copy,
            async_finish=not return_recv_hook, return_recv_hook=return_recv_hook, out=out)
        hook() if return_recv_hook else event.current_stream_wait()
        assert combined_x.data_ptr() == out.data_ptr()
        check_combine(combined_x, current_x, use_fp8, round_scale)
    num_checked = len(cases)

    # Two micro-batches in flight, as overlapped decoding runs them: both
    # dispatches are sent before either is received, and likewise combine.
    half = num_tokens // 2
    batches = [(x_pure_rand[:half], topk_idx[:half], topk_weights[:half]),
               (x_pure_rand[half:], topk_idx[half:], topk_weights[half:])]
    dispatched = [buffer.low_latency_dispatch(bx, bidx, num_tokens, num_experts, use_fp8=False,
                                              return_recv_hook=True) for bx, bidx, _ in batches]
    for _, _, _, _, hook in dispatched:
        hook()
    combines = [buffer.low_latency_combine(recv_x, bidx, bw, handle, return_recv_hook=True)
                for (recv_x, _, handle, _, _), (_, bidx, bw) in zip(dispatched, batches)]
    for _, _, hook in combines:
        hook()
    check_combine(torch.cat([c[0] for c in combines]), x_pure_rand, use_fp8=False,
                  round_scale=False)
    num_checked += 1

    # Dispatch + combine time, every hook run at once.
    num_iterations = 10
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(num_iterations):
        packed_recv_x, _, handle, _, hook = buffer.low_latency_dispatch(
            x_pure_rand, topk_idx, num_tokens, num_experts, use_fp8=True, return_recv_hook=True)
        hook()
        _, _, hook = buffer.low_latency_combine(cast_back_packed(packed_recv_x), topk_idx,
                                                topk_weights, handle, return_recv_hook=True)
        hook()
    avg_t = (time.perf_counter() - start) / num_iterations
    if rank == 0:
        print(f'[summary] {num_checked} low-latency dispatch/combine cases passed on {num_ranks} '
              f'ranks ({num_tokens} tokens, hidden {hidden}, top-{num_topk} of {num_experts} '
              f'experts); fp8 dispatch + combine avg_t={avg_t * 1e3:.2f} ms', flush=True)


def test_loop(local_rank: int, num_local_ranks: int, args: argparse.Namespace, port: int):
    rank, num_ranks, group = init_dist(local_rank, num_local_ranks, port)
    num_tokens, hidden = args.num_tokens, args.hidden
    num_topk, num_experts = args.num_topk, args.num_experts

    num_rdma_bytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(num_tokens, hidden, num_ranks,
                                                                   num_experts)
    if local_rank == 0:
        print(f'Allocating buffer size: {num_rdma_bytes / 1e6} MB ...', flush=True)
    buffer = deep_ep.Buffer(group, 0, num_rdma_bytes, low_latency_mode=True,
                            num_qps_per_rank=num_experts // num_ranks, explicitly_destroy=True)
    buffer.clean_low_latency_buffer(num_tokens, hidden, num_experts)
    test_main(num_tokens, hidden, num_experts, num_topk, rank, num_ranks, group, buffer, seed=1)

    buffer.destroy()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    parser = rank_parser('Test low-latency EP kernels')
    parser.add_argument('--num-tokens', type=int, default=64, help='tokens per rank (default: 64)')
    parser.add_argument('--hidden', type=int, default=512,
                        help='hidden size, a multiple of 128 (default: 512)')
    parser.add_argument('--num-topk', type=int, default=4, help='experts per token (default: 4)')
    parser.add_argument('--num-experts', type=int, default=None,
                        help='experts in all, a multiple of the rank count (default: 4 per rank)')
    args = parser.parse_args()
    args.num_experts = args.num_experts or 4 * args.num_processes
    spawn_ranks(test_loop, args.num_processes, args)
