"""The sweep's one step: launch one node process per node through the node transport, take their rows,
stop at the deadline.

Under SLURM (engine/srun.py) the step is one srun step with --kill-on-bad-exit=0 (a node whose check
crashes keeps the others going). When a node's slurmd does not take the task ("Task launch ... failed
on node X": that node ends unreachable), srun aborts the whole step (SLURM 22.05 does, measured on the
namespace cluster); every node but the failed ones is then launched once more, inside the same
deadline, and the answer uses only that attempt's rows (figures measured under different load are
never compared). At the deadline the step is stopped on every node; nodes that had not answered are
named, never waited for.

Over SSH (target kind "ssh", engine/transport.py) the step is one ssh per node, all at once: a node
whose sshd does not answer ends alone (no relaunch of the others is needed), and a node still running
at the deadline is cut there.

Identity comes from the transport: it credits every line to the node it started that part on (srun's
--label and -v placement, or the ssh connection). An event is read by that node's own side-channel
reader and credited to that node; one that names another node, a check that node did not plan, or a
second copy of a row is refused and counted. hosts=["localhost"] runs the node process here, no
transport.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
import uuid
from dataclasses import dataclass, field

from ..engine.processes import Supervised, python_module_command
from ..engine.srun import SrunTransport
from ..engine.transport import NodeEnd, SshTransport, Transport
from ..shared import sidechannel
from .node import check_event

STEP_NAME = "mleng-fleet-sweep"


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


def node_command(job: dict) -> list[str]:
    """The node process each node runs: the job (checks, budgets) as its one argument."""
    return python_module_command("fleet_sweep.node", json.dumps(job))


class Follower:
    """Keeps only what a node may say: its own hello, rows for the checks it planned, once each."""

    def __init__(self, got: Collected, nodes: list[str], asked: list[str], on_row):
        self.got, self.nodes, self.asked, self.on_row = got, set(nodes), set(asked), on_row

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
            # The store files the row under the node the transport ran it on, not the host the row claims.
            event["provenance"] = {**event["provenance"], "host": node}
            got.rows[(node, check)] = event
            self.on_row(event)
        elif kind == "done":
            got.done.add(node)


class NodeLines:
    """on_line for the transport: one side-channel reader per node, so a node's multi-part events never
    mix with another's, and each event goes to the Follower under the node the line was credited to."""

    def __init__(self, follower: Follower, nodes: list[str]):
        self.follower = follower
        self.readers = {node: sidechannel.Reader(check_event) for node in nodes}

    def __call__(self, node: str, line: str) -> None:
        event = self.readers[node].parse(line)
        if event is not None:
            self.follower.accept(node, event.data)

    def count_refused(self, got: Collected) -> None:
        for node, reader in self.readers.items():
            for (_, why), count in reader.skipped.items():
                got.refused[(node, why)] += count


def take_ends(got: Collected, ends: dict[str, NodeEnd]) -> None:
    """What each node's end means for the answer: a part the transport could not start, the deadline, or a
    node process that ended badly before saying it was done."""
    for node, end in ends.items():
        if end.how == "unreachable":
            got.failed_launch[node] = end.why.removeprefix(f"{node}: ")   # the answer names the node already
        elif end.how == "silent":
            got.timed_out = True
        elif end.said:                     # srun's words: "Killed", "Out Of Memory", "Exited with exit code 1"
            if end.said != "Completed":
                got.ended[node] = end.said
        elif end.code and node not in got.done:
            got.ended[node] = exit_how(end.code)


def run_transport_step(transport: Transport, nodes: list[str], job: dict, got: Collected, deadline: float,
                       on_row) -> None:
    """One step over `nodes` through the transport; updates `got`."""
    got.attempts += 1
    lines = NodeLines(Follower(got, nodes, job["checks"], on_row), nodes)
    ends = transport.run_step(nodes, node_command(job), max(1.0, deadline - time.monotonic()), lines)
    lines.count_refused(got)
    got.refused.update(transport.refused)
    take_ends(got, ends)
    if isinstance(transport, SrunTransport):
        got.stderr_tail = transport.stderr_tail
        got.leftovers += transport.leftovers
    else:
        got.launcher = "ssh"
        got.stderr_tail = "".join(f"{n}: {e.stderr_tail}" for n, e in ends.items() if e.stderr_tail)[-4000:]


def run_local_step(node: str, job: dict, got: Collected, deadline: float, on_row) -> None:
    """The node process here, unlabelled output on one pipe; updates `got` as a transport step does."""
    got.attempts += 1
    reader = sidechannel.Reader(check_event)
    follower = Follower(got, [node], job["checks"], on_row)
    env = {k: v for k, v in os.environ.items() if k != "SLURMD_NODENAME"}
    with Supervised(node_command(job), parse_line=reader.parse, env=env) as child:
        finished = child.follow(lambda event: follower.accept(node, event.data), deadline)
        got.timed_out = got.timed_out or not finished
        code = child.stop(grace_s=15, exit_wait_s=2 if finished else 0)
        got.stderr_tail = child.stderr_text()[-4000:]
    for (_, why), count in reader.skipped.items():
        got.refused[(node, why)] += count
    for why, count in child.skipped.items():
        got.refused[("the step's output", why)] += count
    if finished and code and node not in got.done:
        got.ended[node] = exit_how(code)


def run_step(nodes: list[str], target, job: dict, got: Collected, deadline: float, on_row) -> None:
    """One step over `nodes`: here, or one srun step under a name of its own (for scancel's net)."""
    if target.local:
        return run_local_step(nodes[0], job, got, deadline, on_row)
    srun = SrunTransport(target.srun_args, job_name=f"{STEP_NAME}-{uuid.uuid4().hex[:8]}", kill_on_bad_exit=False)
    run_transport_step(srun, nodes, job, got, deadline, on_row)


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
        run_transport_step(SshTransport(), nodes, job, got, deadline, on_row)
        return got
    run_step(nodes, target, job, got, deadline, on_row)
    rest = [n for n in nodes if n not in got.failed_launch]
    if got.failed_launch and rest and time.monotonic() < deadline - 1:
        got.new_attempt()
        got.relaunch = Relaunch(dict(got.failed_launch), time.monotonic() - start, deadline_s)
        run_step(rest, target, job, got, deadline, on_row)
    return got
