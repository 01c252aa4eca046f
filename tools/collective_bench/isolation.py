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

from pydantic import PrivateAttr

from ..engine.spec import Field, Record
from .node_groups import GroupRun
from .pair_pace import Pace, not_finished_in_time
from ..shared.judging import statement
from .pair_matrix import PairFigure
from .pair_verdict import MIN_PAIRS_FOR_SPREAD, PairJudgement, expected_pair_gbps, judge_pairs, rule_for_backend
from .pair_schedule import Bisection, full_round_count, pair_rounds

RunRound = Callable[[list[list[int]]], list[GroupRun]]
MATRIX_MAX_NODES = 64  # above this the result lists suspects and slow pairs, not the whole matrix


class GroupRecord(Record):
    round: int = Field(description="Round, from 1.")
    nodes: list[str] = Field(description="Nodes of the group (a pair in pairwise).")
    status: Literal["ok", "fail", "hang", "unfinished"] = Field(description=(
        "ok; fail (an error); hang (measured no size before its deadline or the run's pace stopped it); unfinished "
        "(measured sizes, then its deadline or the run's pace ended it before the last: slow, or stuck at a larger "
        "size)."))
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
    cleared: bool = Field(False, description=(
        "Not named because it was measured again and was fine (a passing slowdown), not for want of evidence."))


class IsolationReport(Record):
    # The report sits inside the result, so the model view would cut its lists to their first item: a 4-node
    # run read nodes == ['mln1'], a link one end (CI, issue 35). What names the culprits stays whole; every
    # group's figures and the matrices are bulk (the findings carry the suspects' figures), left to
    # results_history result_id=N.
    whole_fields = ("nodes", "suspects", "unconfirmed")
    detail_fields = ("groups", "busbw_matrix", "latency_matrix")

    pattern: Literal["pairwise", "bisect"] = Field(description="Which pattern ran.")
    nodes: list[str] = Field(description="Nodes, in matrix order.")
    rounds: int = Field(0, description="Rounds run.")
    groups: list[GroupRecord] = Field(default_factory=list, description="Every group of every round.")
    suspects: list[Suspect] = Field(default_factory=list, description=(
        "What the rounds point at, each confirmed by a second measurement."))
    unconfirmed: list[Suspect] = Field(default_factory=list, description=(
        "Slow or failing once, fine when measured again: not named (a busy host or a transient fault)."))
    reference_busbw_gbps: float | None = Field(None, description=(
        "A healthy pair: 75th percentile busbw, GB/s, to 3 significant figures (read from 2%-wide bins, so two runs "
        "may give the same figure)."))
    busbw_floor_gbps: float | None = Field(None, description=(
        "Pairs below this are slow, GB/s, to 3 significant figures."))
    latency_ceiling_us: float | None = Field(None, description="Pairs above this are slow, microseconds.")
    busbw_matrix: list[list[float | None]] | None = Field(None, description=(
        "busbw of pair (i, j), GB/s; None where not measured or failed (up to 64 nodes)."))
    latency_matrix: list[list[float | None]] | None = Field(None, description="Latency of pair (i, j), us.")
    heatmap_png: str | None = Field(None, description="The busbw matrix as a heat map.")
    wall_s: float = Field(0.0, description="Wall time of all rounds, seconds.")
    spread: float | None = Field(None, description=(
        "pairwise: spread of healthy pairs' busbw in this run (1.4826 x MAD / median, fraction)."))
    threshold: float | None = Field(None, description=(
        "pairwise: the deficit below a healthy pair that makes a pair slow: max(margin, k x spread), fraction."))
    inconclusive: bool = Field(False, description=(
        "pairwise: the healthy pairs spread too widely to judge; nothing is named."))
    rule: str = Field("", description="The verdict rule as applied, in a sentence.")
    expected_busbw_gbps: float | None = Field(None, description="pairwise: expected busbw of a two-node pair, GB/s.")
    expected_source: str = Field("", description="Where that figure comes from, or why there is none.")
    refused_messages: int = Field(0, description=(
        "Outside SLURM: messages on the coordinator's store not signed with the run's secret, refused."))
    # pairwise: groups that counted against no node and why, in sentences for the findings (not a published field:
    # every field of the output schema is read by every session)
    _not_counted: list[str] = PrivateAttr(default_factory=list)
    # every group failed or hung, so no node could be told from another (bisect: pair_schedule.Bisection;
    # pairwise: every pair hung before measuring a size)
    _nothing_passed: bool = PrivateAttr(False)


