"""Published figures the scaling model is built from and held against, each with its source.

Link figures are the vendors' (or, where a table's authors state the link's usable maximum,
theirs). Result tables are copied as published: a time in microseconds where the table gives
one, else the reported bandwidth, which the model turns into a time with the same byte count
the authors' script used (traffic.py). Shapes are DeepSeek-V3's: hidden 7168, top-8, fp8
dispatch and bf16 combine; 4096 tokens per rank in normal mode, 128 in low-latency mode.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class platform:
    name: str
    net_gbps: float  # network bandwidth per GPU, one direction, GB/s
    nvl_gbps: float  # NVLink bandwidth per GPU, one direction, GB/s
    gpus_per_node: int
    source: str


@dataclass(frozen=True)
class result:
    mode: str  # "normal" or "low_latency"
    op: str  # "dispatch" or "combine"
    ranks: int
    us: float = None  # the table's latency, when it gives one
    gbps: float = None  # else its bandwidth


@dataclass(frozen=True)
class table:
    platform: platform
    experts: int
    results: list = field(default_factory=list)
    source: str = ""


H800_CX7 = platform("H800 + CX7 InfiniBand 400 Gb/s", 50.0, 160.0, 8,
                    "DeepEP docs/legacy.md: '~160 GB/s NVLink maximum bandwidth', "
                    "'CX7 InfiniBand 400 Gb/s RDMA network card (~50 GB/s maximum bandwidth)'")
P5EN = platform("p5en: H200 + 2 x 200 Gb/s EFA per GPU", 50.0, 450.0, 8,
                "AWS p5en: 16 x 200 Gb/s EFA for 8 H200 (UCCL-EP ep/README.md); NVLink 4: "
                "900 GB/s per GPU both directions (NVIDIA H200 datasheet)")
P6_B200 = platform("p6-b200: B200 + 400 Gb/s EFA per GPU", 50.0, 900.0, 8,
                   "AWS p6-b200: 8 x 400 Gb/s EFA for 8 B200 (UCCL-EP ep/README.md); NVLink 5: "
                   "1.8 TB/s per GPU both directions (NVIDIA B200 datasheet)")
# One of p5en's two 200 Gb/s EFA devices per GPU: what a rank reaches while it drives one NIC.
P5EN_ONE_NIC_GBPS = 25.0


def _rows(mode, unit, by_ranks):
    """Result rows from {ranks: (dispatch, combine)}, both in `unit` ("us" or "gbps")."""
    return [result(mode, op, ranks, **{unit: value})
            for ranks, pair in by_ranks.items() for op, value in zip(("dispatch", "combine"), pair)]


DEEPEP_V1 = table(
    H800_CX7, experts=256,
    source="DeepEP docs/legacy.md, 'Performance' (V1, NVSHMEM; normal: 4096 tokens, top-4 "
           "groups; low-latency: 128 tokens)",
    results=_rows("normal", "gbps", {8: (153, 158), 16: (43, 43), 32: (58, 57), 64: (51, 50)})
    + _rows("low_latency", "us", {8: (77, 114), 16: (118, 195), 32: (155, 273), 64: (173, 314),
                                  128: (192, 369), 256: (194, 360)}))

UCCL_EP_P5EN = table(
    P5EN, experts=288,
    source="UCCL-EP ep/README.md, 'Results', 'On p5en' (CPU proxy over EFA; its commands use "
           "288 experts)",
    results=_rows("normal", "us", {8: (500, 973), 16: (1196, 6379), 24: (1633, 6365),
                                   32: (2022, 4899)})
    + _rows("low_latency", "us", {16: (226, 293), 24: (386, 580), 32: (465, 694)}))

UCCL_EP_P6_B200 = table(
    P6_B200, experts=288,
    source="UCCL-EP ep/README.md, 'Results', 'On p6-b200' (same code and shapes as p5en)",
    results=_rows("normal", "us", {8: (571, 727), 16: (1141, 1965), 24: (1637, 2887),
                                   32: (2072, 3724)})
    + _rows("low_latency", "us", {16: (228, 318), 24: (448, 566), 32: (406, 617)}))

TABLES = [DEEPEP_V1, UCCL_EP_P5EN, UCCL_EP_P6_B200]
