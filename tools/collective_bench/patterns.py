"""collective_bench with pattern "pairwise" or "bisect": which nodes, how rounds run, the tool's answer."""

from __future__ import annotations

import functools
import math
import os
import random
from typing import Annotated, Literal

from ..engine.spec import Field, Params, ToolFailure
from ..engine.transport import node_set
from ..shared import slurm as _slurm
from ..shared.launch import over_ssh, use_srun
from ..shared.launch_ssh import launch_ranks_ssh
from .isolation import IsolationReport, bisect, draw_heatmap, pairwise
from .node_agents import SECRET_ENV, agent, coordinate, open_store, run_secret
from .node_groups import remove_scratch, run_round_srun, run_round_ssh, ssh_group_command
from .group_pace import GroupPace
from .pair_pace import Pace
from .pair_schedule import full_round_count


NodeName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-\[\]:]+$", max_length=255)]


class PatternFields(Params):
    """The inputs of the pairwise and bisect patterns (CollectiveBenchParams inherits them)."""

    pattern: Literal["all", "pairwise", "bisect"] = Field("all", description=(
        # the tool description says what pairwise and bisect name; said once there
        "all: one run over every rank; pairwise / bisect: find the bad node or link."))
    pair_rounds: int | None = Field(None, ge=1, le=8191, description=(
        "pairwise; default all (every pair once)."))
    group_deadline_s: float = Field(120.0, ge=10, le=3600, description=(
        "pairwise/bisect: a group running longer counts as hung."))
    slow_margin: float | None = Field(None, gt=0, lt=1, description=(
        "pairwise: verdict margin (default verdict_rules.toml: 10% NCCL, 50% gloo)."))
    slow_latency_factor: float = Field(5.0, ge=1.5, le=1000, description=(
        "pairwise: slow above this x a healthy pair's latency."))
    nodes: list[NodeName] | None = Field(None, min_length=2, max_length=8192, description=(
        "pairwise/bisect: only these nodes."))
    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$", max_length=128, description=(
        "No allocation: a job of ours here (nnodes; default all idle)."))
    job_id: str | None = Field(None, pattern=r"^\d+(_\d+)?$", max_length=40, description=(
        "Run inside this RUNNING job."))
    hosts: list[NodeName] | None = Field(None, min_length=1, max_length=8192, description=(
        "No SLURM: hosts over ssh (mln[1-4]), one call. By hand on each: with node_rank, rdzv_endpoint, "
        "MLENG_COORD_SECRET."))
    node_rank: int | None = Field(None, ge=0, le=8191, description="This node's index in hosts.")
    transport: Literal["nccl", "rdma"] = Field("nccl", description=(
        "pairwise: nccl (all_reduce) or rdma (perftest per rail; needs perftest, ACTIVE ports)."))


def ssh_hosts(params) -> list[str] | None:
    """The hosts to reach over ssh from here (hosts= without node_rank / rdzv_endpoint), expanded from
    node-set text; None when the call is not one; ToolFailure naming the field when it is wrong."""
    if not params.hosts or params.node_rank is not None or params.rdzv_endpoint:
        return None
    if not over_ssh():
        raise ToolFailure("hosts: without node_rank, hosts are reached over ssh, and this machine has SLURM: give "
                          "nodes inside an allocation (or partition / job_id), or set MLENG_TRANSPORT=ssh to reach "
                          "these hosts over ssh")
    try:
        names = node_set(params.hosts, limit=8192)
    except ValueError as exc:
        raise ToolFailure(f"hosts: {exc}") from None
    if len(names) < 2:
        raise ToolFailure(f"hosts: need 2 or more hosts, got {names}")
    return names


