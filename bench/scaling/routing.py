"""How far one token fans out under the routings the published benchmarks use.

Everything in the scaling model is per rank and per token on average, so the only facts it needs
from a routing are: onto how many distinct ranks, and onto how many distinct nodes, do a token's
top-k experts fall. DeepEP's and UCCL-EP's low-latency tests draw the top-k uniformly over all
experts; their internode normal-mode tests first pick `min(nodes, 4)` node groups by each group's
best score and then the top-k within those groups (DeepSeek-V3's group-limited gating). The
first has a closed form; the second is sampled, with a fixed seed so the model is reproducible.
"""

from dataclasses import dataclass
from functools import lru_cache
from math import comb
import random


@dataclass(frozen=True)
class fanout:
    ranks: float  # distinct ranks holding at least one of a token's experts
    nodes: float  # distinct nodes holding at least one


def blocks_hit(pool, block, k):
    """Expected number of `block`-sized blocks of a `pool` of experts that hold at least one of
    k distinct experts drawn uniformly from the pool."""
    if pool % block:
        raise ValueError(f"{pool} experts do not split into blocks of {block}")
    return pool // block * (1 - comb(pool - block, k) / comb(pool, k))


def uniform(experts, topk, ranks, gpus_per_node):
    """Top-k uniform over all experts (DeepEP's test_low_latency)."""
    nodes = max(ranks // gpus_per_node, 1)
    return fanout(blocks_hit(experts, experts // ranks, topk),
                  blocks_hit(experts, experts // nodes, topk))


@lru_cache(maxsize=None)
def group_limited(experts, topk, ranks, gpus_per_node, samples=4000, seed=7):
    """Top-k within the `min(nodes, 4)` nodes whose best expert scores highest, scores i.i.d.
    (DeepEP's test_internode). Sampled: the choice of groups biases which experts win."""
    nodes = max(ranks // gpus_per_node, 1)
    groups = min(nodes, 4)
    per_rank, per_node = experts // ranks, experts // nodes
    rng = random.Random(seed)
    hit_ranks = hit_nodes = 0
    for _ in range(samples):
        scores = [rng.random() for _ in range(experts)]
        best = sorted(range(nodes), key=lambda n: max(scores[n * per_node:(n + 1) * per_node]))
        allowed = [e for n in best[-groups:] for e in range(n * per_node, (n + 1) * per_node)]
        chosen = sorted(allowed, key=scores.__getitem__)[-topk:]
        hit_ranks += len({e // per_rank for e in chosen})
        hit_nodes += len({e // per_node for e in chosen})
    return fanout(hit_ranks / samples, hit_nodes / samples)
