"""Which rank holds the others back, and why: pure logic over the node reports (no I/O but the rule table).

The rule, for synchronous data parallel (every rank meets the others in a collective each step): the
ranks run at the pace of the slowest, so the slowest is the rank that waits least while the others wait
in collectives. Per rank, its own-work share = 1 - (share of samples waiting in a collective). A rank is
a straggler when its waiting share is below the median of the OTHER ranks' by more than
max(margin, k x spread) (the one verdict rule: shared/judging.py, figure peer_wait_share), the margin
capped at `lost_share_min` of the window (a communication-bound job's ranks all wait most of it, and 30%
of that hides a rank 15% slower), and the others wait at least `min_others_wait` of the window
(otherwise nobody is held back). When every rank
waits in collectives most of the time and one node's links are shaped or retransmitting, that node is
named for the network. When the spread of the healthy ranks is too wide to resolve the margin, the
answer is "inconclusive", with the spread. A rank whose own row stands apart in one stage (data loading,
copies, compute: several times every other rank's share, in every third of the window) is named for it even
when its lead in waiting is short of the margin, or, when that is not clear-cut, the answer is
"inconclusive" with the figure: never "no straggler" above a row that says otherwise (issue 35).

Each straggler carries what to act on (`culprit`, typed as every tool types one): the rank when its own
process is slow (its loader, copies, compute), the node when the cause is its host (a CPU quota, other
processes on its CPUs, steal, memory pressure, a shaped NIC: changing that setting or leaving the node out helps,
changing its code does not; answer.py advises no drain for a CPU cause), the GPU when its GPU is.
"""

import math
import statistics
from dataclasses import dataclass, field, replace

from .host_causes import HostCause, cpu_starved, host_causes
from .flight import evidence as fr_evidence, finding as fr_finding, line_up as fr_line_up
from .models import GpuSample, NodeReport, NodeSample, RankSample, Straggler
from ..shared.culprit_kind import Culprit, node_culprit, rank_culprit
from ..engine.data import load_data
from ..shared.judging import MIN_FOR_SPREAD, FigureRule, deficit, is_inconclusive, relative_spread, rule_for, threshold

MIN_SAMPLES = 10


@dataclass(frozen=True)
class Rules:
    share: FigureRule          # peer_wait_share in verdict_rules.toml
    min_others_wait: float
    lost_share_min: float      # the margin's cap, as a share of the window (straggler_rules.toml)
    reason: dict

    @classmethod
    def load(cls) -> "Rules":
        table = load_data("straggler_rules")["figure"]["peer_wait_share"]
        return cls(share=rule_for("peer_wait_share"), min_others_wait=table["min_others_wait"],
                   lost_share_min=table["lost_share_min"], reason=load_data("straggler_rules")["reason"])

    def bar(self, others_wait: float, spread: float) -> float:
        """The relative lead over the others' median waiting share `others_wait` that names a rank: the shared
        rule's max(margin, k x spread), the margin no more than lost_share_min of the window."""
        margin = min(self.share.margin, self.lost_share_min / others_wait) if others_wait > 0 else self.share.margin
        return threshold(replace(self.share, margin=margin), spread)


@dataclass
class Judgement:
    stragglers: list[Straggler] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    spread: float | None = None
    threshold: float | None = None
    inconclusive: bool = False
    leading: list[tuple[RankSample, str]] = field(default_factory=list)   # ranks ahead, short of being named: why
    apart: list[str] = field(default_factory=list)       # rows that stand apart in a stage, nobody named: the figures
    unsettled: bool = False                              # nobody named, but a longer look may tell (look.py)


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
    return deficit(_wait(r), ref, "higher") if ref > 0 else 0.0, rules.bar(ref, spread), spread


def _in_every_part(r: RankSample, ranks: list[RankSample], rules: Rules) -> bool:
    """Whether r leads in each consecutive part of the window too (a steady straggler, not a blip): by half the
    threshold in each third, as a third holds a third of the samples (the whole window must pass it all)."""
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
        if waiting < rules.min_others_wait or short <= rules.bar(ref, spread) / 2:
            return False
    return True


