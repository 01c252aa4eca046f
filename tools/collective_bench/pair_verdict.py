"""What a pairwise run may name: the one verdict rule, the measured spread, confirmation, the expected gate.

The rule (tools/shared/judging.py, knowledge/data/verdict_rules.toml): a pair is slow when its busbw is
worse than a healthy pair's by more than max(margin, k x spread). The healthy pair is the 75th percentile
of all pairs (pair_matrix.py: one bad node among 4 is in half the pairs and would drag a median to
itself). The spread is measured in this run, over the pairs of nodes not suspected on the first pass:
on a quiet GPU fabric it is a few percent, on gloo over shared CPU cores it can pass 30%.

1. First pass at the rule's stated spread: which nodes look slow (to leave them out of the spread).
2. The spread of the other pairs. When k x spread passes the widest threshold the check can answer
   (`FigureRule.widest`), the answer is "inconclusive", with the spread: nothing is named for ordinary
   slowness. A pair that failed, hung or read a tenth of a healthy pair (GROSS_MARGIN) is not noise:
   those are still confirmed and named.
3. Second pass at max(margin, k x measured spread): slow nodes, slow links, undetermined pairs.
4. Confirmation: every suspect is measured again, a node with a partner measured healthy, a link or
   pair alone; only what is slow again is named. The rest is listed as unconfirmed. Where the spread was
   not measured (too few healthy pairs: one healthy pair, of 4 nodes on a loaded host), the stated spread
   is a guess, so a second measurement names only a failure, a hang, a gross deficit (GROSS_MARGIN) or a
   latency over the ceiling: a node named for 0.16 against one healthy pair's 0.394 GB/s (50% margin)
   was healthy, slowed by the load, its first evidence hangs that the load caused (cl-slow-link,
   2026-12-03). A suspect whose first figures were themselves measured grossly slow (busbw under a tenth,
   no failure or hang among them) is confirmed at the ordinary margin: two slow measurements, one gross.
   So is a node that stands apart in every figure (`stands_apart`): each of its pairs measured, each under the
   margin against the slowest of at least two healthy pairs. That needs no spread: the healthy pairs' own
   lowest figure is the bar (a node capped to a fraction of a CPU, 4 nodes: 0.140-0.147 GB/s against
   0.346-0.462, left unnamed for want of a spread; model round 7, cl-cpu-starved, 2026-12-03).
5. Expected gate: where the link has an expected figure, a healthy pair worse than it by more than the
   threshold makes the whole set the suspect (a uniformly degraded fleet is not "ok").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from ..shared.expected_busbw import expected_busbw
from ..shared.judging import FigureRule, compare, is_inconclusive, relative_spread, rule_for, threshold
from .node_groups import GroupRun
from .pair_matrix import PairFigure, PairVerdict, analyse_pairs, slow_rule

CONFIRM_ROUNDS = 3   # at most this many rounds of re-measurement; suspects beyond stay unconfirmed
MIN_PAIRS_FOR_SPREAD = 6  # the spread of fewer healthy pairs is no measurement (4 nodes, one bad: 3 pairs)
                          # and the rule's stated spread is used instead
MAX_MARGIN = 0.99    # analyse_pairs takes a fraction below 1
GROSS_MARGIN = 0.9   # a pair at a tenth of a healthy one is no noise even where the spread is too wide to
#                      judge ordinary slowness: 2-5x between healthy gloo pairs on shared cores, 45x for a
#                      50 Mbit/s link (namespace cluster, 2026-12-01); it is still named only if it repeats


def rule_for_backend(backend: str | None, margin: float | None = None) -> FigureRule:
    """busbw_gbps for NCCL; pair_busbw_gbps_gloo for gloo (TCP through CPU cores that the ranks share);
    `margin` (the caller's slow_margin) replaces the stated margin."""
    rule = rule_for("pair_busbw_gbps_gloo" if backend == "gloo" else "busbw_gbps")
    return dataclasses.replace(rule, margin=margin) if margin is not None else rule


BIG_ENOUGH_BYTES = 256 << 20  # below this (and without a measured point) busbw is not judged against expected


def expected_pair_gbps(setup: dict, rows: list[dict]) -> tuple[float | None, str]:
    """(expected all_reduce busbw of a two-node pair at the largest size measured, note) from rank 0's setup."""
    from ..shared.accelerators import match_accelerator

    gpu = (setup.get("versions") or {}).get("device_name")
    if not gpu or gpu == "cpu" or not rows:
        return None, "no expected figure for a pair of CPU (gloo) nodes: pairs are judged against each other only"
    accel = match_accelerator(gpu)
    record, note = expected_busbw(accel["id"] if accel else None, int(setup.get("local_world_size") or 1), 2,
                                  "all_reduce", setup.get("nccl_env"), setup.get("rdma_ports"))
    if not record:
        return None, note
    peak = max(r["bytes"] for r in rows)
    point = next((p for p in record.get("points", []) if p["bytes"] == peak), None)
    if point:
        return point["busbw_gbps"], record["id"]
    if peak >= BIG_ENOUGH_BYTES:
        return record["busbw_gbps"], record["id"]
    return None, f"largest size {peak >> 20} MiB is too small to judge pairs against the expected figure ({record['id']})"


@dataclass
class Confirmation:
    kind: str                       # node | link | pair
    nodes: list[int]                # the suspect node, or the two ends
    first: PairFigure | None        # the slowest first measurement (links, pairs) or None (nodes)
    again: GroupRun | None = None   # the second measurement (None: no round left, or no healthy partner)
    slow_again: bool = False
    under_margin_only: bool = False  # slow again at the ordinary margin, not grossly: not named, spread unmeasured
    apart_below_gbps: float | None = None  # stands_apart: every first pair of the node under this (see the module doc)


@dataclass
class PairJudgement:
    rule: FigureRule
    spread: float                   # relative spread of the pairs of unsuspected nodes (scaled MAD / median)
    healthy_pairs: int              # how many pairs that spread was measured over
    threshold: float                # the deficit a pair had to exceed
    inconclusive: bool
    verdict: PairVerdict            # analyse_pairs at that threshold
    confirmations: list[Confirmation] = field(default_factory=list)
    fleet_below_expected: str | None = None   # the gate's sentence when the healthy pair is below expected


def judge_pairs(n: int, figures: list[PairFigure], rule: FigureRule, run_round: Callable, *,
                latency_factor: float = 5.0, expected_gbps: float | None = None) -> PairJudgement:
    """Steps 1-5 of the module doc; run_round(groups) -> [GroupRun] re-measures suspects."""
    lat = latency_factor - 1
    first = analyse_pairs(n, figures, margin=min(threshold(rule), MAX_MARGIN), latency_margin=lat)
    left_out = set() if first.fleet_wide else {s.node for s in first.slow_nodes}
    healthy = [f.busbw_gbps for f in figures
               if f.ok and f.busbw_gbps is not None and f.a not in left_out and f.b not in left_out]
    measured = len(healthy) >= MIN_PAIRS_FOR_SPREAD
    spread = relative_spread(healthy) if measured else rule.spread
    limit = threshold(rule, spread)
    if measured and is_inconclusive(healthy, rule):
        # ordinary slowness cannot be judged, gross slowness and failure can: only pairs that failed, hung
        # or read a tenth of a healthy pair stay suspects, and are measured again like any other
        # No latency rule here: it stated a ceiling of 1e9 x the reference (8.7e12 us in model round 12).
        failing = analyse_pairs(n, figures, margin=GROSS_MARGIN, latency_margin=None)
        judged = PairJudgement(rule, spread, len(healthy), limit, True, failing)
        judged.confirmations = [] if failing.fleet_wide else confirm(n, failing, run_round)
        return judged
    final = analyse_pairs(n, figures, margin=min(limit, MAX_MARGIN), latency_margin=lat)
    judged = PairJudgement(rule, spread, len(healthy), limit, False, final)
    if expected_gbps and final.reference_busbw_gbps:
        breach = compare(final.reference_busbw_gbps, rule, {"expected figure of the link": expected_gbps}, spread)
        judged.fleet_below_expected = breach[0].sentence(rule.unit) if breach else None
    if not final.fleet_wide:
        judged.confirmations = confirm(n, final, run_round, gross_only=not measured, figures=figures,
                                       margin=min(limit, MAX_MARGIN))
    return judged


def suspects_of(verdict: PairVerdict) -> list[Confirmation]:
    """Every suspect of a verdict, to be measured again."""
    out = [Confirmation("node", [s.node], None) for s in verdict.slow_nodes]
    out += [Confirmation("link", [f.a, f.b], f) for f in verdict.slow_links]
    out += [Confirmation("pair", [f.a, f.b], f) for f in verdict.undetermined]
    return out


def confirm(n: int, verdict: PairVerdict, run_round: Callable, *, gross_only: bool = False,
            figures: list[PairFigure] = (), margin: float = 0.0) -> list[Confirmation]:
    """Measure every suspect again (up to CONFIRM_ROUNDS rounds of disjoint groups); mark what is slow again.
    gross_only (the spread was not measured): busbw names only under a tenth of a healthy pair, unless the first
    figures were measured that low or the node stands apart in every one of them (step 4)."""
    todo = suspects_of(verdict)
    suspected = {m for c in todo for m in c.nodes}
    if gross_only:
        # The bar is set by pairs that no suspect's evidence is about: a suspected link's two ends are fine with
        # their other partners (that is what makes it a link), so their other pairs are healthy ones to compare
        # with (model round 8, cl-link-and-starved-node: with link mln1-mln2 suspected, no pair was left and mln4,
        # 0.117-0.129 GB/s with every partner against 0.391-0.472, was not named).
        node_suspects = {c.nodes[0] for c in todo if c.kind == "node"}
        suspect_pairs = {frozenset(c.nodes) for c in todo if c.kind != "node"}
        for c in todo:
            if c.kind == "node":
                c.apart_below_gbps = stands_apart(c.nodes[0], figures, node_suspects, margin, suspect_pairs)
    healthy = [i for i in range(n) if i not in suspected]
    ordinary = slow_rule(verdict.busbw_floor_gbps, verdict.latency_ceiling_us)
    floor, ref = verdict.busbw_floor_gbps, verdict.reference_busbw_gbps
    gross_floor = min(floor, (1 - GROSS_MARGIN) * ref) if gross_only and floor is not None and ref else None
    gross = slow_rule(gross_floor, verdict.latency_ceiling_us)
    summaries = {s.node: s for s in verdict.slow_nodes}
    waiting = list(todo)
    for _ in range(CONFIRM_ROUNDS):
        groups, planned, busy, free = [], [], set(), list(healthy)
        for c in waiting:
            if busy & set(c.nodes) or (c.kind == "node" and not free):
                continue
            group = [c.nodes[0], free.pop()] if c.kind == "node" else list(c.nodes)
            busy.update(group)
            groups.append(sorted(group))
            planned.append(c)
        if not groups:
            break
        for c, run in zip(planned, run_round(groups)):
            c.again = run
            figure = PairFigure(run.nodes[0], run.nodes[1], run.busbw_gbps, run.latency_us, ok=run.ok)
            by_gross = (gross_floor is not None and not c.apart_below_gbps
                        and not _measured_below(c, summaries, gross_floor))
            slow = gross if by_gross else ordinary
            c.slow_again = slow(figure)
            c.under_margin_only = ordinary(figure) and not c.slow_again
        waiting = [c for c in waiting if c.again is None]
    return todo


def stands_apart(node: int, figures: list[PairFigure], suspected: set[int], margin: float,
                 suspect_pairs: set[frozenset] = frozenset()) -> float | None:
    """The bar `node` stands apart under, or None: every pair with it measured (none failed, hung or cut by its
    deadline) and each under (1 - margin) x the slowest busbw of the healthy pairs (no node of `suspected` in it,
    not itself one of `suspect_pairs`), of which there are at least two. One healthy pair is too little to
    compare with (the d07 run named a healthy node so)."""
    own = [f for f in figures if node in (f.a, f.b)]
    healthy = [f.busbw_gbps for f in figures
               if f.ok and f.busbw_gbps and f.a not in suspected and f.b not in suspected
               and frozenset((f.a, f.b)) not in suspect_pairs]
    if len(healthy) < 2 or not own or any(not f.ok or not f.busbw_gbps for f in own):
        return None
    bar = (1 - margin) * min(healthy)
    return bar if max(f.busbw_gbps for f in own) < bar else None


def _measured_below(c: Confirmation, summaries: dict, floor: float) -> bool:
    """Were the suspect's first figures all measured (no failure, no hang) and under `floor`?"""
    if c.kind == "node":
        s = summaries[c.nodes[0]]
        return not s.failed_partners and s.geomean_busbw_gbps is not None and s.geomean_busbw_gbps < floor
    return c.first is not None and c.first.ok and c.first.busbw_gbps is not None and c.first.busbw_gbps < floor
