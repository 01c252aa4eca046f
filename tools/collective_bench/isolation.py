"""collective_bench patterns "pairwise" and "bisect": rounds of node groups, then suspects with evidence.

pairwise: the rounds of a round-robin schedule (pair_schedule.py), floor(N/2) two-node jobs at
once per round; every pair's all_reduce busbw (largest size) and latency (smallest size) fill a node x
node matrix, and pair_matrix.py tells a slow node (slow with every partner) from a slow link
(slow with one). bisect: the whole set, then halves of what fails, each group under a deadline, until
the bad node (or link, or a set that fails only whole) remains.

How a round runs is given by the caller: `run_round(groups) -> [GroupRun]` (srun steps in an
allocation, node_groups.py, or per-node agents outside SLURM).
"""

from __future__ import annotations

import math
import time
from typing import Callable, Literal

from ..engine.spec import Field, Record
from .node_groups import GroupRun
from .pair_matrix import PairFigure, analyse_pairs
from .pair_schedule import Bisection, full_round_count, pair_rounds

RunRound = Callable[[list[list[int]]], list[GroupRun]]
MATRIX_MAX_NODES = 64  # above this the result lists suspects and slow pairs, not the whole matrix


class GroupRecord(Record):
    round: int = Field(description="Round, from 1.")
    nodes: list[str] = Field(description="Nodes of the group (a pair in pairwise).")
    status: Literal["ok", "fail", "hang"] = Field(description="ok, fail (error) or hang (passed its deadline).")
    busbw_gbps: float | None = Field(None, description="all_reduce busbw at the largest size, GB/s.")
    latency_us: float | None = Field(None, description="Time of one all_reduce at the smallest size, microseconds.")
    wall_s: float = Field(0.0, description="Wall time of the group's job, start-up included, seconds.")
    detail: str = Field("", description="Why it failed or hung.")


class Suspect(Record):
    kind: Literal["node", "link", "pair", "set"] = Field(description=(
        "node: bad with every partner; link: bad with one partner only; pair: one pair, node or link "
        "undetermined; set: fails only as a whole."))
    nodes: list[str] = Field(description="The node, the two ends of the link, or the set.")
    evidence: str = Field(description="The figures behind it.")


class IsolationReport(Record):
    pattern: Literal["pairwise", "bisect"] = Field(description="Which pattern ran.")
    nodes: list[str] = Field(description="Nodes, in matrix order.")
    rounds: int = Field(0, description="Rounds run.")
    groups: list[GroupRecord] = Field(default_factory=list, description="Every group of every round.")
    suspects: list[Suspect] = Field(default_factory=list, description="What the rounds point at.")
    reference_busbw_gbps: float | None = Field(None, description="A healthy pair: 75th percentile busbw, GB/s.")
    busbw_floor_gbps: float | None = Field(None, description="Pairs below this are slow, GB/s.")
    latency_ceiling_us: float | None = Field(None, description="Pairs above this are slow, microseconds.")
    busbw_matrix: list[list[float | None]] | None = Field(None, description=(
        "busbw of pair (i, j), GB/s; None where not measured or failed (up to 64 nodes)."))
    latency_matrix: list[list[float | None]] | None = Field(None, description="Latency of pair (i, j), us.")
    heatmap_png: str | None = Field(None, description="The busbw matrix as a heat map.")
    wall_s: float = Field(0.0, description="Wall time of all rounds, seconds.")


def _record(r: int, run: GroupRun, names: list[str]) -> GroupRecord:
    return GroupRecord(round=r, nodes=[names[i] for i in run.nodes], status=run.status, busbw_gbps=run.busbw_gbps,
                       latency_us=run.latency_us, wall_s=run.wall_s, detail=run.detail)


def pairwise(names: list[str], run_round: RunRound, *, rounds: int | None = None, margin: float = 0.5,
             latency_factor: float = 5.0, progress=None) -> IsolationReport:
    """Rounds of pairs (all of them by default: every pair once), then slow nodes and links named."""
    n = len(names)
    total = rounds or full_round_count(n)
    report = IsolationReport(pattern="pairwise", nodes=names)
    t0 = time.monotonic()
    figures: list[PairFigure] = []
    for r, pairs in enumerate(pair_rounds(n, rounds), start=1):
        runs = run_round([list(p) for p in pairs])
        for run in runs:
            report.groups.append(_record(r, run, names))
            figures.append(PairFigure(run.nodes[0], run.nodes[1], run.busbw_gbps, run.latency_us, ok=run.ok))
        report.rounds = r
        if progress:
            slow = sum(not x.ok for x in runs)
            progress(r / total * 0.95, f"round {r}/{total}: {len(runs)} pairs, {slow} failed or hung")
    verdict = analyse_pairs(n, figures, margin=margin, latency_margin=latency_factor - 1)
    report.reference_busbw_gbps, report.busbw_floor_gbps = verdict.reference_busbw_gbps, verdict.busbw_floor_gbps
    report.latency_ceiling_us = verdict.latency_ceiling_us
    report.suspects = _pair_suspects(verdict, names)
    if n <= MATRIX_MAX_NODES:
        report.busbw_matrix, report.latency_matrix = _matrices(n, figures)
    report.wall_s = round(time.monotonic() - t0, 2)
    return report


