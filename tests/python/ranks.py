"""Runs a test body on several ranks: one process each, a gloo group over
127.0.0.1, the parent reaping every rank (a rank that exits is then gone for
its peers at once, not a zombie) and bounding the whole run in time."""

import os
import queue
import socket
import time
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, body, args, results):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        results.put((rank, "ok", body(rank, world, *args)))
    except BaseException:  # reported to the parent, which fails the test
        results.put((rank, "raised", traceback.format_exc()))


def run_ranks(body, world, *args, timeout_s=120, allow_exit=()):
    """body(rank, world, *args) on `world` ranks; returns {rank: its return value}.
    Ranks in `allow_exit` may end without a result (the test kills them)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, body, args, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + timeout_s
    try:
        while len(got) < world - len(allow_exit) and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.05)
                got[rank] = (status, value)
            except queue.Empty:
                pass
            for p in procs:
                p.join(timeout=0)  # reaps a rank that has exited
    finally:
        for p in procs:
            p.join(timeout=max(deadline - time.monotonic(), 1))
            if p.is_alive():
                p.kill()
                p.join()
    failed = {r: v for r, (s, v) in got.items() if s != "ok"}
    assert not failed, "\n".join(f"rank {r}:\n{v}" for r, v in sorted(failed.items()))
    missing = [r for r in range(world) if r not in got and r not in allow_exit]
    assert not missing, f"ranks {missing} gave no result within {timeout_s} s"
    return {r: v for r, (_, v) in got.items()}
