"""The sweep's one srun step: launch one node process per node, stream their rows, stop at the deadline.

The step runs with --kill-on-bad-exit=0 (a node whose check crashes keeps the others going). When a
node's slurmd does not take the task ("Task launch ... failed on node X"), srun aborts the whole step
(SLURM 22.05 does, measured on the namespace cluster); the nodes that had not finished are then
launched once more without the failed ones, inside the same deadline. At the deadline the step is
cancelled and every process of it on every node is killed (srun passes the signal to each node's
slurmstepd); nodes that had not answered are named, never waited for.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field

from ..engine.processes import Supervised, python_module_command
from ..shared import slurm
from .node import Reassembler, parse_event

LAUNCH_FAILED = re.compile(r"[Tt]ask launch for \S+ failed on node (\S+?):\s*(.*)")
STEP_NAME = "mleng-fleet-sweep"


@dataclass
class Collected:
    rows: dict[tuple[str, str], dict] = field(default_factory=dict)   # (node, check) -> row
    planned: dict[str, list[str]] = field(default_factory=dict)       # node -> checks it said it runs
    done: set[str] = field(default_factory=set)
    failed_launch: dict[str, str] = field(default_factory=dict)       # node -> srun's reason
    attempts: int = 0
    timed_out: bool = False
    stderr_tail: str = ""
    leftovers: list[str] = field(default_factory=list)                 # steps scancel had to stop


def step_command(nodes: list[str], srun_args: list[str], job: dict, name: str, local: bool = False) -> list[str]:
    """srun over the nodes, or (local) the node process itself on this machine."""
    if local:
        return python_module_command("fleet_sweep.node", json.dumps(job))
    n = len(nodes)
    return ["srun", *srun_args, f"--nodelist={','.join(nodes)}", f"--nodes={n}", f"--ntasks={n}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=0", f"--job-name={name}",
            *python_module_command("fleet_sweep.node", json.dumps(job))]


def cancel_leftovers(name: str) -> list[str]:
    """scancel any step (or job of our own) still carrying this sweep's unique name: the net under
    srun's own cleanup, for a srun that had to be SIGKILLed. Returns what it cancelled."""
    try:
        out = slurm.run_cmd(["squeue", "-h", "-s", "-o", "%i %j"], timeout_s=20)
    except slurm.SlurmError:
        return []
    steps = [line.split()[0] for line in out.splitlines() if line.split()[1:2] == [name]]
    for step in steps:
        slurm.run_cmd(["scancel", step], timeout_s=20, check=False)
    slurm.run_cmd(["scancel", f"--name={name}"], timeout_s=20, check=False)
    return steps


def follow(child: Supervised, got: Collected, deadline: float, on_row) -> bool:
    """Apply events until the step's output ends (True) or the deadline passes (False)."""
    whole = Reassembler()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        event = child.next_event(min(left, 1.0))
        if event is Supervised.EOF:
            return True
        if event:
            event = whole.feed(event)
        if not event:
            continue
        node = str(event.get("node"))
        if event["kind"] == "hello":
            got.planned[node] = list(event.get("checks") or [])
        elif event["kind"] == "row":
            got.rows[(node, event["check"])] = event
            on_row(event)
        elif event["kind"] == "done":
            got.done.add(node)


def launch_failures(stderr: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() or "task launch failed" for m in LAUNCH_FAILED.finditer(stderr)}


def run_step(nodes: list[str], target, job: dict, got: Collected, deadline: float, on_row) -> None:
    """One srun step over `nodes`; updates `got`. The step is always stopped before this returns."""
    got.attempts += 1
    name = f"{STEP_NAME}-{uuid.uuid4().hex[:8]}"
    cmd = step_command(nodes, target.srun_args, job, name, target.local)
    with Supervised(cmd, parse_line=parse_event) as child:
        finished = follow(child, got, deadline, on_row)
        if not finished:
            got.timed_out = True
        # srun forwards SIGTERM to the step's tasks on every node; KillWait later slurmd SIGKILLs them.
        child.stop(grace_s=15, exit_wait_s=2 if finished else 0)
        got.stderr_tail = child.stderr_text()[-4000:]
    if not target.local:
        got.leftovers += cancel_leftovers(name)
    got.failed_launch.update(launch_failures(got.stderr_tail))


def sweep(target, job: dict, deadline_s: float, on_row) -> Collected:
    """Run the step; relaunch once on the unfinished nodes when some nodes refused the launch."""
    got = Collected()
    deadline = time.monotonic() + deadline_s
    nodes = target.launch_nodes
    run_step(nodes, target, job, got, deadline, on_row)
    rest = [n for n in nodes if n not in got.done and n not in got.failed_launch]
    if got.failed_launch and rest and time.monotonic() < deadline - 1:
        run_step(rest, target, job, got, deadline, on_row)
    return got
