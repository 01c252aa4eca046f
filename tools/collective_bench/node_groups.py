"""Run one round of disjoint node groups at once, each its own collective job under a deadline.

Inside a SLURM allocation every group is one srun step on exactly its nodes (`--nodelist`), one
torchrun per node meeting at a c10d rendezvous on the group's first node. The groups of a round run
in parallel threads, each through launch_ranks, so a group that hangs is stopped at its deadline
without holding the others, and nothing of it is left running.

Over SSH (hosts=, no SLURM) each group is one torchrun per host started through the engine's node
transport (shared/launch_ssh.py), the same way. Started by hand on every node, the rounds run through
per-node agents instead (node_agents.py).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field

from ..engine.data import PACKAGE
from ..engine.printable import printable
from ..engine.processes import without_secrets
from ..engine.spec import ToolFailure
from ..engine.transport import SshTransport
from ..shared import slurm as _slurm
from ..shared.culprits import diagnose
from ..shared.launch import LaunchOutcome, launch_ranks
from ..shared.launch_ssh import host_command, launch_ranks_ssh


@dataclass
class GroupRun:
    nodes: list[int]              # indices into the node list
    status: str                   # ok | fail | hang
    busbw_gbps: float | None = None   # all_reduce busbw at the largest size
    latency_us: float | None = None   # time of one all_reduce at the smallest size
    wall_s: float = 0.0
    detail: str = ""              # why it is not ok, in a sentence
    rows: list[dict] = field(default_factory=list)
    setup: dict = field(default_factory=dict)  # rank 0's setup event: backend, GPU name, NCCL env, NICs
    # No rank of the group started anywhere, the launcher named no node, and it said it failed itself (or could not
    # be started): what failed is the launcher on this machine (srun's configuration, its controller), not these nodes.
    nothing_started: bool = False
    launcher_said: str = ""       # the launcher's own last words, for such a group
    cut: bool = False             # stopped early by the run's pace (pair_pace, group_pace), not by its deadline

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def figures_of(rows: list[dict]) -> tuple[float | None, float | None]:
    """(busbw at the largest size, time at the smallest size) of all_reduce rows."""
    mine = [r for r in rows if r.get("op") == "all_reduce"]
    if not mine:
        return None, None
    return (max(mine, key=lambda r: r["bytes"])["busbw_gbps"], min(mine, key=lambda r: r["bytes"])["time_us"])


def group_run(nodes: list[int], outcome: LaunchOutcome | None, pg_timeout_s: float, names: list[str],
              wall_s: float) -> GroupRun:
    """What one group's launch says: ok with its figures, or fail/hang with the first reason."""
    if outcome is None:
        return GroupRun(nodes, "fail", wall_s=wall_s, detail="the launcher could not start", nothing_started=True,
                        launcher_said="the launcher could not start")
    rows = [e for e in outcome.data if e.get("kind") == "row"]
    setup = next((e for e in outcome.data if e.get("kind") == "setup"), {})
    busbw, latency = figures_of(rows)
    where = "+".join(names[i] for i in nodes)
    if outcome.cut:
        return GroupRun(nodes, "hang", busbw, latency, wall_s, f"{where} {outcome.cut}", rows, cut=True)
    if outcome.stalled or outcome.overran:
        return GroupRun(nodes, "hang", busbw, latency, wall_s, f"{where} did not finish within "
                        f"{outcome.elapsed_s:.0f} s ({len(rows)} sizes measured)", rows)
    _, findings = diagnose(outcome, pg_timeout_s)
    if findings or outcome.returncode or not rows:
        said = findings[0] if findings else f"exit code {outcome.returncode}, no figures"
        nothing = (not outcome.data and not outcome.launch_failures and bool(_LAUNCHER_ITSELF.search(outcome.stderr_tail))
                   and all(s.status == "not_started" for s in outcome.ranks.values()))
        return GroupRun(nodes, "fail", busbw, latency, wall_s, f"{where}: {said}", rows, nothing_started=nothing,
                        launcher_said=_last_words(outcome.stderr_tail) if nothing else "")
    return GroupRun(nodes, "ok", busbw, latency, wall_s, "", rows, setup)


# srun's words (SLURM 22.05) about itself, not about a node: its configuration unreadable, its controller out of
# reach. A node's failure reads otherwise ("Node failure on mln5", "Requested node configuration is not available"
# for a step on a node just lost, "Task launch ... failed on node"): a round of one group that a dead node fails
# (bisect's first, every node at once) must stay the nodes' to judge.
_LAUNCHER_ITSELF = re.compile(r"Unable to process configuration file|cannot stat file \S*slurm\.conf|"
                              r"Unable to contact slurm controller|Unable to establish control machine address")


def _last_words(stderr_tail: str) -> str:
    match = _LAUNCHER_ITSELF.search(stderr_tail)
    lines = [line.strip() for line in stderr_tail.splitlines() if line.strip()]
    said = next((line for line in lines if match and match.group(0) in line), lines[-1] if lines else "no words")
    return printable(said[:300], newlines=False)


class LauncherFailed(ToolFailure):
    """Every group of a round failed before any rank started, and the launcher said it failed itself and named no
    node: the launcher failed on this machine, not the nodes (a SLURM drill run whose slurm.conf had vanished
    named 12 healthy links after srun twice said only "cannot stat" it). Nothing about the nodes was measured."""


