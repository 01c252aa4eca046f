"""Which rank holds the others back, and why: pure logic over the node reports (no I/O but the rule table).

The rule, for synchronous data parallel (every rank meets the others in a collective each step): the
ranks run at the pace of the slowest, so the slowest is the rank that waits least while the others wait
in collectives. Per rank, its own-work share = 1 - (share of samples waiting in a collective). A rank is
a straggler when its own-work share exceeds the median of the OTHER ranks' by more than
max(margin, k x spread) (the one verdict rule: shared/judging.py, figure peer_wait_share), and the
others wait at least `min_others_wait` of the window (otherwise nobody is held back). When every rank
waits in collectives most of the time and one node's links are shaped or retransmitting, that node is
named for the network. When the spread of the healthy ranks is too wide to resolve the margin, the
answer is "inconclusive", with the spread.
"""

import math
import statistics
from dataclasses import dataclass, field

from .flight import evidence as fr_evidence, finding as fr_finding, line_up as fr_line_up
from .models import GpuSample, NodeReport, NodeSample, RankSample, Straggler
from ..engine.data import load_data
from ..shared.judging import FigureRule, deficit, is_inconclusive, relative_spread, rule_for, threshold

MIN_SAMPLES = 10


@dataclass(frozen=True)
class Rules:
    share: FigureRule          # peer_wait_share in verdict_rules.toml
    min_others_wait: float
    reason: dict

    @classmethod
    def load(cls) -> "Rules":
        table = load_data("straggler_rules")
        return cls(share=rule_for("peer_wait_share"),
                   min_others_wait=table["figure"]["peer_wait_share"]["min_others_wait"], reason=table["reason"])


@dataclass
class Judgement:
    stragglers: list[Straggler] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    spread: float | None = None
    threshold: float | None = None
    inconclusive: bool = False


def _wait(r: RankSample) -> float:
    return r.fractions.get("collective", 0.0)


def own_work(r: RankSample) -> float:
    return 1.0 - r.fractions.get("collective", 0.0)


def _sampling_error(share: float, samples: int) -> float:
    """Standard error of a share read from `samples` independent samples, relative to the share."""
    if share <= 0 or samples <= 0:
        return 0.0
    return math.sqrt(share * (1 - share) / samples) / share


def _others(ranks: list[RankSample], r: RankSample) -> list[RankSample]:
    return [o for o in ranks if o is not r]


def _stands_out(r: RankSample, ranks: list[RankSample], rules: Rules) -> tuple[float, float, float]:
    """(deficit, threshold, spread) of r's own-work share against the other ranks'."""
    # Judged on the waiting share, not the own-work share: when the others mostly wait, their own-work
    # shares are small numbers whose relative spread is noise, while their waiting shares agree closely.
    others = [_wait(o) for o in _others(ranks, r)]
    ref = statistics.median(others)
    spread = max(relative_spread(others), _sampling_error(ref, min(o.samples for o in _others(ranks, r))))
    return deficit(_wait(r), ref, "higher") if ref > 0 else 0.0, threshold(rules.share, spread), spread


def _in_every_part(r: RankSample, ranks: list[RankSample], rules: Rules) -> bool:
    """Whether r stands out in each consecutive part of the window too (a steady straggler, not a blip)."""
    for i, mine in enumerate(r.part_fractions):
        others = [o for o in _others(ranks, r) if len(o.part_fractions) > i]
        if not others:
            return True
        shares = [o.part_fractions[i].get("collective", 0) for o in others]
        ref = statistics.median(shares)
        samples = min([o.part_samples[i] for o in others if len(o.part_samples) > i] or [1])
        spread = max(relative_spread(shares), _sampling_error(ref, samples))
        waiting = statistics.median(o.part_fractions[i].get("collective", 0) for o in others)
        short = deficit(mine.get("collective", 0), ref, "higher") if ref > 0 else 0.0
        if waiting < rules.min_others_wait or short <= threshold(rules.share, spread):
            return False
    return True


def judge(reports: list[NodeReport], rules: Rules) -> Judgement:
    ranks = [r for rep in reports for r in rep.ranks if not r.error and r.samples >= MIN_SAMPLES]
    nodes = {rep.host: rep.node for rep in reports}
    gpus = [g for rep in reports for g in rep.gpus]
    out = Judgement()
    if len(ranks) >= 2:
        _compare(ranks, nodes, gpus, rules, out)
    shared = [g for g in gpus if g.job_pids and g.other_holders]
    for g in shared:
        if not any(s.gpu_serial == g.serial and s.host == g.host for s in out.stragglers):
            out.stragglers.append(_gpu_shared(g, ranks))
    _flight_recorder(reports, out)
    return out


