"""Hard causes on a rank's host: what makes it a straggler whatever its stacks say.

The stacks judge a rank by how long it waits in collectives. That misses a starved rank: gloo spins
on the CPU inside a collective, so a rank throttled by its cgroup or queued behind other processes
reads as "waiting" like its peers (issue 35: a rank throttled in 100% of CFS periods, run-queue wait
1.29 s/s against ~0.21, was answered "no straggler"). So a rank whose host shows one of these, far
above its peers', is named for it, with its figure and the peers':
- its cpu cgroup throttled in many more CFS periods than the others' (a CPU limit);
- its run-queue wait (/proc/PID/schedstat: seconds waiting for a CPU per second) several times the
  others' (CPU contention), with the other processes runnable on its CPUs;
- its node's steal (the hypervisor) or memory pressure (PSI) above the other nodes'.
Each is measured by the kernel, not read from the rank; the margins are in straggler_rules.toml.
"""

import statistics
from dataclasses import dataclass
from typing import Literal

from .models import NodeSample, RankSample


@dataclass(frozen=True)
class HostCause:
    reason: str          # the Straggler reason it names: "cpu" | "memory"
    evidence: str        # the sentence, with its figure and the peers'
    # Which view: "contention" (run-queue wait) is the one a busy shared host also shows on a healthy rank (judge.py
    # says it, not names it, beside a rank the others clearly wait for); the others are limits and pressures.
    kind: Literal["limit", "contention"] = "limit"


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _throttled(r: RankSample, others: list[RankSample], rr: dict) -> HostCause | None:
    mine = r.cgroup_throttled_fraction
    theirs = _median(o.cgroup_throttled_fraction or 0.0 for o in others) or 0.0
    if mine is None or mine - theirs < rr["throttled_periods_min"]:
        return None
    used = f"; it used {r.cpu_fraction:.2f} CPU-s per s" if r.cpu_fraction is not None else ""
    return HostCause("cpu", f"its cpu cgroup {r.cgroup or '?'} was throttled in {mine:.0%} of CFS periods (the "
                            f"others {theirs:.0%}): a CPU limit{quota(r)}{used}")


def quota(r: RankSample) -> str:
    """', quota 0.25 CPU (/mln/mln3: cpu.cfs_quota_us 25000 / cpu.cfs_period_us 100000)', or '' when none was read."""
    return f", quota {r.cpu_limit_cpus:g} CPU ({r.cpu_limit_at})" if r.cpu_limit_cpus is not None else ""


def _ran_share(r: RankSample) -> float | None:
    """Of the time its threads were runnable, the share they ran: CPU time / (CPU time + run-queue wait)."""
    if r.cpu_fraction is None or r.runqueue_wait_fraction is None or r.cpu_fraction + r.runqueue_wait_fraction <= 0:
        return None
    return r.cpu_fraction / (r.cpu_fraction + r.runqueue_wait_fraction)


def contention(r: RankSample, others: list[RankSample]) -> str:
    """The contention sentence: its run-queue wait and its peers', who else runs on its CPUs, the share it ran."""
    theirs = _median(o.runqueue_wait_fraction for o in others)
    behind = (f", {r.others_runnable:g} other runnable processes on its CPUs ({r.cpus or '?'})"
              if r.others_runnable is not None else "")
    if r.competitors:
        behind += f": {'; '.join(r.competitors)}"
    if r.job_runnable:
        behind += f"; the job's own other processes there: {r.job_runnable:g}"
    ran, their_ran = _ran_share(r), _median(_ran_share(o) for o in others)
    share = f"; it ran {ran:.0%} of the time it was runnable (peers {their_ran:.0%})" if ran is not None and their_ran else ""
    return (f"CPU contention: run-queue wait {r.runqueue_wait_fraction or 0:.2f} s/s (peers "
            f"{theirs if theirs is not None else float('nan'):.2f}){behind}{share}")


