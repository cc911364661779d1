"""The bootstrap of a Buffer through its torch.distributed process group.

The C++ buffers need an all-gather of small byte strings and a barrier while
they are built; both go through the group's own collectives, so epcomm opens
no port of its own. Blocks travel as uint8 tensors on the device the group's
backend needs (CPU for gloo, CUDA for nccl).
"""

import datetime

import torch
import torch.distributed as dist


def _device_for(group):
    if dist.get_backend(group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _wait(work, timeout_s, what):
    # A collective that outlives its deadline is reported like the C++
    # bootstrap's own deadlines: as a failure the caller turns into epcomm.Error.
    if not work.wait(datetime.timedelta(seconds=max(timeout_s, 0.001))):
        raise TimeoutError(f"{what} did not complete within {timeout_s:.3f} s")


def bootstrap_of(group, extension):
    """A GroupBootstrap for `group` (None: the default group)."""
    group = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    device = _device_for(group)
    local_world = _local_world_size(group, world)

    def all_gather(block, timeout_s):
        mine = torch.frombuffer(bytearray(block), dtype=torch.uint8).to(device) \
            if len(block) else torch.empty(0, dtype=torch.uint8, device=device)
        blocks = [torch.empty_like(mine) for _ in range(world)]
        _wait(dist.all_gather(blocks, mine, group=group, async_op=True), timeout_s,
              "the process group's all_gather")
        return [bytes(b.cpu().numpy().tobytes()) if b.numel() else b"" for b in blocks]

    def barrier(timeout_s):
        _wait(dist.barrier(group=group, async_op=True), timeout_s, "the process group's barrier")

    return extension.GroupBootstrap(rank, world, rank % local_world, local_world,
                                    all_gather, barrier)


def _local_world_size(group, world):
    """Ranks of this group on this host: torchrun's LOCAL_WORLD_SIZE when the
    whole group is one job's world, else counted by host name."""
    import os
    import socket
    if group is dist.group.WORLD and "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    return hosts.count(socket.gethostname())
