"""Checks of the scaling model (bench/scaling, docs/scaling.md): its routing averages against
sampling, its byte counts against epcomm-bench's, its fit against the published tables it
claims to match, and the document against the generator."""

import json
import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "scaling"))

import bench_fit  # noqa: E402
import model  # noqa: E402
import published as pub  # noqa: E402
import report  # noqa: E402
import routing  # noqa: E402
import traffic  # noqa: E402

MEASURED = sorted(os.path.join(ROOT, "bench", "scaling", "measured", f)
                  for f in os.listdir(os.path.join(ROOT, "bench", "scaling", "measured")))


def sampled_uniform(experts, topk, ranks, gpus_per_node, samples=20000):
    """The uniform routing drawn, not computed: the closed form's independent check."""
    rng = random.Random(3)
    per_rank, per_node = experts // ranks, experts // max(ranks // gpus_per_node, 1)
    hit_ranks = hit_nodes = 0
    for _ in range(samples):
        chosen = rng.sample(range(experts), topk)
        hit_ranks += len({e // per_rank for e in chosen})
        hit_nodes += len({e // per_node for e in chosen})
    return hit_ranks / samples, hit_nodes / samples


@pytest.mark.parametrize("experts,ranks", [(64, 2), (256, 16), (288, 24), (256, 256)])
def test_uniform_fanout_matches_sampling(experts, ranks):
    # 20000 draws: the sampling error is below 0.1%.
    fan = routing.uniform(experts, 8, ranks, 8)
    ranks_hit, nodes_hit = sampled_uniform(experts, 8, ranks, 8)
    assert fan.ranks == pytest.approx(ranks_hit, rel=0.005)
    assert fan.nodes == pytest.approx(nodes_hit, rel=0.005)


@pytest.mark.parametrize("ranks", [16, 32])
def test_group_limited_is_uniform_when_every_node_is_a_group(ranks):
    # Up to 4 nodes every node group is picked, so the gating cannot restrict anything.
    fan = routing.group_limited(256, 8, ranks, 8)
    ranks_hit, nodes_hit = sampled_uniform(256, 8, ranks, 8)
    assert fan.ranks == pytest.approx(ranks_hit, rel=0.01)
    assert fan.nodes == pytest.approx(nodes_hit, rel=0.01)


def test_group_limited_reaches_at_most_four_nodes():
    fan = routing.group_limited(256, 8, 128, 8)
    assert 3.5 < fan.nodes <= 4.0
    assert fan.ranks <= 8.0


def test_low_latency_traffic_splits_by_node():
    s = traffic.shape(tokens=128, hidden=7168, topk=8, experts=256)
    t = traffic.low_latency("dispatch", s, 32, 8)
    assert t.logical_bytes == 128 * 8 * 7408  # DeepEP's test_low_latency count
    assert t.net_rows == 128 * 8 * 24 / 32
    assert t.net_bytes + t.nvl_bytes == pytest.approx(t.logical_bytes)


@pytest.mark.parametrize("path", MEASURED)
def test_normal_bytes_match_the_bench(path):
    # epcomm-bench counts what the busiest rank must move; on random routing the model's mean
    # is within a few percent of it.
    with open(path) as f:
        doc = json.load(f)
    recs = [r for r in doc["records"] if r["mode"] == "normal" and r["op"] == "dispatch"]
    assert recs
    for r in recs:
        s = traffic.shape(r["tokens"], r["hidden"], r["topk"], r["experts"])
        fan = routing.uniform(s.experts, s.topk, r["ranks"], r["ranks"])
        rows = s.tokens * fan.ranks
        row = bench_fit.row_bytes("normal", "dispatch", r["dtype"], s.hidden)
        assert rows * row == pytest.approx(r["bytes_per_rank"], rel=0.05), r


@pytest.mark.parametrize("tab,low,high", [(pub.DEEPEP_V1, 0.85, 1.15),
                                           (pub.UCCL_EP_P6_B200, 0.8, 1.3)])
def test_model_holds_against_published_tables(tab, low, high):
    rows, _ = model.hold_against(tab)
    off = [(r.mode, r.op, r.ranks, round(r.ratio, 2)) for r in rows if not low <= r.ratio <= high]
    assert not off, f"{tab.platform.name}: model / published outside [{low}, {high}]: {off}"


def test_model_is_off_where_the_document_says():
    # docs/scaling.md: UCCL-EP's p5en normal combine falls as EP grows; no link-bound model
    # follows it. If a new table or model change makes it agree, the document must change.
    rows, _ = model.hold_against(pub.UCCL_EP_P5EN)
    combine = {r.ranks: r.ratio for r in rows if r.mode == "normal" and r.op == "combine"}
    assert combine[16] < 0.5 and combine[24] < 0.5


def test_predictions_grow_with_scale_and_respect_the_links():
    deepep = model.hold_against(pub.DEEPEP_V1)[1]
    for mode in ("normal", "low_latency"):
        s = model.reference_shape(mode, 256)
        last = 0.0
        for ranks in report.SCALES:
            t = model.op_traffic(mode, "dispatch", s, ranks, 8)
            c = model.costs(deepep[mode].fixed_us, deepep[mode].us_per_row, 50.0, 450.0)
            us = model.op_us(t, c)
            assert us >= t.net_bytes / 50e3
            assert us >= last
            last = us


def test_bench_fit_describes_epcomm_over_shared_memory():
    # Over tcp on loopback the fit is poor, and docs/scaling.md says so; over shared memory the
    # three costs describe every point of both sweeps to within 35%.
    _, fits = bench_fit.load(os.path.join(ROOT, "bench", "scaling", "measured",
                                          "shm-2ranks-sweep.json"))
    mine = [m for m in fits if m.contender == "epcomm" and m.op != "dispatch+combine"]
    assert len(mine) == 4
    for m in mine:
        assert m.worst_error < 0.35, m


def test_document_holds_the_generated_tables():
    with open(os.path.join(ROOT, "docs", "scaling.md")) as f:
        doc = f.read()
    assert sorted(report.BLOCK.findall(doc)) == sorted(report.blocks(MEASURED))
    assert report.update(doc, MEASURED) == doc, \
        "docs/scaling.md is stale: run bench/scaling/report.py --update (see the document)"
