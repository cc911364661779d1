"""The tables of docs/scaling.md, generated.

    python3 bench/scaling/report.py [--update docs/scaling.md] bench/scaling/measured/*.json

prints them, or rewrites each `<!-- generated: name -->` block of the document in place;
tests/scaling checks that the document holds exactly this output."""

import os
import re
import sys

import bench_fit
import model
import published as pub

SCALES = [16, 32, 64, 128, 256]
MODES = [("normal", "normal"), ("low_latency", "low-latency")]


def _table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def platforms():
    return _table(["platform", "network GB/s per GPU", "NVLink GB/s per GPU", "source"],
                  [[p.name, f"{p.net_gbps:g}", f"{p.nvl_gbps:g}", p.source]
                   for p in (pub.H800_CX7, pub.P5EN, pub.P6_B200)])


def held_against(tab):
    rows, costs = model.hold_against(tab)
    fitted = _table(["mode", "fixed us", "us per network row"],
                    [[label, f"{costs[m].fixed_us:.1f}", f"{costs[m].us_per_row:.3f}"]
                     for m, label in MODES if m in costs])
    body = _table(["mode", "op", "EP", "published us", "model us", "model / published", ""],
                  [[dict(MODES)[r.mode], r.op, r.ranks, f"{r.published_us:.0f}",
                    f"{r.model_us:.0f}", f"{r.ratio:.2f}", "fitted" if r.fitted else "predicted"]
                   for r in rows])
    return f"{tab.platform.name}; {tab.source}.\n\n{fitted}\n\n{body}"


def predictions():
    """EP 16 to 256 on p5en (EFA and NVLink) at DeepSeek-V3's shapes, 256 experts: the links
    alone, and the links with each published design's fitted costs."""
    deepep = model.hold_against(pub.DEEPEP_V1)[1]
    proxy = model.hold_against(pub.UCCL_EP_P5EN)[1]
    p = pub.P5EN
    rows = []
    for mode, label in MODES:
        s = model.reference_shape(mode, 256)
        for op in ("dispatch", "combine"):
            for ranks in SCALES:
                t = model.op_traffic(mode, op, s, ranks, p.gpus_per_node)
                links = model.link_us(t, p.net_gbps, p.nvl_gbps)
                gpu = model.op_us(t, model.costs(deepep[mode].fixed_us, deepep[mode].us_per_row,
                                                 p.net_gbps, p.nvl_gbps))
                cpu = model.op_us(t, model.costs(proxy[mode].fixed_us, proxy[mode].us_per_row,
                                                 p.net_gbps, p.nvl_gbps))
                one_nic = model.op_us(t, model.costs(proxy[mode].fixed_us,
                                                     proxy[mode].us_per_row, pub.P5EN_ONE_NIC_GBPS,
                                                     p.nvl_gbps))
                rows.append([label, op, ranks, f"{t.net_rows:.0f}", f"{t.net_bytes / 1e6:.1f}",
                             f"{links:.0f}", f"{gpu:.0f}", f"{cpu:.0f}",
                             f"{t.logical_bytes / (cpu * 1e3):.0f}", f"{one_nic:.0f}"])
    return _table(["mode", "op", "EP", "network rows", "network MB", "links only us",
                   "GPU-initiated us", "CPU proxy us", "CPU proxy GB/s (logical)",
                   "CPU proxy, one NIC us"], rows)


def measured(paths):
    out = []
    for path in paths:
        doc, fits = bench_fit.load(path)
        out.append(f"`measured/{os.path.basename(path)}`: `{doc['command']}`, {doc['ranks']} ranks "
                   f"on {doc['cpus']} CPUs, {doc['date']}:")
        out.append(_table(["transport", "mode", "op", "contender", "fixed us", "us per row",
                           "GB/s", "points", "worst error"],
                          [[m.transport, m.mode, m.op, m.contender, f"{m.fixed_us:.0f}",
                            f"{m.us_per_row:.3f}", "-" if m.gbps == float("inf") else f"{m.gbps:.1f}",
                            m.points,
                            f"{m.worst_error:.0%}"]
                           for m in fits if m.op != "dispatch+combine"]))
    return "\n\n".join(out)


def blocks(bench_paths):
    parts = [("platforms", platforms())]
    parts += [(f"held against {t.platform.name.split(':')[0]}", held_against(t))
              for t in pub.TABLES]
    parts += [("predictions", predictions()), ("measured", measured(bench_paths))]
    return {name: f"<!-- generated: {name} -->\n{text}\n<!-- end -->" for name, text in parts}


def render(bench_paths):
    return "\n\n".join(blocks(bench_paths).values())


# A block: its opening line, any lines but another block's opening, its closing line.
BLOCK = re.compile(r"<!-- generated: ([^\n]*?) -->\n(?:(?:(?!<!-- generated: ).)*?\n)?<!-- end -->",
                   re.S)


def update(document, bench_paths):
    """The document with each generated block replaced by its current text."""
    new = blocks(bench_paths)
    return BLOCK.sub(lambda m: new[m.group(1)], document)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--update"]:
        with open(args[1]) as f:
            text = update(f.read(), args[2:])
        with open(args[1], "w") as f:
            f.write(text)
    else:
        print(render(args))