def judge(reports: list[NodeReport], rules: Rules, sampled_s: float = math.inf) -> Judgement:
    """The verdict on the merged reports; `sampled_s`: seconds the ranks were sampled (look.py says; a rule that needs
    a long enough window asks it)."""
    ranks = [r for rep in reports for r in rep.ranks if not r.error and r.samples >= MIN_SAMPLES]
    nodes = {rep.host: rep.node for rep in reports}
    gpus = [g for rep in reports for g in rep.gpus]
    out = Judgement()
    if len(ranks) >= 2:
        _compare(ranks, nodes, gpus, rules, out)
        if not out.stragglers:
            _stages(ranks, nodes, gpus, rules, out)
        if not out.stragglers:
            _more_cpu_work(ranks, nodes, gpus, rules, out, sampled_s)
        named = {id(r) for r in ranks for s in out.stragglers if (s.host, s.pid) == (r.host, r.pid)}
        out.findings[:0] = [line for r, line in out.leading if id(r) not in named]
    shared = [g for g in gpus if g.job_pids and g.other_holders]
    for g in shared:
        if not any(s.gpu_serial == g.serial and s.host == g.host for s in out.stragglers):
            out.stragglers.append(_gpu_shared(g, ranks))
    _flight_recorder(reports, out)
    # A named straggler is the answer: "inconclusive" from an earlier rule (a lag held back, scattered waits) would
    # put an "Inconclusive" line under it.
    out.inconclusive = out.inconclusive and not out.stragglers
    for s in out.stragglers:
        s.culprit = culprit(s)
        s.culprit_kind = s.culprit.kind
    return out


def culprit(s: Straggler) -> Culprit:
    """What to act on for a straggler, by its reason (the module docstring says why)."""
    if s.reason == "gpu":
        serial = f" (serial {s.gpu_serial})" if s.gpu_serial else ""
        return Culprit(kind="gpu", name=f"{s.host} GPU {s.gpu_index if s.gpu_index is not None else '?'}{serial}",
                       node=s.host, gpu_serial=s.gpu_serial, rank=s.rank)
    if s.reason in ("cpu", "memory", "network") or s.rank is None:
        return node_culprit(s.host)
    return rank_culprit(s.rank, s.host)


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


def _others_wait(r: RankSample, ranks: list[RankSample]) -> float:
    return statistics.median(_wait(o) for o in _others(ranks, r))


def _compare(ranks, nodes, gpus, rules: Rules, out: Judgement) -> None:
    scored = [(r, *_stands_out(r, ranks, rules)) for r in ranks]
    held = {id(r) for r in ranks if _others_wait(r, ranks) >= rules.min_others_wait}     # the others wait on someone
    candidates = [(r, d) for r, d, thr, _ in scored if d > thr and id(r) in held]
    caused = {id(r): c for r in ranks if (c := host_causes(r, ranks, nodes, rules.reason))}
    _caused_not_held(ranks, caused, held, out)
    caused = {k: c for k, c in caused.items() if k in held}
    healthy = [_wait(r) for r in ranks if r not in [c for c, _ in candidates] and id(r) not in caused]
    out.spread = relative_spread(healthy)
    out.threshold = rules.bar(statistics.median(healthy) if healthy else 0.0, out.spread)
    # A hard cause on the host names its rank whatever the stacks say (host_causes.py), noise or not.
    for r in (r for r in ranks if id(r) in caused):
        out.stragglers.append(_named(r, ranks, nodes.get(r.host), gpus, rules, caused[id(r)]))
    if is_inconclusive(healthy, rules.share):
        out.inconclusive = not out.stragglers
        out.unsettled = not out.stragglers
        return
    apart = {id(r) for r, _ in candidates}               # its stacks set it apart, with or without a host cause
    candidates = [(r, d) for r, d in candidates if id(r) not in caused]
    # Ranks named only for contention do not count against the stack rule's "at most half": on a busy shared host
    # two of them would otherwise keep the rank the others wait for from being named (_contention_beside).
    limited = [k for k, c in caused.items() if k in apart or any(x.kind != "contention" for x in c)]
    if candidates and len(candidates) + len(limited) <= len(ranks) // 2:
        steady = [(r, d) for r, d in candidates if _in_every_part(r, ranks, rules)]
        for r, d in sorted(steady, key=lambda c: -c[1]):
            s = _named(r, ranks, nodes.get(r.host), gpus, rules)
            # Only where its reason is one the scheduler gives a healthy rank: none, or little CPU while computing
            # (a throttled cgroup is a limit of its own; a loader, copies, its GPU, memory are its own too).
            throttled = (r.cgroup_throttled_fraction or 0) >= rules.reason["throttled_periods_min"]
            lag = _scheduler_lag(r, ranks, rules) if s.reason in ("unknown", "cpu") and not throttled else ""
            if lag:
                out.inconclusive = out.unsettled = True
                out.apart.append(f"Rank {r.rank} on {r.host} waits {d:.0%} less than the others in every third of "
                                 f"the window, with no cause of its own, but {lag}")
                continue
            out.stragglers.append(s)
        leader = next((r for r, _ in sorted(steady, key=lambda c: -c[1])
                       if any((s.host, s.pid) == (r.host, r.pid) for s in out.stragglers)), None)
        if leader is not None:
            _contention_beside(leader, ranks, caused, apart, out)
        for r, d in (c for c in candidates if c not in steady):
            out.leading.append((r, f"Rank {r.rank} on {r.host} worked longer than the others over the window ({d:.0%} "
                                   "less waiting) but not in every third of it: a passing slowdown (another process "
                                   "on the host, a burst of I/O) or a small steady one; not named."))
        out.unsettled = out.unsettled or (not out.stragglers and bool(out.leading))
        return
    if not out.stragglers:
        _leads(scored, ranks, held, rules, out)
        out.unsettled = out.unsettled or (bool(held) and _too_short(ranks, rules))
        _network(ranks, nodes, rules, out)


