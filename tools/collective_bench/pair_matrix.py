"""What a pairwise run says: a slow node (slow with every partner) apart from a slow link (slow with one).

Pure, stdlib only, and constant memory per node: the pair figures are read in passes from a re-iterable
source (a list, or a callable that yields them again), never held as an n x n matrix.

Pass 1: the figure of a healthy pair: the 75th percentile of pair busbw and the 25th of latency, from
log-spaced histograms (bins 2% wide, so within 1%). Not the median: one slow node among 4 is in half
of the 6 pairs, and would drag the median down to itself. A pair is slow when it failed or hung, its
busbw is below (1 - margin) x that reference, or its latency above (1 + latency_margin) x its reference.
Pass 2: per node, how many partners it had and how many of those pairs were slow. A node is slow when it
was slow with at least `node_share` of its partners and with at least two (one partner cannot tell a
node from a link). A good node is slow only with the bad nodes it met, a small share unless most of the
fleet is bad, so one share rule separates them without a search.
Pass 3: slow pairs with neither end a slow node are slow links (listed up to `link_cap`, all counted).
When more than half the nodes would be named, nothing is: the fault is fleet-wide (`fleet_wide`).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Callable, Iterable

_LOG_STEP = math.log(1.02)
_LOW, _HIGH = 1e-9, 1e9
_BINS = int(math.log(_HIGH / _LOW) / _LOG_STEP) + 1


@dataclass(frozen=True)
class PairFigure:
    a: int
    b: int
    busbw_gbps: float | None = None
    latency_us: float | None = None
    ok: bool = True           # False: the pair failed or hung; True with no busbw: ran at healthy rates but its
    #                           deadline cut it (isolation.pairwise): a partner that is not slow, with no figure


@dataclass
class NodeSummary:
    node: int
    partners: int
    slow_partners: int
    failed_partners: int
    geomean_busbw_gbps: float | None
    worst_busbw_gbps: float | None
    worst_partner: int | None


@dataclass
class PairVerdict:
    median_busbw_gbps: float | None
    median_latency_us: float | None
    reference_busbw_gbps: float | None   # a healthy pair: 75th percentile of busbw
    reference_latency_us: float | None   # 25th percentile of latency
    busbw_floor_gbps: float | None
    latency_ceiling_us: float | None
    slow_nodes: list[NodeSummary] = field(default_factory=list)
    slow_links: list[PairFigure] = field(default_factory=list)
    slow_link_count: int = 0
    undetermined: list[PairFigure] = field(default_factory=list)  # slow pairs of nodes with one partner
    pairs: int = 0
    fleet_wide: bool = False  # more than half the nodes would be named: the fault is not in a few nodes


class _Histogram:
    """Log-spaced counts: a median within 1% in constant memory."""

    def __init__(self):
        self.counts, self.total = array("L", bytes(8 * _BINS)), 0

    def add(self, value: float) -> None:
        clamped = min(max(value, _LOW), _HIGH)
        self.counts[min(_BINS - 1, int(math.log(clamped / _LOW) / _LOG_STEP))] += 1
        self.total += 1

    def quantile(self, q: float) -> float | None:
        if not self.total:
            return None
        seen, rank = 0, max(1.0, q * self.total)
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return _LOW * math.exp((i + 0.5) * _LOG_STEP)
        return None


def _source(figures) -> Callable[[], Iterable[PairFigure]]:
    if callable(figures):
        return figures
    if iter(figures) is figures:
        raise ValueError("figures: give a list or a callable that yields the pairs again (read in passes)")
    return lambda: figures


def _check(n: int, f: PairFigure) -> None:
    if not (0 <= f.a < n and 0 <= f.b < n) or f.a == f.b:
        raise ValueError(f"figures: pair ({f.a}, {f.b}) is not two different nodes of 0..{n - 1}")


def analyse_pairs(n: int, figures, *, margin: float = 0.5, latency_margin: float | None = 4.0,
                  node_share: float = 0.75, link_cap: int = 64) -> PairVerdict:
    """Name slow nodes and slow links among n nodes from their pair figures (see the module doc); latency_margin
    None judges no pair by its latency (and states no ceiling)."""
    if not 0 < margin < 1:
        raise ValueError(f"margin: {margin} is outside (0, 1)")
    if (latency_margin is not None and latency_margin <= 0) or not 0.5 < node_share <= 1:
        raise ValueError("latency_margin must be > 0 and node_share in (0.5, 1]")
    read = _source(figures)
    bw_hist, lat_hist = _Histogram(), _Histogram()
    pairs = 0
    for f in read():
        _check(n, f)
        pairs += 1
        if f.ok and f.busbw_gbps is not None:
            bw_hist.add(f.busbw_gbps)
        if f.ok and f.latency_us is not None:
            lat_hist.add(f.latency_us)
    bw_ref, lat_ref = bw_hist.quantile(0.75), lat_hist.quantile(0.25)
    floor = bw_ref * (1 - margin) if bw_ref else None
    ceiling = lat_ref * (1 + latency_margin) if lat_ref and latency_margin is not None else None

    slow = slow_rule(floor, ceiling)
    nodes = _per_node(n, read, slow)
    verdict = PairVerdict(median_busbw_gbps=bw_hist.quantile(0.5), median_latency_us=lat_hist.quantile(0.5),
                          reference_busbw_gbps=bw_ref, reference_latency_us=lat_ref, busbw_floor_gbps=floor,
                          latency_ceiling_us=ceiling, pairs=pairs)
    named = {i for i in range(n) if nodes.partners[i] >= 2 and nodes.slow[i] >= 2
             and nodes.slow[i] >= node_share * nodes.partners[i]}
    if len(named) > n / 2:
        verdict.fleet_wide = True
        return verdict
    verdict.slow_nodes = [nodes.summary(i) for i in sorted(named)]
    for f in read():
        if not slow(f) or f.a in named or f.b in named:
            continue
        if nodes.partners[f.a] < 2 and nodes.partners[f.b] < 2:
            if len(verdict.undetermined) < link_cap:
                verdict.undetermined.append(f)
            continue
        verdict.slow_link_count += 1
        if len(verdict.slow_links) < link_cap:
            verdict.slow_links.append(f)
    return verdict


def slow_rule(floor: float | None, ceiling: float | None) -> Callable[[PairFigure], bool]:
    """A pair is slow when it failed, its busbw is under `floor` or its latency over `ceiling`."""
    def slow(f: PairFigure) -> bool:
        return (not f.ok or (floor is not None and f.busbw_gbps is not None and f.busbw_gbps < floor)
                or (ceiling is not None and f.latency_us is not None and f.latency_us > ceiling))
    return slow


class _NodeTable:
    """Fixed-size per-node counters (a few dozen bytes a node whatever the number of partners)."""

    def __init__(self, n: int):
        self.partners, self.slow, self.failed = array("I", bytes(4 * n)), array("I", bytes(4 * n)), array("I", bytes(4 * n))
        self.log_sum, self.counted = array("d", bytes(8 * n)), array("I", bytes(4 * n))
        self.worst, self.worst_partner = array("d", [math.inf]) * n, array("i", [-1]) * n

    def add(self, node: int, other: int, f: PairFigure, is_slow: bool) -> None:
        self.partners[node] += 1
        self.slow[node] += is_slow
        self.failed[node] += not f.ok
        if f.ok and f.busbw_gbps:
            self.log_sum[node] += math.log(f.busbw_gbps)
            self.counted[node] += 1
        if f.ok and f.busbw_gbps is None:
            return   # no figure to be its worst
        value = f.busbw_gbps if f.ok else 0.0
        if value < self.worst[node]:
            self.worst[node], self.worst_partner[node] = value, other

    def summary(self, i: int) -> NodeSummary:
        geo = math.exp(self.log_sum[i] / self.counted[i]) if self.counted[i] else None
        return NodeSummary(node=i, partners=self.partners[i], slow_partners=self.slow[i],
                           failed_partners=self.failed[i], geomean_busbw_gbps=geo,
                           worst_busbw_gbps=None if math.isinf(self.worst[i]) else self.worst[i],
                           worst_partner=None if self.worst_partner[i] < 0 else self.worst_partner[i])


def _per_node(n: int, read, slow) -> _NodeTable:
    table = _NodeTable(n)
    for f in read():
        is_slow = slow(f)
        table.add(f.a, f.b, f, is_slow)
        table.add(f.b, f.a, f, is_slow)
    return table


def node_summaries(n: int, figures) -> list[NodeSummary]:
    """Every node's counters (for the per-node table of a small run); thresholds as analyse_pairs."""
    verdict = analyse_pairs(n, figures)
    table = _per_node(n, _source(figures), slow_rule(verdict.busbw_floor_gbps, verdict.latency_ceiling_us))
    return [table.summary(i) for i in range(n)]