def pattern_nodes(params) -> tuple[list[str], str]:
    """(node names in matrix order, "srun", "ssh" or "agents"); a clear error naming the field otherwise."""
    if (names := ssh_hosts(params)) is not None:
        return names, "ssh"
    if params.hosts:
        if params.node_rank is None or not params.rdzv_endpoint:
            raise ToolFailure("hosts: outside SLURM every node runs the same command with hosts (all node "
                              "addresses, in order), its own node_rank and rdzv_endpoint (first host:free port)")
        if len(params.hosts) < 2 or len(set(params.hosts)) != len(params.hosts):
            raise ToolFailure(f"hosts: need 2 or more different node addresses, got {params.hosts}")
        if not 0 <= params.node_rank < len(params.hosts):
            raise ToolFailure(f"node_rank: {params.node_rank} is outside 0..{len(params.hosts) - 1} (hosts has "
                              f"{len(params.hosts)} nodes)")
        return list(params.hosts), "agents"
    if not use_srun(2):
        raise ToolFailure(f"pattern: {params.pattern} needs several nodes: run it inside a SLURM allocation "
                          "(salloc -N 4 ...), give partition (a job of our own) or job_id (a running job's nodes), or give "
                          "hosts (reached over ssh from here, e.g. gpu-[01-16])")
    names = _slurm.allocation_nodes()
    if params.nodes:
        unknown = [n for n in params.nodes if n not in names]
        if unknown:
            raise ToolFailure(f"nodes: {', '.join(unknown)} not in this allocation ({', '.join(names)})")
        names = [n for n in names if n in params.nodes]
    if len(names) < 2:
        raise ToolFailure(f"nodes: pattern {params.pattern} needs at least 2 nodes, the allocation has {names}")
    return names, "srun"


def launch_all_ssh(hosts: list[str], job: dict, nproc: int, *, stall_s: float, deadline_s: float, on_event):
    """pattern all over ssh: one run over every rank of every host (a LaunchOutcome, as launch_ranks gives)."""
    return launch_ranks_ssh(hosts, ssh_group_command(job, hosts, nproc, 29500 + random.randrange(1000)),
                            nproc * len(hosts), deadline_s=deadline_s, stall_s=stall_s, on_event=on_event)


def take_allocation(params, timeout_s: float, progress):
    """The allocation partition / job_id ask for (an Allocation, shared/allocation.py), or None to run here."""
    if not (params.partition or params.job_id):
        return None
    from ..shared.allocation import existing, request

    if params.partition and params.job_id:
        raise ToolFailure("job_id: give job_id (a running job's nodes) or partition (a job of our own), not both")
    if params.hosts or params.rdzv_endpoint:
        raise ToolFailure(f"{'hosts' if params.hosts else 'rdzv_endpoint'}: outside SLURM only; with "
                          f"{'partition' if params.partition else 'job_id'} SLURM places the ranks")
    if params.job_id:
        return existing(params.job_id)
    progress(0.0, f"asking partition {params.partition} for {params.nnodes or 'every idle'} node(s) (salloc)")
    allocation = request(params.partition, params.nnodes, params.nodes, timeout_s)
    progress(0.01, f"job {allocation.job_id}: {', '.join(allocation.nodes[:8])}")
    return allocation


def check_rounds(params, n: int) -> None:
    if params.pair_rounds is not None and params.pair_rounds > full_round_count(n):
        raise ToolFailure(f"pair_rounds: {params.pair_rounds} is more than the {full_round_count(n)} rounds "
                          f"that cover every pair of {n} nodes")


def run_pace(pattern: str):
    """What stops a group before its deadline: a pair far slower than the healthy ones (pairwise); a second
    measurement that measured nothing long after groups like it finished (bisect, group_pace.py)."""
    return Pace() if pattern == "pairwise" else GroupPace()