def shown_status(run: GroupRun) -> str:
    """The status the answer says: a group that measured sizes and was ended before the last is "unfinished", not
    hung (model round 11: slow pairs that their deadline ended read "hang" in the groups); not "slow" either, since
    a pair can also stick at a larger size (review, 2026-12-05)."""
    return "unfinished" if run.status == "hang" and run.rows else run.status


def _sig3(value: float | None) -> float | None:
    return float(f"{value:.3g}") if value else value


def _record(r: int, run: GroupRun, names: list[str]) -> GroupRecord:
    return GroupRecord(round=r, nodes=[names[i] for i in run.nodes], status=shown_status(run),
                       busbw_gbps=run.busbw_gbps, latency_us=run.latency_us, wall_s=run.wall_s, detail=run.detail)


def pairwise(names: list[str], run_round: RunRound, *, rounds: int | None = None, margin: float | None = None,
             backend: str | None = None, latency_factor: float = 5.0, progress=None) -> IsolationReport:
    """Rounds of pairs (all of them by default: every pair once), then suspects judged by the one rule and
    confirmed by a second measurement (pair_verdict.py)."""
    n = len(names)
    total = rounds or full_round_count(n)
    report = IsolationReport(pattern="pairwise", nodes=names)
    t0 = time.monotonic()
    setup: GroupRun | None = None
    rounds_run: list[list[GroupRun]] = []
    for r, pairs in enumerate(pair_rounds(n, rounds), start=1):
        runs = run_round([list(p) for p in pairs])
        rounds_run.append(runs)
        setup = setup or next((run for run in runs if run.setup and run.rows), None)
        report.groups.extend(_record(r, run, names) for run in runs)
        report.rounds = r
        if progress:
            slow = sum(not x.ok for x in runs)
            progress(r / total * 0.9, f"round {r}/{total}: {len(runs)} pairs, {slow} failed or hung")
    every = [run for runs in rounds_run for run in runs]
    if len(every) >= 2 and all(run.status == "hang" and not run.rows for run in every):
        # No pair measured a single size: nothing to judge a node or a link against. Controls under a CPU hog
        # (ssh-healthy-network, load ~12, 2026-12-04): all 6 pairs of a healthy network hung and the answer was
        # "fail: Suspect set mln1 - mln2 - mln3 - mln4, fleet-wide"; bisect says the same case this way (faae34e).
        report._nothing_passed = True
        report.wall_s = round(time.monotonic() - t0, 2)
        return report
    figures, report._not_counted = _pair_figures(rounds_run, names)

    def measure_again(groups: list[list[int]]) -> list[GroupRun]:
        report.rounds += 1
        if progress:
            progress(0.95, f"round {report.rounds}: measuring {len(groups)} suspect(s) again")
        runs = run_round(groups)
        report.groups.extend(_record(report.rounds, run, names) for run in runs)
        return runs

    rule = rule_for_backend((setup.setup.get("backend") if setup else None) or backend, margin)
    expected, report.expected_source = expected_pair_gbps(setup.setup, setup.rows) if setup else (None, "")
    report.expected_busbw_gbps = expected
    judged = judge_pairs(n, figures, rule, measure_again, latency_factor=latency_factor, expected_gbps=expected)
    verdict = judged.verdict
    # Bin centres (pair_matrix's histogram): 17 digits of one read as a figure carried over between runs (round 12).
    report.reference_busbw_gbps, report.busbw_floor_gbps = _sig3(verdict.reference_busbw_gbps), _sig3(
        verdict.busbw_floor_gbps)
    report.latency_ceiling_us = verdict.latency_ceiling_us
    report.spread, report.threshold, report.inconclusive = judged.spread, judged.threshold, judged.inconclusive
    report.rule = statement(rule, judged.spread) + (
        f" (spread over {judged.healthy_pairs} pairs of unsuspected nodes)" if judged.healthy_pairs >= MIN_PAIRS_FOR_SPREAD
        else f" (the stated spread: {judged.healthy_pairs} healthy pairs are too few to measure one)")
    report.suspects, report.unconfirmed = _pair_suspects(judged, names)
    if n <= MATRIX_MAX_NODES:
        report.busbw_matrix, report.latency_matrix = _matrices(n, figures)
    report.wall_s = round(time.monotonic() - t0, 2)
    return report