def _flight_recorder(reports: list[NodeReport], out: Judgement) -> None:
    """The job's own flight-recorder dumps, where it writes them: evidence beside the samples, never a verdict
    alone (a dump covers the collectives before it was written, not the sampled window)."""
    dumps = [f for rep in reports for f in rep.flight]
    lined = fr_line_up(dumps)
    for rep in reports:
        for r in rep.ranks:
            mine = lined.get("ranks", {}).get(r.rank) if r.rank is not None else None
            if mine and mine["host"] == r.host:
                r.fr_late_ms, r.fr_duration_ms = mine["late_ms"], mine["duration_ms"]
    for s in out.stragglers:
        line = fr_evidence(s.rank, lined)
        if line:
            s.evidence.append(line)
    out.findings += fr_finding(lined, dumps)


def _compare(ranks, nodes, gpus, rules: Rules, out: Judgement) -> None:
    scored = [(r, *_stands_out(r, ranks, rules)) for r in ranks]
    candidates = [(r, d) for r, d, thr, _ in scored if d > thr
                  and statistics.median(o.fractions.get("collective", 0) for o in _others(ranks, r)) >= rules.min_others_wait]
    healthy = [_wait(r) for r in ranks if r not in [c for c, _ in candidates]]
    out.spread = relative_spread(healthy)
    out.threshold = threshold(rules.share, out.spread)
    if is_inconclusive(healthy, rules.share):
        out.inconclusive = True
        return
    if candidates and len(candidates) <= len(ranks) // 2:
        steady = [(r, d) for r, d in candidates if _in_every_part(r, ranks, rules)]
        for r, _ in sorted(steady, key=lambda c: -c[1]):
            out.stragglers.append(_named(r, ranks, nodes.get(r.host), gpus, rules))
        for r, _ in (c for c in candidates if c not in steady):
            out.findings.append(f"Rank {r.rank} on {r.host} worked longer than the others over the window but not in "
                                "every third of it: a passing slowdown (another process on the host, a burst of "
                                "I/O), not named; sample again if it persists.")
        return
    _network(ranks, nodes, rules, out)


def _named(r: RankSample, ranks: list[RankSample], node: NodeSample | None, gpus: list[GpuSample], rules: Rules) -> Straggler:
    others = _others(ranks, r)
    others_wait = statistics.median(o.fractions.get("collective", 0) for o in others)
    own = own_work(r)
    s = Straggler(rank=r.rank, host=r.host, pid=r.pid, gpu_index=r.gpu_index, gpu_serial=r.gpu_serial,
                  others_wait_fraction=round(max(0.0, others_wait - r.fractions.get("collective", 0)), 3),
                  work_ratio=round(own / (1 - others_wait), 2) if others_wait < 1 else None)
    s.evidence.append(f"the other ranks wait {others_wait:.0%} of the window in collectives, it waits "
                      f"{r.fractions.get('collective', 0):.0%} ({r.samples} samples)")
    s.reason = _reason(r, others, node, gpus, rules, s.evidence)
    return s


def _share_of_work(r: RankSample, cls: str) -> float:
    own = own_work(r)
    return r.fractions.get(cls, 0) / own if own > 0 else 0.0


def _reason(r: RankSample, others, node: NodeSample | None, gpus, rules: Rules, evidence: list[str]) -> str:
    rr = rules.reason
    for cls, name, label in (("data", "data_loading", "data loading"), ("h2d", "h2d", "host-to-device copies")):
        mine, theirs = _share_of_work(r, cls), statistics.median(_share_of_work(o, cls) for o in others)
        if mine >= rr[f"{'data' if cls == 'data' else 'h2d'}_share_min"] and mine > theirs + 0.1:
            evidence.append(f"{mine:.0%} of its own work is {label} (others {theirs:.0%}), mostly at "
                            f"{r.top_frames.get(cls, '?')}")
            return name
    if _cpu_starved(r, others, rules, evidence):
        return "cpu"
    if node and node.psi_memory_some_pct is not None and node.psi_memory_some_pct >= rr["psi_memory_some_min_pct"]:
        evidence.append(f"memory pressure on {r.host}: some avg10 = {node.psi_memory_some_pct:.1f}%")
        return "memory"
    if _gpu_slow(r, gpus, rules, evidence):
        return "gpu"
    evidence.append(f"it computes ({r.fractions.get('compute', 0):.0%} of samples, mostly at "
                    f"{r.top_frames.get('compute', '?')}) with no host cause seen: a slower GPU or kernel path, "
                    "or more work on this rank")
    return "unknown"


def _efficiency(r: RankSample) -> float | None:
    busy = r.fractions.get("compute", 0) + r.fractions.get("data", 0) + r.fractions.get("h2d", 0)
    return r.cpu_fraction / busy if r.cpu_fraction is not None and busy > 0.05 else None