def _contended(r: RankSample, others: list[RankSample], rr: dict) -> HostCause | None:
    # Two views of one cause: on a quiet host its wait stands out (1.29 s/s against 0.21); on an oversubscribed
    # one every rank waits ~1 s/s, and what sets the starved one apart is how little of that time it runs.
    mine, theirs = r.runqueue_wait_fraction, _median(o.runqueue_wait_fraction for o in others)
    if mine is None or theirs is None or mine < rr["runqueue_wait_min_s_per_s"]:
        return None
    ran, their_ran = _ran_share(r), _median(_ran_share(o) for o in others)
    waits_more = mine >= rr["runqueue_wait_ratio_min"] * theirs
    runs_less = ran is not None and their_ran is not None and ran * rr["runqueue_wait_ratio_min"] <= their_ran
    # Running less of its runnable time is starvation only if it also got less CPU: at load 17 on 2 cores (-n 4
    # clean clone, 2026-12-05) a healthy rank ran 4% of its runnable time against its peers' 12% and got the same
    # 0.018 CPU-s/s as they did (0.017-0.022), and was named a second straggler beside the throttled one.
    their_cpu = _median(o.cpu_fraction for o in others)
    starved = (r.cpu_fraction is not None and their_cpu is not None
               and r.cpu_fraction * rr["runs_less_cpu_ratio_min"] <= their_cpu)
    return HostCause("cpu", contention(r, others), "contention") if waits_more or (runs_less and starved) else None


def _node_causes(r: RankSample, nodes: dict[str, NodeSample], rr: dict) -> list[HostCause]:
    """Steal and memory pressure: node figures, compared with the other nodes' (one node has no peers)."""
    node, rest = nodes.get(r.host), [n for h, n in nodes.items() if h != r.host]
    if node is None or not rest:
        return []
    out = []
    steal, theirs = node.steal_fraction, _median(n.steal_fraction for n in rest)
    if steal is not None and theirs is not None and steal - theirs >= rr["steal_min"]:
        out.append(HostCause("cpu", f"the hypervisor stole {steal:.0%} of {r.host}'s CPU time (other nodes {theirs:.0%})"))
    psi, theirs = node.psi_memory_some_pct, _median(n.psi_memory_some_pct for n in rest)
    if psi is not None and theirs is not None and psi - theirs >= rr["psi_memory_some_min_pct"]:
        out.append(HostCause("memory", f"memory pressure on {r.host}: PSI memory some avg10 {psi:.1f}% (other nodes "
                                       f"{theirs:.1f}%)"))
    return out


def host_causes(r: RankSample, ranks: list[RankSample], nodes: dict[str, NodeSample], rr: dict) -> list[HostCause]:
    """Every hard cause r's host shows against its peers (rr: straggler_rules.toml [reason]); [] when none."""
    others = [o for o in ranks if o is not r]
    found = [c for c in (_throttled(r, others, rr), _contended(r, others, rr)) if c]
    return found + _node_causes(r, nodes, rr)


def _efficiency(r: RankSample) -> float | None:
    busy = r.fractions.get("compute", 0) + r.fractions.get("data", 0) + r.fractions.get("h2d", 0)
    return r.cpu_fraction / busy if r.cpu_fraction is not None and busy > 0.05 else None


def cpu_starved(r: RankSample, others, rr: dict, evidence: list[str]) -> bool:
    """The absolute CPU reasons, for a rank named by its stacks: throttled often, or little CPU while computing."""
    if r.cgroup_throttled_fraction is not None and r.cgroup_throttled_fraction >= rr["throttled_periods_min"]:
        evidence.append(f"its cpu cgroup {r.cgroup or '?'} was throttled in {r.cgroup_throttled_fraction:.0%} of "
                        f"CFS periods (a CPU limit{quota(r)}); it used {r.cpu_fraction or 0:.2f} CPU-s per s")
        return True
    mine = _efficiency(r)
    theirs = [e for e in (_efficiency(o) for o in others) if e is not None]
    if mine is not None and theirs and mine < rr["cpu_efficiency_max"] and mine * 1.5 < statistics.median(theirs):
        waited = f"{contention(r, others)}; " if r.runqueue_wait_fraction is not None else ""
        evidence.append(f"{waited}while computing it got {mine:.2f} CPU-s per s (others {statistics.median(theirs):.2f})")
        return True
    return False
