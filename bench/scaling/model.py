"""The scaling model: the time of one dispatch or combine from what crosses each link.

    t = fixed + per_row * net_rows + max(net_bytes / net_bw, nvl_bytes / nvl_bw)

`fixed` is what every op pays whatever it moves (launch, the count or ready signals' round
trip, the final barrier); `per_row` is the cost of each row put on the network beyond its bytes
(issuing it, on a proxy the hop to the CPU, its completion); the last term is the links, NVLink
and the network working at once. Bandwidths are the platform's published figures; `fixed` and
`per_row` are fitted, per platform and mode, by least squares on the dispatch rows of a published
table, and the combine rows are then predictions, as are the scales the table does not reach.
"""

from dataclasses import dataclass

import traffic as tr


@dataclass(frozen=True)
class costs:
    fixed_us: float
    us_per_row: float
    net_gbps: float
    nvl_gbps: float


def link_us(t, net_gbps, nvl_gbps):
    """The links' share: bytes over GB/s, 1 GB/s being 1000 bytes per microsecond."""
    return max(t.net_bytes / (net_gbps * 1e3), t.nvl_bytes / (nvl_gbps * 1e3))


def op_us(t, c):
    return c.fixed_us + c.us_per_row * t.net_rows + link_us(t, c.net_gbps, c.nvl_gbps)


def op_traffic(mode, op, s, ranks, gpus_per_node):
    if mode == "low_latency":
        return tr.low_latency(op, s, ranks, gpus_per_node)
    return tr.normal(op, s, ranks, gpus_per_node)


def reference_shape(mode, experts):
    """DeepSeek-V3's shapes, as every published table uses them."""
    return tr.shape(tokens=128 if mode == "low_latency" else 4096, hidden=7168, topk=8,
                    experts=experts)


def published_us(r, t):
    """A table row as a time: its latency, or its bandwidth over the bytes its script counted."""
    return r.us if r.us is not None else t.logical_bytes / (r.gbps * 1e3)


def fit(points, net_gbps, nvl_gbps):
    """Least squares of (fixed, per_row) over (traffic, measured us) points, both kept >= 0:
    where the unconstrained optimum has one negative, the best fit with it at 0."""
    xs = [t.net_rows for t, _ in points]
    ys = [us - link_us(t, net_gbps, nvl_gbps) for t, us in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    fixed = my - slope * mx
    if slope < 0:
        slope, fixed = 0.0, max(my, 0.0)
    elif fixed < 0:
        through_zero = sum(x * x for x in xs)
        slope = sum(x * y for x, y in zip(xs, ys)) / through_zero if through_zero else 0.0
        fixed, slope = 0.0, max(slope, 0.0)
    return costs(fixed, slope, net_gbps, nvl_gbps)


@dataclass(frozen=True)
class row:
    mode: str
    op: str
    ranks: int
    published_us: float
    model_us: float
    fitted: bool  # the row was one the costs were fitted on

    @property
    def ratio(self):
        return self.model_us / self.published_us


def hold_against(tab):
    """Fit each mode's costs on the table's dispatch rows; return every row, model beside
    published, and the costs per mode."""
    p = tab.platform
    rows, fitted = [], {}
    for mode in ("normal", "low_latency"):
        s = reference_shape(mode, tab.experts)
        results = [r for r in tab.results if r.mode == mode]
        if not results:
            continue
        data = [(r, op_traffic(mode, r.op, s, r.ranks, p.gpus_per_node)) for r in results]
        c = fit([(t, published_us(r, t)) for r, t in data if r.op == "dispatch"],
                p.net_gbps, p.nvl_gbps)
        fitted[mode] = c
        rows += [row(mode, r.op, r.ranks, published_us(r, t), op_us(t, c), r.op == "dispatch")
                 for r, t in data]
    return rows, fitted