def _contention_beside(leader: RankSample, ranks: list[RankSample], caused: dict, apart: set[int],
                       out: Judgement) -> None:
    """A rank named only for CPU contention, whose stacks do not set it apart, beside a rank the others clearly wait
    for in every third of the window: said, not named. Model round 12 (cl-straggler-loader, four drills on one
    2-core host): rank 1 on mln2 headlined "CPU-starved host" for a run-queue wait seen in 1 of 1 scans, the others
    waiting 0% on it, while they waited 82% of the window on rank 2's loader. A limit (a throttled cgroup, steal,
    memory pressure) is named as before."""
    for r in ranks:
        causes = caused.get(id(r), [])
        if r is leader or id(r) in apart or not causes or any(c.kind != "contention" for c in causes):
            continue
        out.stragglers = [s for s in out.stragglers if (s.host, s.pid) != (r.host, r.pid)]
        out.findings.append(f"Rank {r.rank} on {r.host}: {'; '.join(c.evidence for c in causes)}; but its stacks "
                            f"wait like the others', and they wait on rank {leader.rank} on {leader.host}: not named "
                            "(its host's load is worth a look once that straggler is fixed).")


def _scheduler_lag(r: RankSample, ranks: list[RankSample], rules: Rules) -> str:
    """Why r's lead may be the CPU scheduler's, not r's, or "": every rank waits for a CPU (the hosts are
    oversubscribed) and r waited no less than the others. There a healthy rank falls behind for seconds at a time:
    a healthy 4-rank job on the namespace cluster beside two busy loops named rank 3 on mln4 (24% less waiting,
    run-queue wait 0.78 s/s against ~0.5 for the others, 57 samples in 10 s), and a clean clone's run named rank 2
    on mln3 the same way (2026-12-03). A loader, copies, a slow GPU or memory pressure are named whatever the run
    queues say (only a rank with no reason, or little CPU while computing, is held back here), and a CPU-only rank
    doing more work is judged by its CPU time next (_more_cpu_work)."""
    waits = [o.runqueue_wait_fraction for o in ranks]
    if any(w is None for w in waits) or min(waits) < rules.reason["runqueue_wait_min_s_per_s"]:
        return ""
    theirs = statistics.median(o.runqueue_wait_fraction for o in _others(ranks, r))
    if r.runqueue_wait_fraction < theirs:
        return ""
    # More processes competing on its own CPUs than on its peers' (a loop pinned beside it) is a cause of its own.
    crowd = [o.others_runnable for o in _others(ranks, r) if o.others_runnable is not None]
    if r.others_runnable is not None and crowd and r.others_runnable >= statistics.median(crowd) + 1:
        return ""
    return (f"every rank waits for a CPU ({min(waits):.2f}-{max(waits):.2f} s per s: the hosts are oversubscribed) "
            f"and it waited {r.runqueue_wait_fraction:.2f} s/s against the others' {theirs:.2f}: its lag may be the "
            "scheduler's, not its own; not named")


