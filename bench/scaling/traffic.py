"""What one rank moves in one op, by link: the protocol of each mode reduced to averages.

Both modes are written here the way epcomm and DeepEP run them (they agree on what crosses
each link; they differ in how):
- Low-latency: one record per (token, top-k slot), put straight to the expert's rank; ranks of
  the same node are reached over NVLink, the others over the network (docs/low_latency.md).
- Normal, one node: one row per (token, destination rank), over NVLink.
- Normal, several nodes: two hops. A token crosses the network at most once per destination
  node, to the rank of that node on its rail, which forwards it over NVLink to the ranks of its
  node that need it (docs/transports.md, "Hierarchical path"; DeepEP's internode kernels).
Combine moves the same rows back the same way, as bf16.

`logical_bytes` is what the published tables divide by to report a bandwidth, taken from their
test scripts (DeepEP tests/test_low_latency.py and tests/test_internode.py; UCCL-EP runs the
same scripts): low-latency counts every (token, slot) record, the internode normal mode every
(token, node) row including the token's own node, the intranode normal mode every received row.
"""

from dataclasses import dataclass

from routing import group_limited, uniform


@dataclass(frozen=True)
class shape:
    tokens: int  # per rank
    hidden: int
    topk: int
    experts: int


@dataclass(frozen=True)
class traffic:
    net_rows: float  # rows this rank puts on the network
    net_bytes: float
    nvl_bytes: float  # bytes this rank moves over NVLink (its own node)
    logical_bytes: float  # the published tables' byte count, see above


def ll_record_bytes(hidden):
    """An fp8 low-latency record: the row, one fp32 scale per 128 channels, 16 bytes of header;
    a multiple of 16 at every hidden DeepEP supports (docs/design.md, section 7)."""
    return hidden + hidden // 128 * 4 + 16


def fp8_row_bytes(hidden):
    """An fp8 normal-mode row with its scales, as DeepEP's test_internode counts it."""
    return hidden + hidden // 128 * 4


def bf16_row_bytes(hidden):
    return hidden * 2


def low_latency(op, s, ranks, gpus_per_node):
    row = ll_record_bytes(s.hidden) if op == "dispatch" else bf16_row_bytes(s.hidden)
    records = s.tokens * s.topk
    local = min(gpus_per_node, ranks) / ranks  # share of the experts on this rank's node
    remote = records * (1 - local)
    return traffic(net_rows=remote, net_bytes=remote * row, nvl_bytes=records * local * row,
                   logical_bytes=records * row)


def normal(op, s, ranks, gpus_per_node, fan=None):
    """`fan`: the routing's fan-out, group-limited gating by default (DeepEP's test_internode)."""
    row = fp8_row_bytes(s.hidden) if op == "dispatch" else bf16_row_bytes(s.hidden)
    nodes = max(ranks // gpus_per_node, 1)
    if fan is None:
        fan = (group_limited if nodes > 1 else uniform)(s.experts, s.topk, ranks, gpus_per_node)
    if nodes == 1:
        rows = s.tokens * fan.ranks
        return traffic(net_rows=0, net_bytes=0, nvl_bytes=rows * row, logical_bytes=rows * row)
    # Nodes are symmetric under both routings, so (nodes - 1) / nodes of the nodes a token
    # reaches are remote; every rank it reaches is fed over NVLink by its forwarder.
    remote_rows = s.tokens * fan.nodes * (nodes - 1) / nodes
    return traffic(net_rows=remote_rows, net_bytes=remote_rows * row,
                   nvl_bytes=s.tokens * fan.ranks * row,
                   logical_bytes=s.tokens * fan.nodes * row)
