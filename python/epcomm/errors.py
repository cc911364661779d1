"""epcomm.Error raised from the Python layer, worded like the C++ engine's."""

from ._epcomm import Error


def error(rank, op, cause, peer=None):
    """An epcomm.Error for `rank`'s `op`, attributed to `peer` (None: no peer)."""
    text = f"epcomm: rank {rank}: {op}"
    if peer is not None:
        text += f" (peer {peer})"
    e = Error(f"{text}: {cause}")
    e.rank, e.op, e.peer, e.cause = rank, op, peer, cause
    return e


def unsupported(rank, op, argument, why):
    """The error for an argument epcomm cannot honour yet: it names the argument."""
    return error(rank, op, f"{argument} is not supported: {why}")