def _too_short(ranks: list[RankSample], rules: Rules) -> bool:
    """Whether the samples so far are too few to have seen the smallest straggler named (the margin, capped at
    lost_share_min of the window): then "no straggler" would be a shrug, and a longer look is due. At 6 s (27-30
    samples a rank) a rank 15% slower on the namespace cluster read 26% less waiting in one run and short of half
    the bar in another (issue 35); 90 samples resolve it for a job that waits ~95% of the window."""
    ref = statistics.median(_wait(r) for r in ranks)
    return rules.share.k * _sampling_error(ref, min(r.samples for r in ranks)) > rules.bar(ref, 0.0)


def _leads(scored, ranks: list[RankSample], held: set[int], rules: Rules, out: Judgement) -> None:
    """Ranks ahead of the others by more than half the bar but not past it: said; worth a longer look only while
    the bar is the noise's (more samples lower it). Once it is down to the margin, a lead short of it stays short:
    rank 0 logging 6% of the window in a healthy job that waits 40% of it is said, and the answer is given."""
    for r, d, thr, _ in sorted(scored, key=lambda x: -x[1]):
        if id(r) in held and thr / 2 < d <= thr:
            out.leading.append((r, f"Rank {r.rank} on {r.host} waits {d:.0%} less than the others, short of the "
                                   f"{thr:.0%} that names a straggler: not named."))
            out.unsettled = out.unsettled or thr > rules.bar(_others_wait(r, ranks), 0.0) + 1e-9


def _caused_not_held(ranks, caused: dict, held: set[int], out: Judgement) -> None:
    """A hard cause on a rank nobody waits for: said, not named (the rows show it; the headline must too)."""
    for r in (r for r in ranks if id(r) in caused and id(r) not in held):
        out.findings.append(f"Rank {r.rank} on {r.host}: {'; '.join(c.evidence for c in caused[id(r)])}; but the "
                            f"others wait only {_others_wait(r, ranks):.0%} of the window in collectives: nobody is "
                            "held back by it now.")


def _named(r: RankSample, ranks: list[RankSample], node: NodeSample | None, gpus: list[GpuSample], rules: Rules,
           causes: list[HostCause] = (), stage: str = "") -> Straggler:
    others_wait = _others_wait(r, ranks)
    own = own_work(r)
    s = Straggler(rank=r.rank, host=r.host, pid=r.pid, gpu_index=r.gpu_index, gpu_serial=r.gpu_serial,
                  others_wait_fraction=round(max(0.0, others_wait - _wait(r)), 3),
                  work_ratio=round(own / (1 - others_wait), 2) if others_wait < 1 else None)
    s.evidence.append(f"the other ranks wait {others_wait:.0%} of the window in collectives, it waits "
                      f"{_wait(r):.0%} ({r.samples} samples)")
    if causes and node is not None and node.shaped_links:
        # A link shaped on its own host in the window slows every collective it joins: that is the cause, and
        # the CPU figures are said beside it (under -n 2 a clean clone named the tbf'd mln4 for "cpu" when its
        # run-queue wait rose above its peers' on the loaded host, 2026-12-03).
        s.reason = "network"
        s.evidence += _shaped(r.host, node)
        s.evidence += [f"also on {r.host}: {c.evidence}" for c in causes]
        return s
    if causes:
        s.reason = causes[0].reason
        s.evidence += [c.evidence for c in causes]
        if s.others_wait_fraction < 0.1:         # its stacks do not set it apart: say why that does not clear it
            s.apart_in_stacks, s.work_ratio = False, None
            s.evidence.append("its stacks look like the others': a rank starved of CPU still reads as waiting inside "
                              "collectives (gloo spins on the CPU there)")
        return s
    # A loader or copies standing apart from every other rank's is the reason even below the share of its own work
    # that names it otherwise: the rest of its work is like theirs (bench/straggler_verdicts.py, 2026-12-02).
    stage = stage or next((a.stage for a in _apart_in(r, _others(ranks, r), rules.reason) if a.stage != "compute"), "")
    s.reason = _reason(r, _others(ranks, r), node, gpus, rules, s.evidence, stage)
    return s


def _share_of_work(r: RankSample, cls: str) -> float:
    own = own_work(r)
    return r.fractions.get(cls, 0) / own if own > 0 else 0.0