def run_pattern(params, job: dict, nproc: int, progress) -> tuple[IsolationReport | None, list[str]]:
    """Run the pattern; (report, findings). report is None on a node that is not the coordinator."""
    names, how = pattern_nodes(params)
    check_rounds(params, len(names))
    if params.transport == "rdma" and (params.pattern != "pairwise" or how == "agents"):
        raise ToolFailure("transport: rdma runs with pattern pairwise, on nodes reached through SLURM (an "
                          "allocation, partition or job_id) or over ssh (hosts without node_rank); not with "
                          "node_rank and rdzv_endpoint, nor with pattern bisect")
    if how == "agents":
        run_secret()  # refused now, before any round, when the nodes were not given the run's secret;
        #               after the parameters, so bad input is named first
    job = {**job, "ops": ["all_reduce"]}
    deadline = params.group_deadline_s

    pace = run_pace(params.pattern)

    def drive(run_round):
        if params.pattern == "pairwise":
            return pairwise(names, run_round, rounds=params.pair_rounds, margin=params.slow_margin,
                            backend=None if job.get("backend") == "auto" else job.get("backend"),
                            latency_factor=params.slow_latency_factor, progress=progress)
        return bisect(names, run_round, progress=progress, pace=pace)

    if how == "ssh" and params.transport != "rdma":
        return drive(functools.partial(run_round_ssh, names=names, job=job, nproc=nproc, deadline_s=deadline,
                                       pg_timeout_s=params.pg_timeout_s, port=29500 + random.randrange(1000),
                                       pace=pace)), []
    if params.transport == "rdma":
        from .rdma_rounds import launcher, rdma_transport, readiness, run_round_rdma

        transport, addresses = rdma_transport(how, names)
        devices = readiness(transport, names)
        return drive(functools.partial(run_round_rdma, names=names, devices=devices, addresses=addresses,
                                       deadline_s=deadline, launch=launcher(transport))), []
    if how == "srun":
        port, tag, report = 29500 + random.randrange(1000), os.urandom(8).hex(), None
        try:
            report = drive(functools.partial(run_round_srun, names=names, job=job, nproc=nproc, deadline_s=deadline,
                                             pg_timeout_s=params.pg_timeout_s, port=port, scratch_tag=tag, pace=pace))
            return report, []
        finally:  # on the nodes that ran a group: a step that includes a dead node is refused as a whole
            ran = {n for g in report.groups if g.status == "ok" for n in g.nodes} if report else set(names)
            remove_scratch([n for n in names if n in ran] or names, tag)
    if params.node_rank == 0:
        return coordinate(names, job, endpoint=params.rdzv_endpoint, nproc=nproc, deadline_s=deadline,
                          pg_timeout_s=params.pg_timeout_s, drive=drive), []
    wait_s = deadline * 4 + 120
    ran = agent(open_store(params.rdzv_endpoint, False, wait_s, run_secret()), names, params.node_rank, job, nproc=nproc,
                deadline_s=deadline, pg_timeout_s=params.pg_timeout_s,
                port=int(params.rdzv_endpoint.rpartition(":")[2]), wait_s=wait_s)
    return None, [f"This node ({names[params.node_rank]}) ran its share of {ran} rounds; the first node "
                  f"({names[0]}) coordinates them and reports the matrix and the suspects."]