def _cpu_starved(r: RankSample, others, rules: Rules, evidence: list[str]) -> bool:
    rr = rules.reason
    if r.cgroup_throttled_fraction is not None and r.cgroup_throttled_fraction >= rr["throttled_periods_min"]:
        evidence.append(f"its cpu cgroup {r.cgroup or '?'} was throttled in {r.cgroup_throttled_fraction:.0%} of "
                        f"CFS periods (a CPU limit); it used {r.cpu_fraction or 0:.2f} CPU-s per s")
        return True
    mine = _efficiency(r)
    theirs = [e for e in (_efficiency(o) for o in others) if e is not None]
    if mine is not None and theirs and mine < rr["cpu_efficiency_max"] and mine * 1.5 < statistics.median(theirs):
        wait = f", waited for a CPU {r.runqueue_wait_fraction:.2f} s per s" if r.runqueue_wait_fraction is not None else ""
        evidence.append(f"while computing it got {mine:.2f} CPU-s per s (others {statistics.median(theirs):.2f}){wait}")
        return True
    return False


def _gpu_slow(r: RankSample, gpus: list[GpuSample], rules: Rules, evidence: list[str]) -> bool:
    mine = next((g for g in gpus if g.host == r.host and g.index == r.gpu_index), None)
    if mine is None:
        return False
    peers = [g.sm_clock_median_mhz for g in gpus if g is not mine and g.job_pids and g.sm_clock_median_mhz]
    bad = {k: v for k, v in mine.reasons_fraction.items() if k not in ("gpu_idle", "sw_power_cap") and v > 0.05}
    if mine.other_holders:
        evidence.append(f"GPU {mine.index} (serial {mine.serial or '?'}) is shared with {'; '.join(mine.other_holders[:3])}")
        return True
    if peers and mine.sm_clock_median_mhz and mine.sm_clock_median_mhz < (1 - rules.reason["gpu_clock_deficit_min"]) * statistics.median(peers):
        evidence.append(f"GPU {mine.index} runs at {mine.sm_clock_median_mhz:.0f} MHz, the others' median "
                        f"{statistics.median(peers):.0f} MHz; clock-event reasons {bad or 'none'}")
        return True
    if bad:
        evidence.append(f"GPU {mine.index} slowed by {bad}")
        return True
    return False


def _gpu_shared(g: GpuSample, ranks: list[RankSample]) -> Straggler:
    r = next((x for x in ranks if x.pid in g.job_pids and x.host == g.host), None)
    util = f", {g.utilization_median_pct:.0f}% utilised" if g.utilization_median_pct is not None else ""
    return Straggler(rank=r.rank if r else None, host=g.host, pid=g.job_pids[0], gpu_index=g.index, gpu_serial=g.serial,
                     reason="gpu", evidence=[f"GPU {g.index} (serial {g.serial or '?'}{util}) is shared with "
                                             f"{'; '.join(g.other_holders[:3])}: the rank gets a fraction of it"])


def _network(ranks: list[RankSample], nodes: dict[str, NodeSample], rules: Rules, out: Judgement) -> None:
    """No rank works longer than the rest: if all of them mostly wait, look for the node whose links are slow."""
    waits = [r.fractions.get("collective", 0) for r in ranks]
    if statistics.median(waits) < rules.reason["collective_bound_min"]:
        return
    if len(nodes) < 2:       # one node: nothing to compare its links with
        out.findings.append(f"Every rank waits in collectives ({min(waits):.0%}-{max(waits):.0%} of the window): the "
                            "job is communication-bound on this node; collective_bench measures its links.")
        return
    retrans = {h: n.tcp_retrans_per_s or 0.0 for h, n in nodes.items()}
    for host, node in nodes.items():
        rest = [v for h, v in retrans.items() if h != host]
        # Retransmits name a node only when they are many and far above the rest: a busy host drops a few.
        noisy = retrans[host] >= rules.reason["retrans_per_s_min"] and retrans[host] > 5 * max(
            1.0, statistics.median(rest) if rest else 0)
        if not node.shaped_links and not noisy:
            continue
        for r in (x for x in ranks if x.host == host):
            s = Straggler(rank=r.rank, host=host, pid=r.pid, gpu_index=r.gpu_index, gpu_serial=r.gpu_serial,
                          others_wait_fraction=round(statistics.median(waits), 3), reason="network")
            s.evidence.append(f"every rank waits in collectives ({min(waits):.0%}-{max(waits):.0%} of the window), "
                              "so the collectives themselves are slow")
            s.evidence += [f"{host}: {link}" for link in node.shaped_links]
            if noisy:
                s.evidence.append(f"{host} retransmits {retrans[host]:.1f} TCP segments/s (others "
                                  f"{statistics.median(rest) if rest else 0:.1f}/s)")
            out.stragglers.append(s)
    if len({s.host for s in out.stragglers}) > len(nodes) // 2:
        out.stragglers.clear()          # most nodes look alike: nothing stands out
    if not out.stragglers:
        out.findings.append(f"Every rank waits in collectives ({min(waits):.0%}-{max(waits):.0%} of the window) and no "
                            "node's links stand out: the job is communication-bound; measure the links with "
                            "collective_bench (pairwise) to find a slow pair.")