def _pair_figures(rounds_run: list[list[GroupRun]], names: list[str]) -> tuple[list[PairFigure], list[str]]:
    """Every pair's figure for the verdict, and sentences on the groups that count against no node:
    - a round of two or more groups that all hung before measuring a size, whose nodes all measured sizes in
      other rounds, says nothing about its pairs (start-up under load, the launcher): left out;
    - a pair its deadline cut while its finished sizes read healthy (pair_pace.not_finished_in_time) counts as
      a partner that is not slow, with no busbw (a smaller size is no figure against the largest) and its
      latency (a delayed node stays a latency finding).
    A pair the pace stopped, that hung with nothing measured among groups that measured, or that failed, counts
    as before: slow."""
    pace = Pace()
    for run in (run for runs in rounds_run for run in runs):
        pace.record(run)
    measured = {i for runs in rounds_run for run in runs if run.rows for i in run.nodes}
    figures, notes, late = [], [], []
    for r, runs in enumerate(rounds_run, start=1):
        silent = (len(runs) >= 2 and all(run.status == "hang" and not run.rows for run in runs)
                  and all(i in measured for run in runs for i in run.nodes))
        if silent:
            notes.append(f"Round {r}: every group hung before measuring a size ({_groups_text(runs, names)}), while "
                         "these nodes measured in other rounds: start-up under load or the launcher, not the pairs; "
                         "its groups count against no node (those pairs are not measured)")
            continue
        for run in runs:
            why = not_finished_in_time(run, pace)
            if why:
                late.append(f"{_where(run, names)} (round {r}, {run.wall_s:.0f} s: {why})")
            figures.append(PairFigure(run.nodes[0], run.nodes[1], None if why else run.busbw_gbps, run.latency_us,
                                      ok=run.ok or bool(why)))
    if late:
        healthy_s = pace.healthy_s()
        took = f"a healthy pair took {healthy_s:.0f} s here" if healthy_s else "no pair finished in time"
        longer = f"group_deadline_s of at least {2 * healthy_s:.0f}" if healthy_s else "a longer group_deadline_s"
        notes.append(f"Not finished in time, counted against no node: {'; '.join(late)}: its deadline cut it while "
                     f"it measured at healthy rates; {took}. Run again with {longer} to judge these pairs")
    return figures, notes


def _where(run: GroupRun, names: list[str]) -> str:
    return "+".join(names[i] for i in run.nodes)


def _groups_text(runs: list[GroupRun], names: list[str]) -> str:
    return ", ".join(f"{_where(run, names)} {run.wall_s:.0f} s" for run in runs)


def _pair_suspects(judged: PairJudgement, names: list[str]) -> tuple[list[Suspect], list[Suspect]]:
    """(named, unconfirmed): only what was slow again when measured a second time is named."""
    verdict, ref = judged.verdict, judged.verdict.reference_busbw_gbps
    named, unconfirmed = [], []
    if judged.fleet_below_expected:
        named.append(Suspect(kind="set", nodes=list(names), evidence=(
            f"a healthy pair's busbw {judged.fleet_below_expected}: every pair is slow, the fleet is degraded "
            "as a whole (fabric, NCCL settings, firmware), not one node")))
    if verdict.fleet_wide and not judged.inconclusive:
        named.append(Suspect(kind="set", nodes=list(names), evidence=(
            "most nodes are slow or failing with most partners: the fault is fleet-wide (launcher, fabric, "
            "configuration), not in a few nodes")))
        return named, unconfirmed
    nodes = {s.node: s for s in verdict.slow_nodes}
    for c in judged.confirmations:
        who = [names[i] for i in c.nodes]
        first = _node_text(nodes[c.nodes[0]], ref) if c.kind == "node" else _pair_text(c.first)
        if c.again is None:
            unconfirmed.append(Suspect(kind=c.kind, nodes=who, evidence=f"{first}; not measured again (no healthy "
                                       "partner or no round left)"))
            continue
        again = f"measured again with {names[_other(c.again, c.nodes[0])]}" if c.kind == "node" else "measured again"
        second = f"{again}: {_run_text(c.again)}"
        if c.under_margin_only:
            unconfirmed.append(Suspect(kind=c.kind, nodes=who, evidence=(
                f"{first}; {second}: under the {judged.threshold:.0%} margin but not under a tenth of a healthy pair "
                f"({_fmt(ref)} GB/s); {judged.healthy_pairs} healthy pair(s) are too few to measure the spread, so "
                "only a failure or a gross deficit names: not named")))
            continue
        if not c.slow_again:
            unconfirmed.append(Suspect(kind=c.kind, nodes=who, evidence=f"{first}; {second}, fine: not named",
                                       cleared=True))
            continue
        apart = (f"; every one of its first pairs was under {_fmt(c.apart_below_gbps)} GB/s, {judged.threshold:.0%} "
                 "below the slowest healthy pair, so it stands apart without a measured spread"
                 if c.apart_below_gbps else "")
        tail = {"node": apart, "link": " while both nodes are fine with their other partners",
                "pair": "; each node met only this partner, so node and link cannot be told apart"}[c.kind]
        named.append(Suspect(kind=c.kind, nodes=who, evidence=f"{first}; {second}, slow again{tail} (healthy pair "
                             f"{_fmt(ref)} GB/s)"))
    return named, unconfirmed