def pattern_findings(report: IsolationReport) -> tuple[str, list[str], list[str]]:
    """(verdict, findings, next) of a finished pattern."""
    failing = [g for g in report.groups if g.status != "ok"]
    failed = len(failing)
    # which groups, while few: "2 failed or hung" beside one suspect sent the model to the stored result to see
    # that both were the same pair, first and measured again (model round 7, ssh-slow-link)
    which = (": " + ", ".join(f"{'+'.join(g.nodes)} (round {g.round})" for g in failing)) if 0 < failed <= 4 else ""
    head = (f"{report.pattern}: {len(report.nodes)} nodes, {report.rounds} rounds, {len(report.groups)} groups "
            f"({failed} failed or hung{which}), {report.wall_s:.0f} s")
    if report.reference_busbw_gbps:
        head += f"; a healthy pair: {report.reference_busbw_gbps:.3g} GB/s busbw"
    findings = [f"Suspect {s.kind} {' - '.join(s.nodes)}: {s.evidence}." for s in report.suspects] + [head]
    per_node = _per_node(report)
    if per_node:
        findings.append(per_node)
    pairs = _pairs(report)
    if pairs:
        findings.append(pairs)
    lagging = _behind_every_pair(report)
    findings += [BEHIND + line for _, line in lagging]
    for s in (s for s in report.suspects if s.kind == "link"):
        # The two hosts are fine with their other partners: what differs is the path between them (model round 7,
        # ssh-slow-link: "none of the next steps checks the path between two hosts").
        findings.insert(findings.index(head), (
            f"Between {s.nodes[0]} and {s.nodes[1]} only: the route each takes to the other, the MTU along that "
            "path, firewall and traffic-shaping (tc) rules on both, the switch ports or cables only this pair "
            "crosses; nic_health on each end reads its NIC's counters and any tc shaper on it."))
    findings += [f"{note}." for note in report._not_counted]
    if report.inconclusive:
        # Whether anything failed is answered whatever the speeds' spread: model round 12 asked about hangs and
        # unreachable nodes (cl-link-down, cl-healthy-allreduce, ssh-healthy-network) and read "Inconclusive" first
        # over groups that all finished.
        finished = report.groups and all(g.status == "ok" for g in report.groups)
        findings.insert(0, (f"Every one of the {len(report.groups)} groups finished; none failed or hung. "
                            if finished else "")
                        + f"Inconclusive on speed: healthy pairs' busbw spread {report.spread:.0%} (1.4826 x MAD / "
                          f"median) in this run; the rule's threshold, max(margin, k x spread) = "
                          f"{report.threshold:.0%} below a healthy pair, is past what this check can resolve: no "
                          "node or link is named for being slow (only pairs that failed or hung twice are). Run again "
                          "with the nodes idle (no other jobs), or with larger sizes.")
    if report._nothing_passed:
        sizes = sorted({len(g.nodes) for g in report.groups})
        span = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        findings.insert(0, f"Inconclusive: all {len(report.groups)} groups ({span} nodes) failed or hung and none "
                           "passed, so no node can be told from another (one is named only against a partner that "
                           "passed). What every group shares is the likelier cause: the launcher, the rendezvous "
                           "port, the software stack, or hosts too busy to start within group_deadline_s. Next: "
                           f"dist_smoke_test on two of these nodes; if it passes, {report.pattern} again with a "
                           "longer group_deadline_s.")
    if report.unconfirmed:
        findings.append(f"Not named ({len(report.unconfirmed)}): " + "; ".join(
            f"{s.kind} {' - '.join(s.nodes)}: {s.evidence}" for s in report.unconfirmed[:6]) + ".")
    if report.rule:
        findings.append(f"Rule: {report.rule}.")
    if report.refused_messages:
        findings.append(f"{report.refused_messages} message(s) on the coordinator's store were not signed with "
                        f"this run's {SECRET_ENV} and were refused: something other than our nodes wrote to it.")
    nodes = [n for s in report.suspects if s.kind == "node" for n in s.nodes]
    if nodes and os.environ.get("SLURM_JOB_ID"):
        findings.append(f"To take it out of service (not run by this tool): scontrol update nodename="
                        f"{','.join(nodes)} state=drain reason=\"mleng {report.pattern}: slow or failing\"")
    if not report.suspects:
        # A suspect that was fine when measured again was a passing slowdown: the run found nothing to act on, and
        # says so first; "warn" over it left the model asking whether to act (model round 7, cl-healthy-allreduce).
        cleared = report.unconfirmed and all(s.cleared for s in report.unconfirmed)
        calm = not failed and not report.inconclusive and (not report.unconfirmed or cleared) and not lagging
        if calm:
            findings.insert(0, f"No bad node or link: every pair of the {len(report.nodes)} nodes is within the rule"
                               + (f"; {len(report.unconfirmed)} suspect(s) slow at first were fine when measured again "
                                  "(a passing slowdown, not named)" if cleared else "") + ".")
        elif lagging and not report.inconclusive and not report._nothing_passed:
            # nothing named, one node to look at first: that is the answer, so it leads
            findings.remove(BEHIND + lagging[0][1])
            findings.insert(0, BEHIND_FIRST + lagging[0][1])
        return ("ok" if calm else "warn"), findings, (["dist_smoke_test"] if report._nothing_passed else []) + (
            ["fleet_sweep"] if lagging else []) + ["knowledge://network/finding-the-bad-node.md"]
    nxt = next_steps(report.suspects)
    return "fail", findings, nxt + (["fleet_sweep"] if lagging and "fleet_sweep" not in nxt else [])