def _pair_suspects(verdict, names: list[str]) -> list[Suspect]:
    ref = verdict.reference_busbw_gbps
    if verdict.fleet_wide:
        return [Suspect(kind="set", nodes=list(names), evidence=(
            "most nodes are slow or failing with most partners: the fault is fleet-wide (launcher, fabric, "
            "configuration), not in a few nodes"))]
    out = []
    for s in verdict.slow_nodes:
        geo = f"{s.geomean_busbw_gbps:.3g} GB/s" if s.geomean_busbw_gbps else "no figure"
        out.append(Suspect(kind="node", nodes=[names[s.node]], evidence=(
            f"slow with {s.slow_partners} of {s.partners} partners ({s.failed_partners} failed or hung); "
            f"its pairs' busbw {geo} (geometric mean) against {_fmt(ref)} GB/s for a healthy pair")))
    for f in verdict.slow_links:
        out.append(Suspect(kind="link", nodes=[names[f.a], names[f.b]], evidence=(
            f"{_pair_text(f)} while both nodes are fine with their other partners (healthy pair "
            f"{_fmt(ref)} GB/s)")))
    for f in verdict.undetermined:
        out.append(Suspect(kind="pair", nodes=[names[f.a], names[f.b]], evidence=(
            f"{_pair_text(f)}; each node met only this partner, so node and link cannot be told apart")))
    return out


def _fmt(value: float | None) -> str:
    return f"{value:.3g}" if value else "?"


def _pair_text(f: PairFigure) -> str:
    if not f.ok:
        return "the pair failed or hung"
    return f"the pair's busbw is {_fmt(f.busbw_gbps)} GB/s, latency {_fmt(f.latency_us)} us"


def _matrices(n: int, figures: list[PairFigure]):
    bw = [[None] * n for _ in range(n)]
    lat = [[None] * n for _ in range(n)]
    for f in figures:
        if f.ok:
            bw[f.a][f.b] = bw[f.b][f.a] = f.busbw_gbps
            lat[f.a][f.b] = lat[f.b][f.a] = f.latency_us
    return bw, lat


def bisect(names: list[str], run_round: RunRound, *, known_failing: bool = False, progress=None) -> IsolationReport:
    """The whole set, then halves of what fails (each group under its deadline) until suspects remain."""
    n = len(names)
    plan = Bisection(n, known_failing=known_failing)
    report = IsolationReport(pattern="bisect", nodes=names)
    t0, limit = time.monotonic(), 3 * math.ceil(math.log2(n)) + 2
    failed_detail: dict[tuple[int, ...], str] = {}
    while not plan.done and plan.rounds < limit:
        groups = plan.next_round()
        if not groups:
            break
        runs = run_round(groups)
        plan.record([run.ok for run in runs])
        for run in runs:
            report.groups.append(_record(plan.rounds, run, names))
            if not run.ok:
                failed_detail[tuple(sorted(run.nodes))] = run.detail
        if progress:
            progress(min(0.95, plan.rounds / (math.ceil(math.log2(n)) + 1)),
                     f"round {plan.rounds}: {len(groups)} groups, {sum(not r.ok for r in runs)} failed or hung")
    report.rounds = plan.rounds
    for finding in plan.findings:
        report.suspects.append(Suspect(kind=finding.kind, nodes=[names[i] for i in finding.nodes],
                                       evidence=_bisect_evidence(finding, failed_detail)))
    report.wall_s = round(time.monotonic() - t0, 2)
    return report


def _bisect_evidence(finding, failed_detail: dict[tuple[int, ...], str]) -> str:
    last = next((d for g, d in reversed(failed_detail.items()) if set(finding.nodes) <= set(g)), "")
    return finding.evidence + (f"; last failing group: {last}" if last else "")


def draw_heatmap(report: IsolationReport, path, title: str, overwrite: bool = False) -> str:
    """The busbw matrix as a heat map (PNG), suspects in the title; needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(report.nodes)
    values = [[math.nan if v is None else v for v in row] for row in report.busbw_matrix or []]
    fig, ax = plt.subplots(figsize=(min(12, 3 + 0.5 * n), min(10, 2.5 + 0.45 * n)), dpi=100)
    image = ax.imshow(values, cmap="viridis", origin="upper")
    fig.colorbar(image, ax=ax, label="pair busbw (GB/s)")
    ax.set_xticks(range(n), report.nodes, rotation=90, fontsize=8)
    ax.set_yticks(range(n), report.nodes, fontsize=8)
    if n <= 16:
        top = max((v for row in values for v in row if not math.isnan(v)), default=0.0)
        for i in range(n):
            for j in range(n):
                if not math.isnan(values[i][j]):  # dark text on the bright (fast) cells
                    ax.text(j, i, f"{values[i][j]:.2g}", ha="center", va="center", fontsize=7,
                            color="k" if values[i][j] > 0.6 * top else "w")
    named = "; ".join(f"{s.kind} {'-'.join(s.nodes)}" for s in report.suspects) or "no suspect"
    ax.set_title(f"{title}\n{named}", fontsize=9)
    fig.tight_layout()
    from ..shared.safe_write import write_figure

    return write_figure(fig, path, overwrite=overwrite)