def check_launcher(results: list[GroupRun], names: list[str]) -> None:
    """Raise LauncherFailed when no group of the round started a rank and the launcher said it failed itself."""
    if results and all(r.nothing_started for r in results):
        said = sorted({r.launcher_said for r in results})
        raise LauncherFailed(
            f"the launcher failed before any rank started, in all {len(results)} group(s) of a round, and named no "
            f"node: {'; '.join(said)[:600]}. Nothing about {', '.join(names)} was measured, so no node or link is "
            "named: fix the launcher (srun's configuration, SLURM_CONF, the allocation; or ssh) and run again.")


def remove_scratch(names: list[str], tag: str) -> None:
    """After the last round: remove the scratch folders that killed tasks left on the nodes (best effort: a
    node that is down keeps its own; the answer does not depend on it)."""
    _slurm.remove_tagged_scratch(names, tag, timeout_s=60)


def node_addresses(names: list[str]) -> dict[str, str]:
    """NodeAddr of every node SLURM knows (one scontrol call); a node's name where it says none."""
    try:
        text = _slurm.run_cmd(["scontrol", "show", "node", "-o"], timeout_s=15)
    except _slurm.SlurmError:
        return {n: n for n in names}
    found = {}
    for line in text.splitlines():
        kv = _slurm.parse_kv_line(line)
        if kv.get("NodeName"):
            found[kv["NodeName"]] = kv.get("NodeAddr") or kv["NodeName"]
    return {n: found.get(n, n) for n in names}


def srun_group_command(job: dict, names: list[str], addresses: dict[str, str], nproc: int, port: int,
                       job_id: str | None = None) -> list[str]:
    """One srun step on exactly these nodes, torchrun on each, rendezvous on the first listed node, whose
    task hosts the store by name (not SLURM's task 0, which srun puts on the first node in its own order).
    --overlap: a step of the last round still being cleaned up (its node unreachable) must not block this one."""
    return _slurm.srun_torchrun_command([f"{PACKAGE}.collective_bench.rank", json.dumps(job)], nnodes=len(names),
                                        nproc_per_node=nproc, rdzv_port=port, rdzv_host=addresses[names[0]],
                                        rdzv_node=names[0], job_id=job_id,
                                        extra_srun=["--overlap", f"--nodelist={','.join(names)}"])


def run_round(groups: list[list[int]], names: list[str], launch, *, pg_timeout_s: float, pace=None) -> list[GroupRun]:
    """Every group of the round at once, one thread each; results in the order of `groups`.
    launch(k, nodes, on_event, cut) -> LaunchOutcome starts group k on those nodes (srun or ssh).
    `pace` (pairwise, pair_pace.Pace): stops a pair far slower than the healthy ones before the deadline."""
    results: list[GroupRun | None] = [None] * len(groups)

    def one(k: int, group: list[int]) -> None:
        t0 = time.monotonic()
        outcome = None
        rows: list[dict] = []   # this group's sizes as they come in: what `pace` judges it by
        try:
            outcome = launch(k, [names[i] for i in group], lambda e: rows.append(e) if e.get("kind") == "row" else None,
                             (lambda elapsed_s: pace.why_stop(elapsed_s, rows)) if pace else None)
        finally:
            results[k] = group_run(group, outcome, pg_timeout_s, names, round(time.monotonic() - t0, 2))
            if pace:
                pace.record(results[k])

    threads = [threading.Thread(target=one, args=(k, g), daemon=True) for k, g in enumerate(groups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [r for r in results if r is not None]
    check_launcher(done, names)
    return done


def run_round_srun(groups: list[list[int]], names: list[str], job: dict, *, nproc: int, deadline_s: float,
                   pg_timeout_s: float, port: int, job_id: str | None = None,
                   scratch_tag: str = "run", pace=None) -> list[GroupRun]:
    """A round inside a SLURM allocation: one srun step per group."""
    addresses = node_addresses(names)

    def launch(k: int, nodes: list[str], on_event, cut) -> LaunchOutcome:
        return launch_ranks(srun_group_command(job, nodes, addresses, nproc, port, job_id), len(nodes) * nproc,
                            timeout_s=pg_timeout_s, stall_s=deadline_s, deadline_s=deadline_s,
                            env={_slurm.SCRATCH_TAG_ENV: scratch_tag}, on_event=on_event, cut=cut)

    return run_round(groups, names, launch, pg_timeout_s=pg_timeout_s, pace=pace)


def ssh_group_command(job: dict, nodes: list[str], nproc: int, port: int) -> list[str]:
    """The argv every host of one group runs over ssh: torchrun meeting on nodes[0], at the address this
    machine's ssh reaches it by (its HostName: the caller's config, not what the host says)."""
    address = SshTransport(without_secrets(dict(os.environ))).address(nodes[0])
    return host_command("collective_bench.rank", job, nproc, nodes, address, port, f"mleng-{os.urandom(6).hex()}")


def run_round_ssh(groups: list[list[int]], names: list[str], job: dict, *, nproc: int, deadline_s: float,
                  pg_timeout_s: float, port: int, pace=None) -> list[GroupRun]:
    """A round over SSH, no SLURM: each group is one torchrun per host through the node transport, group k
    on port + k (one machine may answer for several host names)."""
    def launch(k: int, nodes: list[str], on_event, cut) -> LaunchOutcome:
        return launch_ranks_ssh(nodes, ssh_group_command(job, nodes, nproc, port + k), len(nodes) * nproc,
                                deadline_s=deadline_s, stall_s=deadline_s, on_event=on_event, cut=cut)

    return run_round(groups, names, launch, pg_timeout_s=pg_timeout_s, pace=pace)
