"""Normal-mode dispatch and combine within one node, written as a DeepEP user
writes them (DeepEP's tests/test_intranode.py is the model): every result is
checked against what this script computes itself in plain torch.

    python test_intranode.py --num-processes 4
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist

import epcomm as deep_ep
from epcomm import fp8
from epcomm.fp8 import per_token_cast_to_fp8

device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')


# -- helpers -----------------------------------------------------------------------------------

def init_dist(local_rank: int, num_local_ranks: int, port: int):
    backend = 'nccl' if device.type == 'cuda' else 'gloo'
    if device.type == 'cuda':
        torch.cuda.set_device(local_rank)
    else:
        # Every rank is a process on a few shared cores: more than one
        # intra-op thread each only oversubscribes them.
        torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f'tcp://127.0.0.1:{port}',
                            world_size=num_local_ranks, rank=local_rank)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(num_local_ranks)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - the cosine-like similarity DeepEP's tests use; shifted by one so
    that all-zero tensors compare equal."""
    x, y = x.double() + 1, y.double() + 1
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def per_token_cast_back(x_fp8: torch.Tensor, x_scales: torch.Tensor) -> torch.Tensor:
    """bf16, as DeepEP's test utility returns them: the values of fp8 rows."""
    return fp8.per_token_cast_back(x_fp8, x_scales).to(torch.bfloat16)


