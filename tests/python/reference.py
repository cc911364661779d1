"""What dispatch and combine must produce, in plain torch, from every rank's
inputs: written from DeepEP's documented semantics, independent of the C++."""

import torch


def routing(seed, world, num_tokens, num_experts, topk, kind):
    """Every rank's topk_idx [T][K] (int64, -1 = none) for one scenario, the
    same on every rank that asks (a shared seed)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(world):
        t = num_tokens[s] if isinstance(num_tokens, list) else num_tokens
        idx = torch.stack([torch.randperm(num_experts, generator=g)[:topk] for _ in range(t)]) \
            if t else torch.empty(0, topk, dtype=torch.int64)
        if kind == "holes" and t:
            idx[torch.rand(t, topk, generator=g) < 0.3] = -1  # some slots route nowhere
            idx[0] = -1  # a token that goes nowhere at all
        elif kind == "one_rank":
            # every token's experts on rank world-1: one receiver takes everything
            per_rank = num_experts // world
            base = (world - 1) * per_rank
            idx = torch.stack([base + torch.randperm(per_rank, generator=g)[:topk]
                               for _ in range(t)]) if t else idx
        out.append(idx.to(torch.int64))
    return out


def values(seed, rows, hidden, dtype):
    """Rows whose sums over a few ranks stay exact in bf16 (quarters in [-2, 2])."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-8, 9, (rows, hidden), generator=g).float() / 4).to(dtype)


def dispatch(rank, world, num_experts, xs, idxs, ws, scales=None):
    """Rows rank `rank` receives, ordered by (source rank, source token):
    (recv_x, recv_scales, recv_topk_idx (local ids, -1 elsewhere),
    recv_topk_weights (0 elsewhere), recv_src_idx, tokens per local expert)."""
    per_rank = num_experts // world
    lo = rank * per_rank
    rows, row_scales, row_idx, row_w, src = [], [], [], [], []
    for s in range(world):
        mine = (idxs[s] >= lo) & (idxs[s] < lo + per_rank)
        for t in range(idxs[s].size(0)):
            if not bool(mine[t].any()):
                continue
            rows.append(xs[s][t])
            if scales is not None:
                row_scales.append(scales[s][t])
            row_idx.append(torch.where(mine[t], idxs[s][t] - lo, torch.full_like(idxs[s][t], -1)))
            row_w.append(torch.where(mine[t], ws[s][t], torch.zeros_like(ws[s][t])))
            src.append(t)
    hidden, topk = xs[0].size(1), idxs[0].size(1)
    stack = lambda items, shape, dtype: torch.stack(items) if items else torch.empty(shape, dtype=dtype)
    per_expert = [sum(int((i == e).sum()) for i in row_idx) for e in range(per_rank)]
    return (stack(rows, (0, hidden), xs[0].dtype),
            stack(row_scales, (0, hidden // 128), torch.float32) if scales is not None else None,
            stack(row_idx, (0, topk), torch.int64), stack(row_w, (0, topk), torch.float32),
            torch.tensor(src, dtype=torch.int32), per_expert)


def destinations(world, num_experts, idx):
    """[T][R] bool: the ranks each token is sent to."""
    per_rank = num_experts // world
    dest = torch.where(idx >= 0, idx // per_rank, torch.full_like(idx, -1))
    return torch.stack([(dest == r).any(dim=1) for r in range(world)], dim=1) \
        if idx.numel() else torch.zeros(idx.size(0), world, dtype=torch.bool)


def combine(x, in_rank, factor_of_rank):
    """A token's combined row when rank r returns its received copy times
    factor_of_rank(r): x * the sum of those factors over its destinations."""
    factors = torch.tensor([factor_of_rank(r) for r in range(in_rank.size(1))], dtype=torch.float32)
    return x.float() * (in_rank.float() * factors).sum(dim=1, keepdim=True)


def low_latency_rows(rank, world, num_experts, idxs):
    """For each local expert of `rank`: the (source rank, token, top-k slot)
    of every row it receives, in epcomm's order (source, token, slot)."""
    per_rank = num_experts // world
    out = []
    for e in range(rank * per_rank, (rank + 1) * per_rank):
        out.append([(s, t, k) for s in range(world) for t in range(idxs[s].size(0))
                    for k in range(idxs[s].size(1)) if int(idxs[s][t][k]) == e])
    return out


def e4m3_to_float(b):
    """Decodes fp8 e4m3 bytes (uint8) to float32 (no infinities; 0x7f/0xff NaN)."""
    b = b.to(torch.int32)
    sign = torch.where(b & 0x80 != 0, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).float()
    normal = (1 + man / 8) * torch.pow(2.0, exp.float() - 7)
    sub = man / 8 * 2.0 ** -6
    out = sign * torch.where(exp == 0, sub, normal)
    return torch.where((b & 0x7F) == 0x7F, torch.full_like(out, float("nan")), out)
