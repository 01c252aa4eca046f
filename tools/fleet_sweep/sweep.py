"""The sweep's one srun step: launch one node process per node, stream their rows, stop at the deadline.

The step runs with --kill-on-bad-exit=0 (a node whose check crashes keeps the others going). When a
node's slurmd does not take the task ("Task launch ... failed on node X"), srun aborts the whole step
(SLURM 22.05 does, measured on the namespace cluster); every node but the failed ones is then
launched once more, inside the same deadline, and the answer uses only that attempt's rows (figures
measured under different load are never compared). At the deadline the step is cancelled and every
process of it on every node is killed (srun passes the signal to each node's slurmstepd); nodes that
had not answered are named, never waited for.

Over SSH (target kind "ssh", engine/transport.py) the step is one ssh per node, all at once: a node
whose sshd does not answer ends alone (no relaunch of the others is needed), and a node still running
at the deadline is cut there. Each line is credited to the connection it came on.

Identity comes from the launcher: srun runs with --label (every line carries its task number) and -v
(srun says which host each task was launched on). An event is credited to that host; one that names
another node, a check that node did not plan, or a second copy of a row is refused and counted.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass, field

from ..engine.processes import Supervised, python_module_command
from ..engine.transport import SshTransport
from ..shared import sidechannel, slurm
from .node import check_event

LAUNCH_FAILED = re.compile(r"[Tt]ask launch for \S+ failed on node (\S+?):\s*(.*)")
STEP_NAME = "mleng-fleet-sweep"
MAX_HELD = 10_000    # events from tasks srun has not placed yet (its -v line races the task's output)


@dataclass(frozen=True)
class LaunchFailed:
    node: str
    why: str


def srun_said(line: str) -> LaunchFailed | slurm.SrunTasks | None:
    """What srun's own stderr line says about a node: read as it comes, since with -v on a large step
    the launch failure would scroll out of any kept tail."""
    if m := LAUNCH_FAILED.search(line):
        return LaunchFailed(m.group(1), m.group(2).strip() or "task launch failed")
    return slurm.srun_tasks_line(line)


@dataclass(frozen=True)
class Relaunch:
    """Why the answer's attempt had less than the whole deadline: other nodes refused the first launch."""
    after: dict[str, str]     # node -> why srun could not start its task
    at_s: float               # seconds into the sweep when the relaunch started
    deadline_s: float         # the sweep's whole deadline

    def sentence(self) -> str:
        nodes = ", ".join(sorted(self.after)[:5]) + (f" and {len(self.after) - 5} more" if len(self.after) > 5 else "")
        why = next(iter(self.after.values()))
        return (f"srun aborted attempt 1 when {nodes} refused its task ({why}) {self.at_s:.0f} s into the "
                f"{self.deadline_s:g} s deadline, which left the relaunch {max(0.0, self.deadline_s - self.at_s):.0f} s")


@dataclass
class Collected:
    rows: dict[tuple[str, str], dict] = field(default_factory=dict)   # (node, check) -> row, this attempt
    planned: dict[str, list[str]] = field(default_factory=dict)       # node -> checks it said it runs
    done: set[str] = field(default_factory=set)
    failed_launch: dict[str, str] = field(default_factory=dict)       # node -> srun's reason
    ended: dict[str, str] = field(default_factory=dict)               # node -> how its process ended early
    refused: collections.Counter = field(default_factory=collections.Counter)   # (who, why) -> events
    attempts: int = 0
    set_aside: int = 0               # rows of an aborted earlier attempt, not used in the answer
    timed_out: bool = False
    relaunch: Relaunch | None = None  # set when the last attempt started after others' launch failed
    stderr_tail: str = ""
    leftovers: list[str] = field(default_factory=list)                 # steps scancel had to stop
    launcher: str = "srun"           # who failed to start a node's task, in the answer's words

    def refuse(self, who: str, why: str) -> None:
        self.refused[(who, why)] += 1

    def new_attempt(self) -> None:
        """Forget the rows of an aborted attempt: the answer's figures come from one attempt."""
        self.set_aside += len(self.rows)
        self.rows, self.planned, self.done, self.ended = {}, {}, set(), {}