def gather(t: torch.Tensor, group) -> torch.Tensor:
    """Every rank's `t`, stacked: [num_ranks, *t.shape]."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.stack(parts)


def identify_rows(recv_rows: torch.Tensor, all_rows: torch.Tensor) -> torch.Tensor:
    """[N][2] (source rank, source token) of each received row: the nearest of
    the rows every rank sent (all_rows [R][T][H]). Sent rows are distinct, so
    a row that arrived intact (or within fp8 error) names its source."""
    num_tokens = all_rows.size(1)
    if recv_rows.size(0) == 0:
        return torch.empty((0, 2), dtype=torch.long, device=recv_rows.device)
    nearest = torch.cdist(recv_rows.float(), all_rows.flatten(0, 1).float()).argmin(dim=1)
    return torch.stack([nearest // num_tokens, nearest % num_tokens], dim=1)


# -- the test ----------------------------------------------------------------------------------

def test_main(num_tokens: int, hidden: int, num_topk: int, num_experts: int, rank: int,
              num_ranks: int, buffer: deep_ep.Buffer, group: dist.ProcessGroup):
    assert num_experts % num_ranks == 0
    experts_per_rank = num_experts // num_ranks
    if rank == 0:
        print(f'[config] num_tokens={num_tokens}, hidden={hidden}, num_topk={num_topk}, '
              f'num_experts={num_experts}, num_ranks={num_ranks}, device={device.type}', flush=True)

    # Token rows: `x` says where it came from (the rank in every channel but
    # the last 128, which hold the token index), `x_pure_rand` is noise, and
    # `x_e4m3` is that noise cast to fp8 with column-major scales, as DeepEP's
    # kernels take them.
    x = torch.ones((num_tokens, hidden), dtype=torch.bfloat16, device=device) * rank
    x[:, -128:] = torch.arange(num_tokens, device=device).to(torch.bfloat16).view(-1, 1)
    x_pure_rand = torch.randn((num_tokens, hidden), dtype=torch.bfloat16, device=device)
    x_e4m3 = per_token_cast_to_fp8(x_pure_rand)
    x_e4m3 = (x_e4m3[0], x_e4m3[1].T.contiguous().T)

    scores = torch.randn((num_tokens, num_experts), dtype=torch.float32, device=device).abs() + 1
    topk_idx = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=False)[1]
    # Some slots select no expert (-1). Slot 0 always does, so that every
    # token goes to at least one rank and combine's average below is defined.
    no_expert = torch.rand((num_tokens, num_topk), device=device) < 0.1
    no_expert[:, 0] = False
    topk_idx.masked_fill_(no_expert, -1)
    topk_weights = torch.randn((num_tokens, num_topk), dtype=torch.float32, device=device)

    # The layout, computed here in plain torch.
    rank_of_slot = torch.where(topk_idx >= 0, topk_idx // experts_per_rank, -1)
    is_token_in_rank = (rank_of_slot.unsqueeze(2) ==
                        torch.arange(num_ranks, device=device).view(1, 1, -1)).any(dim=1)
    num_tokens_per_rank = is_token_in_rank.sum(dim=0).int()
    all_experts = torch.arange(num_experts, device=device)
    num_tokens_per_expert = (topk_idx.unsqueeze(2) == all_experts).sum(dim=(0, 1)).int()

    ref_num_tokens_per_rank, ref_num_tokens_per_rdma_rank, ref_num_tokens_per_expert, \
        ref_is_token_in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
    assert torch.equal(ref_num_tokens_per_rank, num_tokens_per_rank)
    assert ref_num_tokens_per_rdma_rank is None  # one node: no RDMA ranks
    assert torch.equal(ref_num_tokens_per_expert, num_tokens_per_expert)
    assert torch.equal(ref_is_token_in_rank, is_token_in_rank)
    if rank == 0:
        print('[layout] get_dispatch_layout matches the reference', flush=True)

    # What this rank must receive, from every rank's routing.
    all_topk_idx = gather(topk_idx, group)
    all_topk_weights = gather(topk_weights, group)
    all_is_token_in_rank = gather(is_token_in_rank.int(), group).bool()
    expected_sources = all_is_token_in_rank[:, :, rank].nonzero()  # (rank, token), ascending
    my_experts = torch.arange(rank * experts_per_rank, (rank + 1) * experts_per_rank, device=device)
    gbl_num_tokens_per_expert = (all_topk_idx.unsqueeze(3) == my_experts).sum(dim=(0, 1, 2))
    all_x = gather(x.float(), group)
    all_x_pure_rand = gather(x_pure_rand.float(), group)
    all_x_e4m3 = (gather(x_e4m3[0], group), gather(x_e4m3[1], group))

    def check_recv(recv_x, sent, recv_topk_idx=None, recv_topk_weights=None):
        """recv_x holds exactly the rows this rank is owed, grouped by source
        rank in rank order (DeepEP's rank_prefix_matrix layout), each
        bit-for-bit as sent; the top-k rows name this rank's experts by local
        index (-1 and weight 0 for the rest)."""
        if isinstance(recv_x, tuple):
            recv_values = per_token_cast_back(*recv_x).float()
            all_values = per_token_cast_back(sent[0].flatten(0, 1), sent[1].flatten(0, 1))
            all_values = all_values.float().view(num_ranks, num_tokens, hidden)
        else:
            recv_values, all_values = recv_x.float(), sent
        assert recv_values.size(0) == expected_sources.size(0), \
            f'{recv_values.size(0)} rows received, {expected_sources.size(0)} expected'
        sources = identify_rows(recv_values, all_values)
        src_rank, src_token = sources[:, 0], sources[:, 1]
        if isinstance(recv_x, tuple):
            assert torch.equal(recv_x[0], sent[0][src_rank, src_token])
            assert torch.equal(recv_x[1], sent[1][src_rank, src_token])
        else:
            assert torch.equal(recv_values, all_values[src_rank, src_token])
        assert bool((src_rank[1:] >= src_rank[:-1]).all()), 'rows not grouped by source rank'
        assert torch.equal(torch.sort(src_rank * num_tokens + src_token).values,
                           expected_sources[:, 0] * num_tokens + expected_sources[:, 1])
        if recv_topk_idx is None:
            return
        global_idx = all_topk_idx[src_rank, src_token]
        local = global_idx - rank * experts_per_rank
        is_local = (global_idx >= 0) & (local >= 0) & (local < experts_per_rank)
        assert torch.equal(recv_topk_idx, torch.where(is_local, local, torch.full_like(local, -1)))
        assert torch.equal(recv_topk_weights, torch.where(
            is_local, all_topk_weights[src_rank, src_token], torch.zeros_like(recv_topk_weights)))

    config = deep_ep.Buffer.get_dispatch_config(num_ranks)
    inputs = ((x_pure_rand, all_x_pure_rand, x_pure_rand.float()),
              (x, all_x, x.float()),
              (x_e4m3, all_x_e4m3, per_token_cast_back(*x_e4m3).float()))
    cases = [(previous_mode, async_mode, current_x, sent, ref_x, with_topk)
             for previous_mode in (False, True)
             for async_mode in (False, True)
             for current_x, sent, ref_x in inputs
             for with_topk in (False, True)]
    start = time.perf_counter()
    for previous_mode, async_mode, current_x, sent, ref_x, with_topk in cases:
        if rank == 0:
            print(f'[testing] Running with {"FP8" if isinstance(current_x, tuple) else "BF16"}, '
                  f'{"with" if with_topk else "without"} top-k (async={async_mode}, '
                  f'previous={previous_mode}) ...', flush=True, end='')
        dispatch_args = {'x': current_x, 'num_tokens_per_rank': num_tokens_per_rank,
                         'is_token_in_rank': is_token_in_rank,
                         'num_tokens_per_expert': num_tokens_per_expert,
                         'config': config, 'async_finish': async_mode}
        if with_topk:
            dispatch_args.update({'topk_idx': topk_idx, 'topk_weights': topk_weights})
        if previous_mode:
            # The layout computed asynchronously, and the dispatch ordered after it.
            *layout, layout_event = buffer.get_dispatch_layout(topk_idx, num_experts,
                                                               async_finish=True)
            dispatch_args.update({'num_tokens_per_rank': layout[0],
                                  'num_tokens_per_rdma_rank': layout[1],
                                  'num_tokens_per_expert': layout[2],
                                  'is_token_in_rank': layout[3],
                                  'previous_event': layout_event,
                                  'allocate_on_comm_stream': True})
        recv_x, recv_topk_idx, recv_topk_weights, recv_num_tokens_per_expert_list, handle, event = \
            buffer.dispatch(**dispatch_args)
        if async_mode:
            event.current_stream_wait()

        assert recv_num_tokens_per_expert_list == gbl_num_tokens_per_expert.tolist()
        check_recv(recv_x, sent, recv_topk_idx, recv_topk_weights)
        if with_topk:
            assert recv_topk_idx.dtype == topk_idx.dtype
            for i, count in enumerate(recv_num_tokens_per_expert_list):
                assert recv_topk_idx.eq(i).sum().item() == count

            # num_worst_tokens: results padded to a fixed row count, no
            # per-expert list; the real rows come first, unchanged.
            num_worst_tokens = num_tokens * num_ranks
            recv_worst_x, recv_worst_topk_idx, recv_worst_topk_weights, empty_list, _, event = \
                buffer.dispatch(**dispatch_args, num_worst_tokens=num_worst_tokens)
            if async_mode:
                event.current_stream_wait()
            num_recv = recv_topk_idx.size(0)
            worst_rows, rows = (recv_worst_x[0], recv_x[0]) if isinstance(recv_x, tuple) \
                else (recv_worst_x, recv_x)
            assert len(empty_list) == 0
            assert worst_rows.size(0) == recv_worst_topk_idx.size(0) == \
                recv_worst_topk_weights.size(0) == num_worst_tokens
            assert torch.equal(worst_rows[:num_recv], rows)
            assert torch.equal(recv_worst_topk_idx[:num_recv], recv_topk_idx)
            assert torch.equal(recv_worst_topk_weights[:num_recv], recv_topk_weights)
            assert bool((recv_worst_topk_idx[num_recv:] == -1).all())

        # Cached dispatch: the handle's routing, this x again.
        cached_args = {'x': current_x, 'handle': handle, 'config': config,
                       'async_finish': async_mode}
        if async_mode:
            cached_args['previous_event'] = event
        cached_recv_x, _, _, _, _, event = buffer.dispatch(**cached_args)
        if async_mode:
            event.current_stream_wait()
        check_recv(cached_recv_x, sent)

        # Combine sends each received row back and sums a token's rows over
        # the ranks it went to.
        combine_args = {'x': per_token_cast_back(*recv_x) if isinstance(recv_x, tuple) else recv_x,
                        'handle': handle, 'config': config, 'async_finish': async_mode}
        if with_topk:
            combine_args['topk_weights'] = recv_topk_weights
        if previous_mode and async_mode:
            combine_args['previous_event'] = event
        combined_x, combined_topk_weights, event = buffer.combine(**combine_args)
        if async_mode:
            event.current_stream_wait()
        check_x = combined_x.float() / is_token_in_rank.sum(dim=1).unsqueeze(1)
        assert calc_diff(check_x, ref_x) < 5e-6, calc_diff(check_x, ref_x)
        if with_topk:
            # Every slot's weight comes back from the one rank holding its expert.
            assert torch.equal(combined_topk_weights, topk_weights.masked_fill(topk_idx < 0, 0))
        else:
            assert combined_topk_weights is None
        if rank == 0:
            print(' passed', flush=True)
    num_checked = len(cases)

    # expert_alignment rounds every local expert's count up to a multiple of it.
    expert_alignment = 8
    _, _, _, aligned_list, handle, _ = buffer.dispatch(
        x_pure_rand, num_tokens_per_rank=num_tokens_per_rank, is_token_in_rank=is_token_in_rank,
        num_tokens_per_expert=num_tokens_per_expert, topk_idx=topk_idx, topk_weights=topk_weights,
        expert_alignment=expert_alignment, config=config)
    assert aligned_list == [(c + expert_alignment - 1) // expert_alignment * expert_alignment
                            for c in gbl_num_tokens_per_expert.tolist()]

    # Combine adds the bias once per token: one tensor, or two summed.
    recv_x, _, _, _, handle, _ = buffer.dispatch(
        x_pure_rand, num_tokens_per_rank=num_tokens_per_rank, is_token_in_rank=is_token_in_rank,
        num_tokens_per_expert=num_tokens_per_expert, topk_idx=topk_idx, topk_weights=topk_weights,
        config=config)
    bias_0 = torch.randn((num_tokens, hidden), dtype=torch.bfloat16, device=device)
    bias_1 = torch.randn((num_tokens, hidden), dtype=torch.bfloat16, device=device)
    summed = x_pure_rand.float() * is_token_in_rank.sum(dim=1).unsqueeze(1)
    for bias, ref in ((bias_0, summed + bias_0.float()),
                      ((bias_0, bias_1), summed + bias_0.float() + bias_1.float())):
        combined_x, _, _ = buffer.combine(recv_x, handle, bias=bias, config=config)
        assert calc_diff(combined_x.float(), ref) < 5e-6, calc_diff(combined_x.float(), ref)
    num_checked += 3

    elapsed = time.perf_counter() - start
    if rank == 0:
        print(f'[summary] {num_checked} dispatch/combine cases passed on {num_ranks} ranks '
              f'in {elapsed:.2f} s', flush=True)


def test_loop(local_rank: int, num_local_ranks: int, port: int):
    rank, num_ranks, group = init_dist(local_rank, num_local_ranks, port)
    num_tokens, hidden, num_topk = 128, 512, 4
    num_experts = 4 * num_ranks
    # Room for every token of every rank at bf16, and above DeepEP's own
    # NVL size hint for these shapes.
    num_nvl_bytes = int(32e6)
    buffer = deep_ep.Buffer(group, num_nvl_bytes, 0, low_latency_mode=False, num_qps_per_rank=1)
    torch.manual_seed(rank)

    test_main(num_tokens, hidden, num_topk, num_experts, rank, num_ranks, buffer, group)

    dist.barrier()
    dist.destroy_process_group()


def rank_parser(description: str) -> argparse.ArgumentParser:
    """The script's arguments: --num-processes, and what the caller adds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--num-processes', type=int, default=2 if device.type == 'cpu' else 8,
                        help='number of ranks to spawn (default: 2 on CPU, 8 on GPU)')
    return parser


def spawn_ranks(loop, num_processes: int, *args):
    """Runs loop(local_rank, num_processes, *args, port) on that many local
    processes, which meet on loopback only."""
    os.environ.setdefault('GLOO_SOCKET_IFNAME', 'lo')
    port = int(os.environ.get('MASTER_PORT', 0)) or free_port()
    torch.multiprocessing.spawn(loop, args=(num_processes, *args, port), nprocs=num_processes)


if __name__ == '__main__':
    args = rank_parser('Test intranode dispatch and combine').parse_args()
    spawn_ranks(test_loop, args.num_processes)