def _node_text(s, ref: float | None) -> str:
    if s.failed_partners == s.partners:
        # Nothing was measured with it: "slow" would be a figure it never gave (model round 6, ssh-dead-host: "slow
        # with 3 of 3 partners" for a host whose sshd refused every connection). The run's own words follow.
        return (f"every one of its {s.partners} pairs failed or hung, so no busbw was measured with it (a healthy "
                f"pair: {_fmt(ref)} GB/s)")
    geo = f"{s.geomean_busbw_gbps:.3g} GB/s" if s.geomean_busbw_gbps else "no figure"
    return (f"slow with {s.slow_partners} of {s.partners} partners ({s.failed_partners} failed or hung); its "
            f"pairs' busbw {geo} (geometric mean) against {_fmt(ref)} GB/s for a healthy pair")


def _other(run: GroupRun, node: int) -> int:
    return next(m for m in run.nodes if m != node)


def _run_text(run: GroupRun) -> str:
    if not run.ok:
        return f"{shown_status(run)} ({run.detail})" if run.detail else shown_status(run)
    return f"busbw {_fmt(run.busbw_gbps)} GB/s, latency {_fmt(run.latency_us)} us"


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


def bisect(names: list[str], run_round: RunRound, *, known_failing: bool = False, progress=None,
           pace=None) -> IsolationReport:
    """The whole set, then halves of what fails (each group under its deadline) until suspects remain.
    `pace` (group_pace.GroupPace, shared with run_round): told each round which groups are second measurements."""
    n = len(names)
    plan = Bisection(n, known_failing=known_failing)
    report = IsolationReport(pattern="bisect", nodes=names)
    t0, limit = time.monotonic(), 3 * math.ceil(math.log2(n)) + 4  # + the confirmation rounds
    failed_detail: dict[tuple[int, ...], str] = {}
    still_measuring: dict[tuple[int, ...], bool] = {}   # failed only as its deadline ended it mid-sweep, each time
    while not plan.done and plan.rounds < limit:
        groups = plan.next_round()
        if not groups:
            break
        if pace is not None:
            pace.judge_only(plan.second_measurements())
        runs = run_round(groups)
        plan.record([run.ok for run in runs])
        for run in runs:
            report.groups.append(_record(plan.rounds, run, names))
            if not run.ok:
                key = tuple(sorted(run.nodes))
                failed_detail[key] = run.detail
                still_measuring[key] = still_measuring.get(key, True) and _cut_while_measuring(run)
        if progress:
            progress(min(0.95, plan.rounds / (math.ceil(math.log2(n)) + 1)),
                     f"round {plan.rounds}: {len(groups)} groups, {sum(not r.ok for r in runs)} failed or hung")
    report.rounds = plan.rounds
    report._nothing_passed = plan.nothing_passed
    for finding in plan.findings:
        suspect = Suspect(kind=finding.kind, nodes=[names[i] for i in finding.nodes],
                          evidence=_bisect_evidence(finding, failed_detail))
        if finding.kind == "set" and still_measuring.get(tuple(finding.nodes)):
            # Its parts passed and the whole was still measuring sizes when the deadline ended it: slow at this
            # size and load, not shown to hang (model round 8, cl-link-down: a 60 s deadline made "a fault of
            # scale" of 4 healthy nodes whose 4-node group had measured 7 of 10 sizes).
            suspect.evidence = (f"{suspect.evidence}; but the whole set was still measuring sizes when its "
                                "deadline ended it: slow, not shown to hang; not named (raise group_deadline_s)")
            report.unconfirmed.append(suspect)
        else:
            report.suspects.append(suspect)
    report.unconfirmed += [Suspect(kind=f.kind, nodes=[names[i] for i in f.nodes], evidence=f.evidence)
                           for f in plan.unconfirmed]
    report.wall_s = round(time.monotonic() - t0, 2)
    return report


def _cut_while_measuring(run: GroupRun) -> bool:
    """The group hung only in that its deadline came while it was measuring: some sizes done, none failed, not
    stopped by the run's pace."""
    return run.status == "hang" and not run.cut and bool(run.rows)


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