def _reason(r: RankSample, others, node: NodeSample | None, gpus, rules: Rules, evidence: list[str],
            stage: str = "") -> str:
    """Why r is slow; `stage`: the class its row stands apart in (_stages), which is then the reason."""
    rr = rules.reason
    for cls, name, label in (("data", "data_loading", "data loading"), ("h2d", "h2d", "host-to-device copies")):
        mine, theirs = _share_of_work(r, cls), statistics.median(_share_of_work(o, cls) for o in others)
        if cls == stage or (mine >= rr[f"{'data' if cls == 'data' else 'h2d'}_share_min"] and mine > theirs + 0.1):
            evidence.append(f"{mine:.0%} of its own work is {label} (others {theirs:.0%}), mostly at "
                            f"{r.top_frames.get(cls, '?')}")
            if cls == "data" and r.cpu_fraction is not None and r.cpu_fraction < rr["loader_cpu_max"]:
                evidence.append(f"it used {r.cpu_fraction:.2f} CPU-s/s: its loader waits (a read, its workers, a "
                                f"remote source, a sleep or a lock) rather than computes; hang_stack_dump native=true "
                                f"on pid {r.pid} shows on what")
            return name
    if node is not None and node.shaped_links:        # as in _named: a shaper on its host comes before its CPU
        evidence += _shaped(r.host, node)
        return "network"
    if cpu_starved(r, others, rules.reason, evidence):
        return "cpu"
    if node and node.psi_memory_some_pct is not None and node.psi_memory_some_pct >= rr["psi_memory_some_min_pct"]:
        evidence.append(f"memory pressure on {r.host}: some avg10 = {node.psi_memory_some_pct:.1f}%")
        return "memory"
    if _gpu_slow(r, gpus, rules, evidence):
        return "gpu"
    # No GPU seen (a CPU-only job, or no NVML): nothing says a GPU is slower, so none is blamed.
    # Said once for the whole answer (answer.py), not per rank.
    suspects = "a slower GPU or kernel path, or more work on this rank" if gpus else (
        "more work on this rank or a slower code path")
    evidence.append(f"it computes ({r.fractions.get('compute', 0):.0%} of samples, mostly at "
                    f"{r.top_frames.get('compute', '?')}) with no host cause seen: {suspects}")
    return "unknown"


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


def _shaped(host: str, node: NodeSample) -> list[str]:
    """The shapers seen on a node's links in the window, one evidence line each."""
    return [f"{host}: {link}" for link in node.shaped_links]


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
    # A link shaped in the window is the cause where one is seen: the nodes sending into it retransmit too (a
    # clean-clone run named mln3 for its retransmits beside mln4, whose tbf did it, and headlined mln3).
    shaped = {h for h, n in nodes.items() if n.shaped_links}
    for host, node in nodes.items():
        rest = [v for h, v in retrans.items() if h != host]
        # Retransmits name a node only when they are many and far above the rest: a busy host drops a few.
        noisy = not shaped and retrans[host] >= rules.reason["retrans_per_s_min"] and retrans[host] > 5 * max(
            1.0, statistics.median(rest) if rest else 0)
        if not node.shaped_links and not noisy:
            continue
        for r in (x for x in ranks if x.host == host):
            s = Straggler(rank=r.rank, host=host, pid=r.pid, gpu_index=r.gpu_index, gpu_serial=r.gpu_serial,
                          others_wait_fraction=round(statistics.median(waits), 3), reason="network")
            s.evidence.append(f"every rank waits in collectives ({min(waits):.0%}-{max(waits):.0%} of the window), "
                              "so the collectives themselves are slow")
            s.evidence += _shaped(host, node)
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


STAGES = {"data": "data loading", "h2d": "host-to-device copies", "compute": "compute"}


@dataclass(frozen=True)
class Apart:
    """One rank's row standing apart from every other rank's in one stage."""
    rank: RankSample
    stage: str              # the class: "data", "h2d", "compute"
    label: str              # its words: "data loading", "host-to-device copies", "compute"
    mine: float
    theirs: float           # the nearest other rank's figure
    steady: bool            # in every third of the window too


def _stage_gap(cls: str, rr: dict) -> float:
    return rr["stage_gap_min"] if cls != "compute" else rr["compute_gap_min"]