PER_NODE_MAX = 16   # a line a node: past this the matrices (results_history result_id=N) say it better


def _per_node(report: IsolationReport) -> str:
    """Each node's busbw with its partners (geometric mean of the pairs measured with it), slowest first: what tells
    one slow node (low with every partner) from one slow link, without opening the matrix (model round 7 opened
    results_history for it in two drills of two)."""
    bw = report.busbw_matrix
    if not bw or len(report.nodes) > PER_NODE_MAX:
        return ""
    means = []
    for i, name in enumerate(report.nodes):
        row = [v for j, v in enumerate(bw[i]) if j != i and v]
        if row:
            means.append((math.exp(sum(math.log(v) for v in row) / len(row)), name, len(row)))
    if len(means) < 2:
        return ""
    return ("Per node, busbw with its partners (geometric mean of the pairs measured with it), slowest first: "
            + ", ".join(f"{name} {mean:.3g} GB/s ({k})" for mean, name, k in sorted(means)) + ".")


BEHIND_BY = 0.25  # under every other pair by this much: the node to check first, not named (the margin is for that)


def _behind_every_pair(report: IsolationReport) -> list[tuple[str, str]]:
    """(node, line) for each node not named whose every measured pair is under every measured pair without it, by
    BEHIND_BY at least: below the rule's margin on a loaded host, yet the one node to check. Model round 8,
    cl-link-and-starved-node: mln4, capped to 0.2 CPU, 0.117-0.122 GB/s with each partner against 0.17-0.29 for the
    pairs without it, was under the 50% gloo margin of a reference its own pairs pulled down; the answer named only
    the link and the model named mln4 from fleet_sweep, against the headline."""
    bw = report.busbw_matrix
    if report.pattern != "pairwise" or not bw:
        return []
    named = {n for s in report.suspects if s.kind == "node" for n in s.nodes}
    links = {frozenset(s.nodes) for s in report.suspects if s.kind != "node"}
    n, out = len(report.nodes), []
    pairs = {(i, j): bw[i][j] for i in range(n) for j in range(i + 1, n)
             if bw[i][j] and frozenset((report.nodes[i], report.nodes[j])) not in links}
    for k, name in enumerate(report.nodes):
        own = [v for (i, j), v in pairs.items() if k in (i, j)]
        others = [v for (i, j), v in pairs.items() if k not in (i, j)]
        if name in named or len(own) < 2 or len(others) < 2 or max(own) >= (1 - BEHIND_BY) * min(others):
            continue
        out.append((name, f"{name} {min(own):.3g}-{max(own):.3g} GB/s with each of its {len(own)} measured "
                          f"partners, every pair without it {min(others):.3g}-{max(others):.3g} GB/s. Check it first: "
                          f"fleet_sweep over these nodes (partition=, or hosts= over ssh) compares {name}'s CPU quota, "
                          "memory and NIC with its peers' (a slow node, or this host's noise)."))
    return out


BEHIND = "Behind with every partner, within the margin (not named): "
BEHIND_FIRST = "No node or link named; one is behind with every partner, within the margin: "


PAIRS_MAX = 8   # nodes: 28 pairs in a line; past this the matrices (results_history result_id=N) say it better