def step_command(nodes: list[str], srun_args: list[str], job: dict, name: str, local: bool = False) -> list[str]:
    """srun over the nodes, or (local) the node process itself on this machine."""
    if local:
        return python_module_command("fleet_sweep.node", json.dumps(job))
    n = len(nodes)
    return ["srun", "-v", "--label", *srun_args, f"--nodelist={','.join(nodes)}", f"--nodes={n}", f"--ntasks={n}",
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


class Follower:
    """Credits each event to the node srun ran its task on, and keeps only what that node may say."""

    def __init__(self, got: Collected, nodes: list[str], asked: list[str], on_row, local_node: str | None):
        self.got, self.nodes, self.asked, self.on_row = got, set(nodes), set(asked), on_row
        self.tasks: dict[int | None, str] = {None: local_node} if local_node else {}
        self.held: list[sidechannel.Event] = []

    def take(self, item) -> None:
        if isinstance(item, LaunchFailed):
            self.got.failed_launch[item.node] = item.why
        elif isinstance(item, slurm.SrunTasks):
            if item.kind == "launched":
                self.tasks.update({task: item.node for task in item.tasks})
                held, self.held = self.held, []
                for event in held:
                    self.take(event)
            elif item.how != "Completed":
                self.got.ended[item.node] = item.how
        elif isinstance(item, sidechannel.Event):
            node = self.tasks.get(item.task)
            if node is None:
                if len(self.held) < MAX_HELD:
                    self.held.append(item)
                else:
                    self.got.refuse(f"task {item.task}", "srun never said where this task runs")
                return
            self.accept(node, item.data)

    def accept(self, node: str, event: dict) -> None:
        got, kind = self.got, event["kind"]
        if node not in self.nodes:
            return got.refuse(node, "the node is not in this sweep")
        if event["node"] != node:
            return got.refuse(node, f"the event names another node ({event['node'][:40]!r})")
        if kind == "hello":
            extra = sorted(set(event["checks"]) - self.asked)
            if node in got.planned or extra:
                return got.refuse(node, "a second hello" if node in got.planned else f"checks not asked for: {extra}")
            got.planned[node] = list(event["checks"])
        elif kind == "row":
            check = event["check"]
            if check not in got.planned.get(node, ()):
                return got.refuse(node, f"a row for a check it did not plan ({check[:40]!r})")
            if (node, check) in got.rows:
                return got.refuse(node, f"a second row for {check}")
            # The store files the row under the node srun ran it on, not the host the row claims.
            event["provenance"] = {**event["provenance"], "host": node}
            got.rows[(node, check)] = event
            self.on_row(event)
        elif kind == "done":
            got.done.add(node)

    def unplaced(self) -> None:
        for event in self.held:
            self.got.refuse(f"task {event.task}", "srun never said where this task runs")
        self.held = []


def follow(child: Supervised, follower: Follower, deadline: float) -> bool:
    """Apply events until the step's output ends (True) or the deadline passes (False)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        item = child.next_event(min(left, 1.0))
        if item is Supervised.EOF:
            return True
        if item is not None:
            follower.take(item)


def launch_failures(stderr: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() or "task launch failed" for m in LAUNCH_FAILED.finditer(stderr)}


def run_step(nodes: list[str], target, job: dict, got: Collected, deadline: float, on_row) -> None:
    """One srun step over `nodes`; updates `got`. The step is always stopped before this returns."""
    got.attempts += 1
    name = f"{STEP_NAME}-{uuid.uuid4().hex[:8]}"
    cmd = step_command(nodes, target.srun_args, job, name, target.local)
    reader = sidechannel.Reader(check_event, labelled=not target.local)
    local_node = nodes[0] if target.local else None
    follower = Follower(got, nodes, job["checks"], on_row, local_node)
    env = {k: v for k, v in os.environ.items() if not (target.local and k == "SLURMD_NODENAME")}
    with Supervised(cmd, parse_line=reader.parse, parse_stderr=None if target.local else srun_said,
                    env=env) as child:
        finished = follow(child, follower, deadline)
        if not finished:
            got.timed_out = True
        # srun forwards SIGTERM to the step's tasks on every node; KillWait later slurmd SIGKILLs them.
        code = child.stop(grace_s=15, exit_wait_s=2 if finished else 0)
        got.stderr_tail = child.stderr_text()[-4000:]
        while (late := child.next_event(0)) not in (None, Supervised.EOF):   # srun's words after the cut
            if isinstance(late, LaunchFailed):
                follower.take(late)
    follower.unplaced()
    name_of = follower.tasks.get
    for (task, why), count in reader.skipped.items():
        got.refused[(name_of(task) or f"task {task}", why)] += count
    for why, count in child.skipped.items():
        got.refused[("the step's output", why)] += count
    if target.local and finished and code and local_node not in got.done:
        got.ended[local_node] = exit_how(code)
    if not target.local:
        got.leftovers += cancel_leftovers(name)
    got.failed_launch.update(launch_failures(got.stderr_tail))


def run_ssh_step(nodes: list[str], job: dict, got: Collected, deadline: float, on_row) -> None:
    """One SSH step over `nodes` (one reader per connection: a node's multi-part events never mix with
    another's); updates `got` as run_step does for srun."""
    got.attempts += 1
    got.launcher = "ssh"
    readers = {node: sidechannel.Reader(check_event) for node in nodes}
    follower = Follower(got, nodes, job["checks"], on_row, None)

    def on_line(node: str, line: str) -> None:
        event = readers[node].parse(line)
        if event is not None:
            follower.accept(node, event.data)

    ends = SshTransport().run_step(nodes, python_module_command("fleet_sweep.node", json.dumps(job)),
                                   max(1.0, deadline - time.monotonic()), on_line)
    for node, reader in readers.items():
        for (_, why), count in reader.skipped.items():
            got.refused[(node, why)] += count
    for node, end in ends.items():
        if end.how == "unreachable":
            got.failed_launch[node] = end.why.removeprefix(f"{node}: ")   # the answer names the node already
        elif end.how == "silent":
            got.timed_out = True
        elif end.code and node not in got.done:
            got.ended[node] = exit_how(end.code)
    got.stderr_tail = "".join(f"{n}: {e.stderr_tail}" for n, e in ends.items() if e.stderr_tail)[-4000:]


def exit_how(code: int) -> str:
    """An exit status in srun's words ("Killed", "Exited with exit code 1")."""
    if code < 0:
        return signal.strsignal(-code) or f"signal {-code}"
    return f"Exited with exit code {code}"


def ended_reason(how: str) -> str:
    """Why a node process that ended before the deadline left checks unanswered, with the likely cause."""
    if how == "Out Of Memory":
        return "its node process was killed for lack of memory (SLURM saw an out-of-memory kill in the step)"
    if how == "Killed":
        return ("its node process was killed by SIGKILL (signal 9) before the deadline: most likely the kernel's "
                "out-of-memory killer (see `dmesg` and the node's memory limit)")
    return f"its node process ended before the deadline: {how}"


def sweep(target, job: dict, deadline_s: float, on_row) -> Collected:
    """Run the step; when srun aborted it because some nodes refused the launch, run it again on every
    other node (one attempt's rows in the answer, never a mix)."""
    got = Collected()
    start = time.monotonic()
    deadline = start + deadline_s
    nodes = target.launch_nodes
    if target.kind == "ssh":
        run_ssh_step(nodes, job, got, deadline, on_row)
        return got
    run_step(nodes, target, job, got, deadline, on_row)
    rest = [n for n in nodes if n not in got.failed_launch]
    if got.failed_launch and rest and time.monotonic() < deadline - 1:
        got.new_attempt()
        got.relaunch = Relaunch(dict(got.failed_launch), time.monotonic() - start, deadline_s)
        run_step(rest, target, job, got, deadline, on_row)
    return got
