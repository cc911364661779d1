"""The model's three costs measured on epcomm itself: a fit to an epcomm-bench --sweep record.

    t = fixed + per_row * rows + bytes / bandwidth

for each (transport, mode, op) and each contender the bench times in the same run (epcomm, the
MPI baseline, the raw link), over the token sweep and the hidden sweep: the first grows rows and
bytes together, the second bytes alone, which is what separates the per-row cost from the
bandwidth. Rows and bytes are what epcomm's protocol moves (traffic.py), not the bench's
deduplicated byte count: a low-latency record goes once per (token, top-k slot).
"""

from dataclasses import dataclass
import json

import traffic as tr
from routing import uniform


@dataclass(frozen=True)
class measured:
    transport: str
    mode: str
    op: str
    contender: str
    fixed_us: float
    us_per_row: float
    gbps: float  # inf when the bytes explain nothing the rows do not
    points: int
    worst_error: float  # largest |fit / measured - 1| over the points


def row_bytes(mode, op, dtype, hidden):
    if op == "combine":  # fp8 dispatches combine in bf16
        return hidden * (4 if dtype == "fp32" else 2)
    if dtype == "fp8_e4m3":
        return tr.ll_record_bytes(hidden) if mode == "low-latency" else tr.fp8_row_bytes(hidden)
    return hidden * {"bf16": 2, "fp32": 4}[dtype]


def moved(rec):
    """(rows, bytes) one rank moves in this record's op, with all ranks on one host."""
    ops = ["dispatch", "combine"] if rec["op"] == "dispatch+combine" else [rec["op"]]
    if rec["mode"] == "low-latency":
        rows = rec["tokens"] * rec["topk"]
    else:
        rows = rec["tokens"] * uniform(rec["experts"], rec["topk"], rec["ranks"], rec["ranks"]).ranks
    return rows * len(ops), sum(rows * row_bytes(rec["mode"], op, rec["dtype"], rec["hidden"])
                                for op in ops)


def _solve(a, b):
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-300:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def least_squares(columns, ys):
    """Non-negative least squares over few columns: the full fit, else the best fit over the
    largest subsets of columns whose coefficients all come out >= 0."""
    k = len(columns)
    best = None
    for mask in sorted(range(1, 1 << k), key=lambda m: -bin(m).count("1")):
        use = [i for i in range(k) if mask >> i & 1]
        a = [[sum(columns[i][p] * columns[j][p] for p in range(len(ys))) for j in use] for i in use]
        b = [sum(columns[i][p] * ys[p] for p in range(len(ys))) for i in use]
        x = _solve(a, b)
        if x is None or min(x) < 0:
            continue
        coef = [0.0] * k
        for i, v in zip(use, x):
            coef[i] = v
        err = sum((sum(coef[i] * columns[i][p] for i in range(k)) - ys[p]) ** 2
                  for p in range(len(ys)))
        if best is None or (bin(mask).count("1"), -err) > (bin(best[0]).count("1"), -best[1]):
            best = (mask, err, coef)
    return best[2]


def fit_records(records):
    groups = {}
    for rec in records:
        groups.setdefault((rec["transport"], rec["mode"], rec["op"]), []).append(rec)
    out = []
    for (transport, mode, op), recs in sorted(groups.items()):
        xs = [moved(r) for r in recs]
        for contender in ("epcomm", "baseline", "peer_copy"):
            # Files written before the per-peer copy got its name call it roofline.
            key = contender + "_us" if contender != "peer_copy" or "peer_copy_us" in recs[0] \
                else "roofline_us"
            ys = [r[key] for r in recs]
            # Relative errors: the sweep spans two orders of magnitude in time.
            fixed, per_row, per_byte = least_squares(
                [[1.0 / y for y in ys], [x[0] / y for x, y in zip(xs, ys)],
                 [x[1] / y for x, y in zip(xs, ys)]], [1.0] * len(ys))
            fitted = [fixed + per_row * x[0] + per_byte * x[1] for x in xs]
            out.append(measured(transport, mode, op, contender, fixed, per_row,
                                1e-3 / per_byte if per_byte > 0 else float("inf"), len(recs),
                                max(abs(f / y - 1) for f, y in zip(fitted, ys))))
    return out


def load(path):
    with open(path) as f:
        doc = json.load(f)
    return doc, fit_records(doc["records"])