def _pairs(report: IsolationReport) -> str:
    """Every pair's last figures, slowest first, those that failed or hung by name: model round 8 opened
    results_history for the matrices in three drills of four (4 nodes: 6 pairs) to see the pairs the answer summed
    up per node."""
    bw, lat = report.busbw_matrix, report.latency_matrix or []
    if report.pattern != "pairwise" or not bw or len(report.nodes) > PAIRS_MAX:
        return ""
    last = {frozenset(g.nodes): g.status for g in report.groups if len(g.nodes) == 2}
    measured, broken = [], []
    for i, a in enumerate(report.nodes):
        for j in range(i + 1, len(report.nodes)):
            b = report.nodes[j]
            if bw[i][j]:
                us = lat[i][j] if lat and lat[i][j] else None
                measured.append((bw[i][j], f"{a}-{b} {bw[i][j]:.3g}" + (f" ({us / 1000:.3g} ms)" if us else "")))
            elif frozenset((a, b)) in last:
                broken.append(f"{a}-{b} {_BROKEN_WORDS.get(last[frozenset((a, b))], 'failed')}")
    if len(measured) + len(broken) < 2:
        return ""
    return ("Pairs, busbw GB/s (latency at the smallest size), slowest first: "
            + ", ".join(broken + [text for _, text in sorted(measured)]) + ".")


_BROKEN_WORDS = {"hang": "hung", "unfinished": "unfinished (sizes measured, then cut)"}   # by its record's status


def next_steps(suspects: list) -> list[str]:
    """What to run after a named suspect, by its kind: a link's two NICs and the knowledge of what lies between them;
    a node's own checks; the launcher and stack for a node or a whole set."""
    kinds = {s.kind for s in suspects}
    nxt = []
    if kinds & {"link", "pair"}:
        nxt += ["nic_health", "knowledge://network/link-health.md"]
    if "node" in kinds:
        nxt += ["fleet_sweep"] + ([] if "nic_health" in nxt else ["nic_health"])
    if kinds & {"node", "set"}:
        nxt += ["env_report", "dist_smoke_test"]
    return nxt + ["knowledge://network/finding-the-bad-node.md"]


def heatmap(report: IsolationReport, params) -> str | None:
    from ..shared.safe_write import output_path, unique_name

    if not report.busbw_matrix:
        return None
    target = output_path(params.plot_path, "plots", unique_name("collective_bench-pairs"))
    try:
        return draw_heatmap(report, target, f"pair busbw, {len(report.nodes)} nodes, {report.rounds} rounds",
                            overwrite=params.overwrite)
    except ImportError:
        return None


def pattern_result(params, job: dict, nproc: int, progress, result_cls):
    """The tool's answer for pattern pairwise/bisect (result_cls: CollectiveBenchResult)."""
    report, notes = run_pattern(params, job, nproc, progress)
    if report is None:
        return result_cls(verdict="info", nnodes=len(params.hosts or []), findings=notes)
    verdict, findings, nxt = pattern_findings(report)
    if job.get("backend") == "gloo" and params.transport != "rdma":
        # A pass over gloo is the nodes' TCP path through their CPUs: a GPU job's NCCL over RDMA is another path
        # (model round 7, cl-healthy-allreduce: "it does not say a TCP pass says nothing of the RDMA path").
        findings.append("Measured over gloo (TCP through the CPUs): this is not the path a GPU job's NCCL takes over "
                        "InfiniBand / RoCE; on GPU nodes measure that with the job's Python (NCCL) or transport=rdma.")
    if params.plot:
        report.heatmap_png = heatmap(report, params)
    return result_cls(verdict=verdict, findings=findings, next=nxt, nnodes=len(report.nodes),
                      world_size=len(report.nodes) * nproc, backend=job.get("backend"), isolation=report,
                      heatmap_png=report.heatmap_png, sweep_wall_s=report.wall_s)