def _apart_in(r: RankSample, others: list[RankSample], rr: dict) -> list[Apart]:
    """The stages in which r's share is at least stage_factor_min times every other rank's and stage_gap_min of the
    window above it, over at least stage_samples_min of its samples."""
    found = []
    for cls, label in STAGES.items():
        mine, theirs = r.fractions.get(cls, 0.0), max(o.fractions.get(cls, 0.0) for o in others)
        gap = _stage_gap(cls, rr)
        if mine * r.samples < rr["stage_samples_min"] or mine < rr["stage_factor_min"] * theirs or mine - theirs < gap:
            continue
        found.append(Apart(r, cls, label, mine, theirs, _apart_in_every_third(r, others, cls, gap, rr)))
    # CPU time is not a stage here: a rank starved of it is judged by the kernel's counters against its peers
    # (host_causes.py), and on a loaded host the ranks' CPU time scatters 2x with nobody behind.
    return found


def _too_few_to_tell(ranks: list[RankSample], rules: Rules, out: Judgement) -> None:
    """A stage row that stands apart by its share but on fewer than stage_samples_min samples: a longer look may
    tell, so "no straggler" is not the answer yet (model round 6, cl-small-straggler: rank 3 loading 7.1% of the
    window against at most 1.2%, on 6 samples of 84, was "No straggler" after 12 s of a 60 s bound; named at 20 Hz)."""
    rr = rules.reason
    for r in ranks:
        others = _others(ranks, r)
        for cls, label in STAGES.items():
            mine, theirs = r.fractions.get(cls, 0.0), max(o.fractions.get(cls, 0.0) for o in others)
            if mine >= rr["stage_factor_min"] * theirs and mine - theirs >= _stage_gap(cls, rr) \
                    and mine * r.samples < rr["stage_samples_min"]:
                out.unsettled = out.inconclusive = True     # longer looks add samples; at the bound, said as such
                out.apart.append(f"Rank {r.rank} on {r.host}: its {label} stands apart ({mine:.1%} of the window "
                                 f"against at most {theirs:.1%} for every other rank) on only {round(mine * r.samples)} "
                                 f"samples, fewer than the {rr['stage_samples_min']:g} that judge it")


def _apart_in_every_third(r: RankSample, others: list[RankSample], cls: str, gap: float, rr: dict) -> bool:
    """Whether r's share of `cls` stands apart in each third of the window too, by half the gap (a third holds a
    third of the samples), as _in_every_part asks of a lead in waiting."""
    for i, part in enumerate(r.part_fractions):
        mine = part.get(cls, 0.0)
        theirs = max((o.part_fractions[i].get(cls, 0.0) for o in others if len(o.part_fractions) > i), default=0.0)
        if mine - theirs < gap / 2 or mine < rr["stage_factor_min"] * theirs:
            return False
    return bool(r.part_fractions)


def _stages(ranks: list[RankSample], nodes, gpus, rules: Rules, out: Judgement) -> None:
    """Nobody named on waiting: a rank whose row stands apart in a stage is named for it when it is clear-cut (one
    rank, steady in every third, waiting less than every other rank while they are held back); otherwise the answer
    is inconclusive with the figure, and worth a longer look. Never "no straggler" above such a row."""
    apart = [a for r in ranks for a in _apart_in(r, _others(ranks, r), rules.reason)]
    if not apart:
        _too_few_to_tell(ranks, rules, out)
        return
    who = {id(a.rank) for a in apart}
    a = apart[0]
    r = a.rank
    clear = (len(who) == 1 and a.steady and
             _others_wait(r, ranks) >= rules.min_others_wait and _wait(r) < min(_wait(o) for o in _others(ranks, r)))
    if clear:
        s = _named(r, ranks, nodes.get(r.host), gpus, rules, stage=a.stage)
        d, thr, _ = _stands_out(r, ranks, rules)
        s.evidence.insert(1, f"its {a.label} stands apart: {a.mine:.1%} of the window against at most {a.theirs:.1%} for "
                             f"every other rank, in every third of it; its lead in waiting ({d:.0%} less than the "
                             f"others) is short of the {thr:.0%} that names a rank on waiting alone")
        out.stragglers.append(s)
        out.unsettled = False
        return
    out.inconclusive = out.unsettled = True
    for a in apart:
        out.apart.append(f"Rank {a.rank.rank} on {a.rank.host}: its {a.label} stands apart ({a.mine:.1%} of the window "
                         f"against at most {a.theirs:.1%} for every other rank), but not clearly enough to name it"
                         + ("" if a.steady else " (not in every third of the window)"))


