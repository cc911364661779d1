"""Low-latency mode through epcomm.Buffer on CPU tensors, against reference.py."""

import pytest
import torch

import epcomm
import reference as ref
from ranks import run_ranks

EXPERTS, HIDDEN, TOPK, MAX_TOKENS = 12, 256, 3, 16


def _inputs(seed, world, tokens, kind):
    idxs = ref.routing(seed, world, tokens, EXPERTS, TOPK, kind)
    xs = [ref.values(seed * 100 + s, i.size(0), HIDDEN, torch.bfloat16) for s, i in enumerate(idxs)]
    g = torch.Generator().manual_seed(seed + 7)
    ws = [torch.rand(i.size(0), TOPK, generator=g) for i in idxs]
    return xs, idxs, ws


def _dequantized(recv_x, use_fp8):
    """recv_x as float: fp8 payload times its per-128-channel scales, which
    come as DeepEP lays them out: token-contiguous fp32, or with use_ue8m0
    int32 words of four exponent bytes (decoded here byte by byte)."""
    if not use_fp8:
        return recv_x.float()
    data, scales = recv_x
    local, rows, groups = data.size(0), data.size(1), data.size(2) // 128
    assert scales.stride()[1] == 1  # token-contiguous, as DeepGEMM reads it
    if scales.dtype == torch.int32:
        assert scales.shape == (local, rows, (groups + 3) // 4)
        shifts = torch.arange(4, dtype=torch.int32) * 8  # byte k: group 4 * word + k
        exponents = ((scales.unsqueeze(-1) >> shifts) & 0xFF).flatten(2)[:, :, :groups]
        scales = (exponents << 23).view(torch.float32)
    else:
        assert scales.shape == (local, rows, groups)
    # e4m3 keeps 3 mantissa bits.
    return ref.e4m3_to_float(data) * scales.repeat_interleave(128, dim=2)


def _check_received(rank, world, xs, idxs, recv_x, recv_count, handle, use_fp8):
    rows = ref.low_latency_rows(rank, world, EXPERTS, idxs)
    assert recv_count.tolist() == [len(r) for r in rows]
    got = _dequantized(recv_x, use_fp8)
    for e, expected in enumerate(rows):
        # The handle says where each row came from (DeepEP's src_info): the
        # same rows as the reference, each carrying its source's token.
        sources = [tuple(v) for v in handle.src_info[e][:len(expected)].tolist()]
        assert sorted(sources) == sorted(expected)
        for row, (s, t, _) in enumerate(sources):
            want = xs[s][t].float()
            tol = 0.0625 * want.abs() + 1e-6 if use_fp8 else 0
            assert bool(((got[e][row] - want).abs() <= tol).all()), (e, row, s, t)


def _round_trip(buf, rank, world, seed, tokens, kind, use_fp8, use_hook=False, zero_copy=False,
                use_ue8m0=False):
    """One dispatch and combine on `buf`, each checked against the reference."""
    xs, idxs, ws = _inputs(seed, world, tokens, kind)
    recv_x, recv_count, handle, _, hook = buf.low_latency_dispatch(
        xs[rank], idxs[rank], MAX_TOKENS, EXPERTS, use_fp8=use_fp8, round_scale=use_ue8m0,
        use_ue8m0=use_ue8m0, return_recv_hook=use_hook)
    if use_hook:
        hook()
    _check_received(rank, world, xs, idxs, recv_x, recv_count, handle, use_fp8)
    # Each expert returns its rows times (global expert id + 1).
    local = EXPERTS // world
    factors = torch.arange(rank * local, (rank + 1) * local, dtype=torch.float32) + 1
    y = (_dequantized(recv_x, use_fp8) * factors.view(-1, 1, 1)).bfloat16()
    if zero_copy:
        buf.get_next_low_latency_combine_buffer(handle).copy_(y)
        y = buf.get_next_low_latency_combine_buffer(handle)
    combined, _, hook = buf.low_latency_combine(y, idxs[rank], ws[rank], handle,
                                                zero_copy=zero_copy, return_recv_hook=use_hook)
    if use_hook:
        hook()
    valid = idxs[rank] >= 0
    scale = (ws[rank] * torch.where(valid, idxs[rank] + 1, 0)).sum(dim=1, keepdim=True)
    want = xs[rank].float() * scale
    tol = (0.07 if use_fp8 else 0.02) * want.abs().clamp(min=1)
    assert bool(((combined.float() - want).abs() <= tol).all())


def _round_trips(rank, world, use_fp8, use_hook, zero_copy, use_ue8m0=False):
    buf = epcomm.Buffer(None, low_latency_mode=True, timeout_ms=20_000)
    # Several calls in a row: both parities, reused.
    for seed, (tokens, kind) in enumerate([(MAX_TOKENS, "random"), (7, "holes"),
                                           ([3, 0, 16, 9][:world], "one_rank"), (5, "random")]):
        _round_trip(buf, rank, world, seed, tokens, kind, use_fp8, use_hook, zero_copy, use_ue8m0)


@pytest.mark.parametrize("world,use_fp8,use_hook,zero_copy", [
    (2, False, False, False), (3, True, True, False), (2, True, False, True),
    (4, False, True, True)])
def test_round_trips(world, use_fp8, use_hook, zero_copy):
    run_ranks(_round_trips, world, use_fp8, use_hook, zero_copy)


@pytest.mark.parametrize("use_hook", [False, True])
def test_ue8m0_scales(use_hook):
    run_ranks(_round_trips, 2, True, use_hook, False, True)


def _wires_on_one_engine(rank, world):
    buf = epcomm.Buffer(None, low_latency_mode=True, timeout_ms=20_000)
    for seed, use_fp8 in enumerate([True, False, False, True, True]):
        _round_trip(buf, rank, world, 40 + seed, 9, "random", use_fp8, use_hook=seed % 2 == 1)
    # DeepEP's use_fp8 is per call: one engine serves both.
    assert len(buf._low_latency) == 1
    # Rank 1 dispatches fp8 among bf16: every rank fails naming a rank of the
    # other wire, and the engine serves the next call.
    xs, idxs, _ = _inputs(47, world, 4, "random")
    try:
        buf.low_latency_dispatch(xs[rank], idxs[rank], MAX_TOKENS, EXPERTS, use_fp8=rank == 1)
        raise AssertionError("ranks that dispatched different wires went through")
    except epcomm.Error as e:
        mine, theirs = ("fp8_e4m3", "bf16") if rank == 1 else ("bf16", "fp8_e4m3")
        assert f"that rank dispatched {theirs} records, this rank {mine}" in str(e), str(e)
        assert e.peer == (0 if rank == 1 else 1), str(e)
    _round_trip(buf, rank, world, 48, 9, "random", False)
    _round_trip(buf, rank, world, 49, 9, "random", True)


def test_low_latency_wires_on_one_engine():
    run_ranks(_wires_on_one_engine, 3)


def _unscaled_hidden(rank, world):
    """gpt-oss's hidden of 2880 has no whole 128-blocks (200 here): bf16
    calls go through the engine that also serves fp8, and an fp8 call fails
    on every rank, after which bf16 calls still go."""
    hidden = 200
    buf = epcomm.Buffer(None, low_latency_mode=True, timeout_ms=20_000)
    idxs = ref.routing(60, world, 9, EXPERTS, TOPK, "random")
    xs = [ref.values(6000 + s, i.size(0), hidden, torch.bfloat16) for s, i in enumerate(idxs)]
    ws = [torch.rand(i.size(0), TOPK, generator=torch.Generator().manual_seed(61)) for i in idxs]

    def bf16_round_trip():
        recv_x, recv_count, handle, _, _ = buf.low_latency_dispatch(
            xs[rank], idxs[rank], MAX_TOKENS, EXPERTS, use_fp8=False)
        assert recv_x.size(2) == hidden
        _check_received(rank, world, xs, idxs, recv_x, recv_count, handle, False)
        combined, _, _ = buf.low_latency_combine(recv_x, idxs[rank], ws[rank], handle)
        want = xs[rank].float() * (ws[rank] * (idxs[rank] >= 0)).sum(dim=1, keepdim=True)
        assert bool(((combined.float() - want).abs() <= 0.02 * want.abs().clamp(min=1)).all())

    bf16_round_trip()
    try:
        buf.low_latency_dispatch(xs[rank], idxs[rank], MAX_TOKENS, EXPERTS, use_fp8=True)
        raise AssertionError("an fp8 dispatch of hidden 200 was accepted")
    except epcomm.Error as e:
        assert "hidden 200 is not a multiple of 128 (fp8 scales)" in str(e), str(e)
    bf16_round_trip()


def test_bf16_with_a_hidden_of_no_whole_128_blocks():
    run_ranks(_unscaled_hidden, 2)


def _refusals(rank, world):
    buf = epcomm.Buffer(None, low_latency_mode=True, timeout_ms=20_000)
    xs, idxs, ws = _inputs(21, world, 6, "random")
    bad = idxs[rank].clone()
    if rank == 0:
        bad[1][1] = -5
    try:
        buf.low_latency_dispatch(xs[rank], bad, MAX_TOKENS, EXPERTS, use_fp8=False)
        raise AssertionError("a dispatch with a negative expert id was accepted")
    except epcomm.Error as e:
        assert e.rank == rank and e.op == "low-latency dispatch", str(e)
    try:
        buf.low_latency_dispatch(xs[rank], idxs[rank], MAX_TOKENS, EXPERTS, use_ue8m0=True)
        raise AssertionError("use_ue8m0 without round_scale was accepted")
    except epcomm.Error as e:
        assert "use_ue8m0 needs use_fp8 and round_scale" in str(e)
    # Still usable.
    recv_x, recv_count, handle, _, _ = buf.low_latency_dispatch(
        xs[rank], idxs[rank], MAX_TOKENS, EXPERTS, use_fp8=False)
    _check_received(rank, world, xs, idxs, recv_x, recv_count, handle, False)
    buf.clean_low_latency_buffer(MAX_TOKENS, HIDDEN, EXPERTS)


def test_bad_input_raises_on_every_rank():
    run_ranks(_refusals, 2)


def _shrink(rank, world):
    import os
    buf = epcomm.Buffer(None, low_latency_mode=True, enable_shrink=True, timeout_ms=20_000)
    lost = world - 1
    for seed in range(3):
        xs, idxs, ws = _inputs(40 + seed, world, 8, "random")
        recv_x, recv_count, handle, _, _ = buf.low_latency_dispatch(
            xs[rank], idxs[rank], MAX_TOKENS, EXPERTS, use_fp8=False)
        gone = seed > 0  # the last rank exits after the first round
        # Rows from the lost rank are not delivered; its experts get nothing.
        sent = [i if s != lost or not gone else torch.full_like(i, -1) for s, i in enumerate(idxs)]
        _check_received(rank, world, xs, sent, recv_x, recv_count, handle, False)
        combined, _, _ = buf.low_latency_combine(recv_x * 2, idxs[rank], ws[rank], handle)
        local = EXPERTS // world
        kept = (idxs[rank] >= 0) & ~(gone & (idxs[rank] // local == lost))
        want = xs[rank].float() * 2 * torch.where(kept, ws[rank], torch.zeros_like(ws[rank])).sum(
            dim=1, keepdim=True)
        assert bool(((combined.float() - want).abs() <= 0.02 * want.abs().clamp(min=1)).all())
        if rank == lost:
            os._exit(0)
    status = torch.zeros(world, dtype=torch.int32)
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * (world - 1) + [1]
    try:
        buf.low_latency_update_mask_buffer(0, True)
        raise AssertionError("masking a live rank by hand was accepted")
    except epcomm.Error as e:
        assert "by hand" in str(e)


def test_shrink_goes_on_without_an_exited_rank():
    run_ranks(_shrink, 3, allow_exit=(2,), timeout_s=90)
