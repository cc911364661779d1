"""Normal mode through epcomm.Buffer on CPU tensors, against reference.py."""

import pytest
import torch

import epcomm
import reference as ref
from epcomm import fp8
from ranks import run_ranks

EXPERTS, HIDDEN, TOPK = 12, 256, 3


def _inputs(seed, world, tokens, kind, dtype):
    idxs = ref.routing(seed, world, tokens, EXPERTS, TOPK, kind)
    xs = [ref.values(seed * 100 + s, i.size(0), HIDDEN, dtype) for s, i in enumerate(idxs)]
    g = torch.Generator().manual_seed(seed + 7)
    ws = [torch.rand(i.size(0), TOPK, generator=g) for i in idxs]
    return xs, idxs, ws


def _dispatch_and_check(buf, rank, world, xs, idxs, ws, scales=None, **kw):
    x = (xs[rank], scales[rank]) if scales is not None else xs[rank]
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idxs[rank], EXPERTS)
    assert torch.equal(in_rank, ref.destinations(world, EXPERTS, idxs[rank]))
    assert per_rank.tolist() == in_rank.sum(dim=0).tolist()
    got = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                       num_tokens_per_expert=per_expert, topk_idx=idxs[rank],
                       topk_weights=ws[rank], **kw)
    recv_x, recv_idx, recv_w, counts, handle, event = got
    event.current_stream_wait()
    want_x, want_s, want_idx, want_w, want_src, want_counts = ref.dispatch(
        rank, world, EXPERTS, xs, idxs, ws, scales)
    n = want_x.size(0)
    if scales is not None:
        recv_x, recv_s = recv_x
        assert torch.equal(recv_s[:n], want_s)
    rows = kw.get("num_worst_tokens") or n
    assert recv_x.size(0) == rows and recv_idx.size(0) == rows
    assert torch.equal(recv_x[:n], want_x)
    assert torch.equal(recv_idx[:n], want_idx)
    assert torch.equal(recv_w[:n], want_w)
    assert bool((recv_idx[n:] == -1).all())  # padding routes nowhere
    assert torch.equal(handle.recv_src_idx[:n], want_src)
    align = kw.get("expert_alignment", 1)
    # With num_worst_tokens DeepEP returns no per-expert list (no host sync).
    assert counts == ([] if kw.get("num_worst_tokens") else
                      [(c + align - 1) // align * align for c in want_counts])
    return recv_x[:n], recv_w[:n], handle


def _buffer():
    return epcomm.Buffer(None, num_nvl_bytes=1 << 24, timeout_ms=20_000)


def _round_trip(buf, rank, world, dtype, tokens, kind, seed):
    xs, idxs, ws = _inputs(seed, world, tokens, kind, dtype)
    recv_x, recv_w, handle = _dispatch_and_check(buf, rank, world, xs, idxs, ws)
    # Each rank returns its copy times (rank + 1): the sum names who answered.
    combined, combined_w, _ = buf.combine((recv_x.float() * (rank + 1)).to(dtype), handle,
                                          topk_weights=recv_w)
    in_rank = ref.destinations(world, EXPERTS, idxs[rank])
    want = ref.combine(xs[rank], in_rank, lambda r: r + 1)
    assert torch.equal(combined.float(), want.to(dtype).float())
    assert torch.equal(combined_w, torch.where(idxs[rank] >= 0, ws[rank], torch.zeros_like(ws[rank])))


def _scenarios(rank, world, dtype):
    # One Buffer through every scenario: calls follow each other on it.
    buf = _buffer()
    for seed, (tokens, kind) in enumerate([(16, "random"), (12, "holes"), (9, "one_rank"),
                                           ([0, 5, 17, 3][:world], "random")]):
        _round_trip(buf, rank, world, dtype, tokens, kind, seed)


@pytest.mark.parametrize("world,dtype", [(2, torch.bfloat16), (3, torch.float32),
                                         (4, torch.bfloat16)])
def test_round_trip(world, dtype):
    run_ranks(_scenarios, world, dtype)


def _fp8(rank, world):
    buf = _buffer()
    _, idxs, ws = _inputs(3, world, 10, "holes", torch.float32)
    g = torch.Generator().manual_seed(5)
    # Any e4m3 byte but NaN: dispatch moves bytes, it does not interpret them.
    xs = [torch.randint(0, 0x7F, (i.size(0), HIDDEN), generator=g, dtype=torch.uint8) |
          (torch.randint(0, 2, (i.size(0), HIDDEN), generator=g, dtype=torch.uint8) << 7)
          for i in idxs]
    scales = [torch.rand(i.size(0), HIDDEN // 128, generator=g) for i in idxs]
    recv_x, recv_w, handle = _dispatch_and_check(buf, rank, world, xs, idxs, ws, scales)
    # fp8 tokens combine in bf16.
    y = ref.e4m3_to_float(recv_x).nan_to_num(0).clamp(-2, 2).round().to(torch.bfloat16)
    combined, _, _ = buf.combine(y, handle)
    back = [ref.e4m3_to_float(x).nan_to_num(0).clamp(-2, 2).round() for x in xs]
    want = ref.combine(back[rank], ref.destinations(world, EXPERTS, idxs[rank]), lambda r: 1)
    assert torch.equal(combined.float(), want)
    # fp8 rows combine in bf16, as in DeepEP: fp32 y is refused on every rank
    # (each passes it), before anything moves.
    try:
        buf.combine(y.float(), handle)
        raise AssertionError("fp32 y accepted for an fp8 dispatch")
    except epcomm.Error as e:
        assert e.rank == rank and e.op == "combine", str(e)
        assert "this buffer serves bf16, not fp32" in str(e), str(e)
    # The same Buffer then serves bf16, from the engine that served fp8: one
    # set of regions for DeepEP's two token types.
    _round_trip(buf, rank, world, torch.bfloat16, 8, "random", 4)
    assert len(buf._normal) == 1


def test_fp8_and_bf16_on_one_buffer():
    run_ranks(_fp8, 2)


def test_fp8_casts():
    # Every byte decodes as the reference decoder says; encoding a byte's own
    # value gives the byte back (0x80, -0, aside); values between two codes
    # go to the nearer (the even one on a tie) and beyond 448 saturate.
    codes = torch.arange(256).to(torch.uint8)
    want = ref.e4m3_to_float(codes)
    assert torch.equal(torch.isnan(fp8.E4M3), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert torch.equal(fp8.E4M3[finite], want[finite])
    kept = finite & (codes != 0x80)
    assert torch.equal(fp8.to_e4m3_bytes(want[kept]), codes[kept])
    halfway = torch.tensor([1.0625, 1.1875, 1000.0, -1000.0, 1.07])
    assert fp8.to_e4m3_bytes(halfway).tolist() == [0x38, 0x3A, 0x7E, 0xFE, 0x38 + 1]
    # Per token: each 128-channel block's largest magnitude becomes 448,
    # and casting back is within e4m3's rounding (2^-4 relative).
    x = ref.values(5, 6, 256, torch.bfloat16)
    x_fp8, scales = fp8.per_token_cast_to_fp8(x)
    assert x_fp8.dtype == torch.uint8 and x_fp8.shape == x.shape and scales.shape == (6, 2)
    blocks = fp8.E4M3[x_fp8.long()].abs().unflatten(1, (-1, 128))
    assert torch.equal(blocks.amax(dim=2), torch.full((6, 2), fp8.E4M3_MAX))
    back = fp8.per_token_cast_back(x_fp8, scales)
    assert bool(((back - x.float()).abs() <= x.float().abs() / 16 + 1e-6).all())
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8.per_token_cast_to_fp8(x[:, :100])


def _budget(rank, world):
    # num_nvl_bytes is a byte budget, as DeepEP's: 16 KiB leaves a window of a
    # few rows per peer, and 64 tokens move through it in rounds, with the
    # reference's results, with enable_shrink too; a Buffer sized for whole
    # calls takes no window.
    small = epcomm.Buffer(None, num_nvl_bytes=1 << 14, timeout_ms=20_000)
    shrinking = epcomm.Buffer(None, num_nvl_bytes=1 << 14, enable_shrink=True, timeout_ms=20_000)
    whole = epcomm.Buffer(None, num_max_tokens_per_rank=64, timeout_ms=20_000)
    for seed, dtype in enumerate([torch.bfloat16, torch.float32, torch.bfloat16]):
        for buf in (small, shrinking, whole):
            _round_trip(buf, rank, world, dtype, 64, "random", 20 + seed)
    for key in ("bf16/fp8", "fp32"):
        for buf in (small, shrinking):
            assert 1 <= buf._normal[key][0].window_rows <= 8, buf._normal[key][0].window_rows
        assert whole._normal[key][0].window_rows == 0


def test_byte_budget_moves_large_dispatches_in_rounds():
    run_ranks(_budget, 3)


def _shrink_in_rounds(rank, world):
    # enable_shrink under a byte budget: after the first call the last rank
    # exits, and the survivors' calls, each in rounds through windows of a few
    # rows, go on without it: its tokens are not received, rows for its
    # experts are dropped and its share of every combine is left out.
    import os
    buf = epcomm.Buffer(None, num_nvl_bytes=1 << 14, enable_shrink=True, timeout_ms=20_000)
    lost = world - 1
    for seed in range(3):
        xs, idxs, ws = _inputs(60 + seed, world, 64, "random", torch.bfloat16)
        gone = seed > 0
        local = EXPERTS // world
        kept = [torch.where(gone & ((i // local == lost) | (s == lost)), torch.full_like(i, -1), i)
                for s, i in enumerate(idxs)]
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idxs[rank], EXPERTS)
        recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
            xs[rank], num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=idxs[rank], topk_weights=ws[rank])
        want_x, _, want_idx, want_w, want_src, want_counts = ref.dispatch(
            rank, world, EXPERTS, xs, kept, ws)
        assert torch.equal(recv_x, want_x) and torch.equal(recv_idx, want_idx)
        assert torch.equal(recv_w, want_w) and torch.equal(handle.recv_src_idx, want_src)
        assert counts == want_counts
        combined, combined_w, _ = buf.combine((recv_x.float() * (rank + 1)).bfloat16(), handle,
                                              topk_weights=recv_w)
        want = ref.combine(xs[rank], ref.destinations(world, EXPERTS, kept[rank]), lambda r: r + 1)
        assert torch.equal(combined.float(), want.bfloat16().float())
        assert torch.equal(combined_w, torch.where(kept[rank] >= 0, ws[rank],
                                                   torch.zeros_like(ws[rank])))
        if rank == lost:
            os._exit(0)
    assert 1 <= buf._normal["bf16/fp8"][0].window_rows <= 8
    assert buf.lost_ranks() == [lost]


def test_shrink_under_a_byte_budget_goes_on_without_an_exited_rank():
    run_ranks(_shrink_in_rounds, 3, allow_exit=(2,), timeout_s=90)


def _options(rank, world):
    buf = _buffer()
    xs, idxs, ws = _inputs(8, world, 12, "random", torch.bfloat16)
    recv_x, _, handle = _dispatch_and_check(buf, rank, world, xs, idxs, ws, expert_alignment=8,
                                            num_worst_tokens=world * 12)
    # A cached dispatch of other rows along the same routing.
    other = [ref.values(900 + s, x.size(0), HIDDEN, torch.bfloat16) for s, x in enumerate(xs)]
    cached = buf.dispatch(other[rank], handle=handle)
    assert all(v is None for v in cached[1:5])
    want_x = ref.dispatch(rank, world, EXPERTS, other, idxs, ws)[0]
    assert torch.equal(cached[0], want_x)
    # Rows of another token type along the same routing (fp32 gradients
    # along a bf16 forward's): the Buffer's first fp32 call.
    other32 = [ref.values(950 + s, x.size(0), HIDDEN, torch.float32) for s, x in enumerate(xs)]
    cached32 = buf.dispatch(other32[rank], handle=handle)
    assert cached32[0].dtype == torch.float32
    assert torch.equal(cached32[0], ref.dispatch(rank, world, EXPERTS, other32, idxs, ws)[0])
    # combine with both biases, from the buffer's own send area (no copy).
    y = buf.get_combine_buffer(handle)
    y.copy_(recv_x)
    b0 = ref.values(31, xs[rank].size(0), HIDDEN, torch.bfloat16)
    b1 = ref.values(32, xs[rank].size(0), HIDDEN, torch.bfloat16)
    combined, weights, _ = buf.combine(y, handle, bias=(b0, b1))
    assert weights is None
    want = ref.combine(xs[rank], ref.destinations(world, EXPERTS, idxs[rank]), lambda r: 1)
    assert torch.equal(combined.float(), (want + b0.float() + b1.float()).bfloat16().float())


def test_cached_dispatch_alignment_worst_case_bias():
    run_ranks(_options, 3)


def _async_combine(rank, world):
    buf = _buffer()
    xs, idxs, ws = _inputs(21, world, 14, "random", torch.bfloat16)
    recv_x, recv_w, handle = _dispatch_and_check(buf, rank, world, xs, idxs, ws)
    want, want_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)

    # async_finish: the outputs are the synchronous call's once waited for.
    out, out_w, event = buf.combine(recv_x, handle, topk_weights=recv_w, async_finish=True)
    assert event.event is not None
    with event:
        pass
    assert torch.equal(out, want) and torch.equal(out_w, want_w)
    event.current_stream_wait()  # a second wait returns at once

    # A pending combine dropped unwaited finishes before its tensors go; the
    # next call (previous_event: another pending combine) sees a whole buffer.
    buf.combine(recv_x.clone(), handle, async_finish=True)
    _, _, pending = buf.combine(recv_x, handle, async_finish=True)
    recv_x, recv_w, handle = _dispatch_and_check(buf, rank, world, xs, idxs, ws,
                                                 previous_event=pending)

    # An error of the call on the communication thread is raised by the wait,
    # on every rank, naming the rank whose input was wrong.
    y = recv_x[:-1] if rank == 1 and recv_x.size(0) > 0 else recv_x
    _, _, event = buf.combine(y, handle, async_finish=True)
    try:
        event.current_stream_wait()
        raise AssertionError("a combine with rows missing on rank 1 was accepted")
    except epcomm.Error as e:
        assert e.rank == rank and e.op == "combine", str(e)
        assert e.peer == (None if rank == 1 else 1), str(e)
    out, _, event = buf.combine(recv_x, handle, async_finish=True)
    event.current_stream_wait()
    assert torch.equal(out, want)


def test_async_combine_waits_raises_and_keeps_its_tensors():
    run_ranks(_async_combine, 3)


def _bad_input(rank, world):
    buf = _buffer()
    xs, idxs, ws = _inputs(9, world, 8, "random", torch.bfloat16)
    bad = idxs[rank].clone()
    if rank == 1:
        bad[2][0] = EXPERTS + 3  # one rank's input is wrong: every rank must refuse the call
    try:
        buf.dispatch(xs[rank], num_tokens_per_expert=torch.zeros(EXPERTS), topk_idx=bad,
                     topk_weights=ws[rank])
        raise AssertionError("a dispatch with an expert id out of range was accepted")
    except epcomm.Error as e:
        assert e.rank == rank and e.op == "dispatch"
        assert e.peer == (None if rank == 1 else 1), str(e)
        assert "outside" in str(e)
    # The buffer is usable afterwards.
    _dispatch_and_check(buf, rank, world, xs, idxs, ws)


def test_bad_input_raises_on_every_rank():
    run_ranks(_bad_input, 3)


def _one_rank_fails(rank, world, seed, timeout_ms, failure):
    """A dispatch on every rank, then failure(rank, world) (a rank exits or stalls),
    then a second dispatch that must raise: (seconds it took, peer, text)."""
    import time
    buf = epcomm.Buffer(None, num_nvl_bytes=1 << 24, timeout_ms=timeout_ms)
    xs, idxs, ws = _inputs(seed, world, 8, "random", torch.bfloat16)
    _dispatch_and_check(buf, rank, world, xs, idxs, ws)
    failure(rank, world)
    start = time.monotonic()
    try:
        _dispatch_and_check(buf, rank, world, xs, idxs, ws)
        raise AssertionError("the second dispatch went through")
    except epcomm.Error as e:
        assert e.rank == rank and e.op == "dispatch", str(e)
        return time.monotonic() - start, e.peer, str(e)


def _exit_last(rank, world):
    import os
    if rank == world - 1:
        os._exit(0)  # this rank's process is gone before the next call


def _killed(rank, world):
    return _one_rank_fails(rank, world, 10, 4_000, _exit_last)


def test_killed_rank_raises_on_survivors():
    got = run_ranks(_killed, 3, allow_exit=(2,), timeout_s=60)
    for rank, (elapsed, peer, text) in got.items():
        assert elapsed < 4.0 + 2.0, f"rank {rank} raised after {elapsed:.1f} s: {text}"
        assert peer is not None, text


def _stall_first(rank, world):
    import time
    if rank == 0:
        time.sleep(4)  # alive but late: the others' deadlines expire first


def _stalled(rank, world):
    return _one_rank_fails(rank, world, 12, 2_000, _stall_first)


def test_stalled_rank_raises_at_the_deadline_on_every_rank():
    got = run_ranks(_stalled, 3, timeout_s=60)
    for rank, (elapsed, peer, text) in got.items():
        if rank != 0:
            assert elapsed < 2.0 + 2.0, f"rank {rank} raised after {elapsed:.1f} s: {text}"
            assert peer is not None, text