def _cpu_lead(r: RankSample, others: list[RankSample], rr: dict, part: int | None = None) -> tuple[float, float]:
    """(r's CPU-s per s over the others' median, less 1; the bar it must pass) over the window or one third."""
    mine = r.cpu_fraction if part is None else r.part_cpu[part]
    theirs = [o.cpu_fraction if part is None else o.part_cpu[part] for o in others]
    ref = statistics.median(theirs)
    if not ref or mine is None:
        return 0.0, math.inf
    return mine / ref - 1, max(rr["cpu_work_margin"], rr["cpu_work_k"] * relative_spread(theirs))


def _more_cpu_work(ranks: list[RankSample], nodes, gpus: list[GpuSample], rules: Rules, out: Judgement,
                   sampled_s: float) -> None:
    """A CPU-only job (none of its ranks holds a GPU, every rank's CPU time read): the rank that uses more CPU per second than the
    others while they wait on it does more work per step (the rule's figures: straggler_rules.toml). Under load
    its stacks' shares need minutes to separate a 15% straggler; its CPU time does not (the kernel counts every
    tick). A GPU job's ranks spin while they wait, so there CPU time is no measure of work and this says nothing.
    Only on cpu_work_min_s of samples or more: one 6 s look named a healthy rank for a 9% lead at load 9 (a clean
    clone's run); over 18 s healthy leads stayed <= 5.2% and a 15% straggler's >= 9.2% (straggler_rules.toml)."""
    rr = rules.reason
    if statistics.median(_wait(r) for r in ranks) >= rr["cpu_work_max_wait"]:
        return          # communication-bound: CPU time is the collectives' more than the work's (straggler_rules.toml)
    parts = {len(r.part_cpu) for r in ranks}
    # The others' spread is part of the bar: too few of them to measure it (judging.MIN_FOR_SPREAD), no verdict.
    if (any(g.job_pids for g in gpus) or len(ranks) < MIN_FOR_SPREAD + 1 or len(parts) != 1
            or any(r.gpu_index is not None or r.cpu_fraction is None for r in ranks)):
        return
    n_parts = parts.pop()
    leads = []
    for r in ranks:
        others = _others(ranks, r)
        lead, bar = _cpu_lead(r, others, rr)
        if lead > bar / 2:
            steady = n_parts > 0 and all(_cpu_lead(r, others, rr, i)[0] > bar / 2 for i in range(n_parts))
            leads.append((r, lead, bar, steady))
    if not leads:
        return
    r, lead, bar, steady = max(leads, key=lambda x: x[1])
    held = _others_wait(r, ranks) >= rules.min_others_wait
    others = _others(ranks, r)
    theirs = statistics.median(o.cpu_fraction for o in others)
    figure = (f"rank {r.rank} on {r.host} used {r.cpu_fraction:.3f} CPU-s per s, {lead:.0%} above the others' median "
              f"{theirs:.3f} (bar {bar:.0%})")
    clear = len(leads) == 1 and lead > bar and steady and held
    if clear and sampled_s < rr["cpu_work_min_s"]:
        # past the bar, but on a look too short to tell it from the host's noise: another look (look.py), and at
        # the caller's bound an inconclusive answer with the figure
        out.inconclusive = out.unsettled = True
        out.apart.append(f"CPU time: {figure}, in every third of the window, but on only {sampled_s:.0f} s of "
                         f"samples (a CPU-time lead is judged on {rr['cpu_work_min_s']:g} s or more)")
        return
    if clear:
        s = _named(r, ranks, nodes.get(r.host), gpus, rules, stage="compute")
        # its pace is its CPU time's: the wait shares that work_ratio comes from did not separate (a headline read
        # "its own work takes 1.0x the others'" on a rank named for 12% more CPU, 2026-12-03)
        s.reason, s.work_ratio = "compute", round(r.cpu_fraction / theirs, 2) if theirs > 0 else None
        s.evidence = [s.evidence[0], f"it does more work per step: {figure}, in every third of the window "
                      f"({', '.join(f'{c:.3f}' for c in r.part_cpu)} CPU-s per s); the ranks step together, so CPU "
                      "time per second is work per step in a CPU-only job", *s.evidence[1:]]
        out.stragglers.append(s)
        out.inconclusive = out.unsettled = False
        return
    why = ("not in every third of the window" if not steady else "the others do not wait on it" if not held
           else "short of the bar" if lead <= bar else "more than one rank leads")
    out.leading.append((r, f"CPU time: {figure}; not named ({why})."))
    out.unsettled = out.unsettled or held
