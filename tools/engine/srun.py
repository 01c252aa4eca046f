"""The node transport's srun side: a step is one SLURM job step with one task per node.

    srun = SrunTransport(inside_allocation().srun_args, job_name="mleng-fleet-sweep-1a2b3c4d")
    ends = srun.run_step(["mln1", "mln2"], argv, deadline_s=60, on_line=lambda node, line: ...)
    ends["mln2"].how                              # "exited" | "unreachable" | "silent"
    srun.command("mln2", argv)                    # the one-node srun argv (the `node=` option)
    srun.argv(["bash", "-c", s], count=4, label=True)   # a step placed by SLURM (torchrun per node)

Every srun argv mleng builds comes from `SrunTransport.argv`, so the flags mean one thing everywhere:
--kill-on-bad-exit=1 where one failed node must end the others (torchrun, `node=`), 0 where the others
must go on (a sweep); --overlap (from engine/placement.py) beside a job's own steps; --label and -v
where lines are credited to nodes.

Crediting: srun --label puts the task number before every line a task prints, and srun -v says on
which host it launched which tasks ("srun: launching StepId=7.0 on host mln1, 1 tasks: 0"). A line is
credited to the node srun placed its task on, never to what the line says; a line whose task srun has
not placed yet waits for that word (two pipes: the task's output can arrive before it), bounded by
MAX_HELD. srun's own stderr says how each node's part ended: "Task launch for StepId=53.0 failed on
node mln5: ..." (the node is unreachable: its slurmd frozen, dead or cut off; SLURM 22.05 then aborts
the whole step) or "mln2: task 1: Killed" / "Completed" / "Exited with exit code 3" / "Out Of Memory".

At the deadline (or on cancel) srun is sent SIGTERM, which it passes to every node's slurmstepd; after
a grace the tree is killed, and any step still carrying the job name is scancelled (the net under
srun's own cleanup, for a srun that had to be SIGKILLed).
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .transport import NodeEnd

MAX_HELD = 10_000       # lines of tasks srun has not placed yet
MAX_TASKS = 100_000     # task numbers one srun line may name
STDERR_TAIL_CHARS = 4000
NOT_LABELLED = "the step's output"

_LAUNCH_FAILED = re.compile(r"[Tt]ask launch for \S+ failed on node ([A-Za-z0-9_.\-]+):\s*([^\n]*)")
# srun 22.05 with -v, as printed on the namespace cluster (task numbers follow SLURM's node order,
# not the order of --nodelist: mln4,mln2,mln1,mln3 gave task 0 to mln1):
#   srun: launching StepId=1.0 on host mln1, 1 tasks: 0
#   srun: launch/slurm: _task_finish: mln4: task 3: Completed
#   srun: error: mln2: task 1: Killed
_SRUN_LAUNCHING = re.compile(r"srun: launching StepId=\S+ on host (\S+), \d+ tasks?: ([\d,\-]{1,200})")
_SRUN_ENDED = re.compile(r"srun: (?:error: )?(?:launch/slurm: _task_finish: )?([^\s:]+): tasks? ([\d,\-]{1,200}): (.{1,200})")
_LABEL = re.compile(r"\s*(\d{1,7}): ?(.*)", re.S)
_EXIT_CODE = re.compile(r"Exited with exit code (\d{1,3})")


@dataclass(frozen=True)
class LaunchFailed:
    """srun could not start the task on `node` (its words in `why`)."""
    node: str
    why: str


@dataclass(frozen=True)
class TaskStderr:
    """One labelled stderr line of a task (under --label srun labels a task's stderr as its stdout)."""
    task: int
    text: str


@dataclass(frozen=True)
class SrunTasks:
    """What srun itself (never a task) said about tasks on a node: where it launched them (`srun -v`),
    or how they ended ("Completed", "Killed", "Out Of Memory", "Exited with exit code 1")."""
    kind: str              # launched | ended
    node: str
    tasks: tuple[int, ...]
    how: str = ""


def launch_failures(stderr: str) -> dict[str, str]:
    """{node: srun's reason} from srun's own "Task launch for StepId=53.0 failed on node mln5: Socket timed
    out on send/recv operation": the node srun could not start a task on (frozen, slurmd dead, unreachable).
    A task's labelled stderr line is not srun's word, whatever it says."""
    srun_lines = "\n".join(line for line in stderr.splitlines() if labelled(line)[0] is None)
    return {m.group(1): m.group(2).strip() or "task launch failed" for m in _LAUNCH_FAILED.finditer(srun_lines)}


def srun_tasks_line(line: str) -> SrunTasks | None:
    """The task placement or ending in one line of srun's stderr, else None. Task output is labelled
    ("3: ...") under --label, so a task cannot print a line that starts like srun's own."""
    if m := _SRUN_LAUNCHING.fullmatch(line.rstrip()):
        return SrunTasks("launched", m.group(1), _task_ids(m.group(2)))
    if m := _SRUN_ENDED.fullmatch(line.rstrip()):
        return SrunTasks("ended", m.group(1), _task_ids(m.group(2)), m.group(3).strip())
    return None


def srun_said(line: str) -> LaunchFailed | SrunTasks | TaskStderr | None:
    """What one line of srun's stderr says about a node, read as it comes: with -v on a large step a
    launch failure would scroll out of any kept tail. A labelled line is a task's own stderr, never srun's
    word, whatever it says."""
    task, text = labelled(line)
    if task is not None:
        return TaskStderr(task, text)
    if m := _LAUNCH_FAILED.search(line):
        return LaunchFailed(m.group(1), m.group(2).strip() or "task launch failed")
    return srun_tasks_line(line)


def _task_ids(text: str) -> tuple[int, ...]:
    """'0', '0-3,7' -> task numbers (at most MAX_TASKS)."""
    ids: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi or lo).isdigit():
            ids.extend(range(int(lo), min(int(hi or lo), int(lo) + MAX_TASKS) + 1))
    return tuple(ids[:MAX_TASKS])


def exit_code_of(said: str) -> int | None:
    """srun's words for a task's end as an exit status: 'Completed' 0, 'Exited with exit code 3' 3,
    'Killed' -9 (a signal as a negative number, as subprocess gives it); None for what is no status
    ('Out Of Memory': the words say it)."""
    if said == "Completed":
        return 0
    if m := _EXIT_CODE.fullmatch(said):
        return int(m.group(1))
    for sig in signal.Signals:
        if signal.strsignal(sig) == said:
            return -int(sig)
    return None


def labelled(line: str) -> tuple[int | None, str]:
    """(task, text) of one stdout line under --label; (None, line) when it carries no label."""
    m = _LABEL.fullmatch(line)
    return (int(m.group(1)), m.group(2)) if m else (None, line)


class SrunLines:
    """Credits a step's lines to nodes: labelled stdout lines and srun's stderr words go in (`take`), each
    line comes out as on_line(node, text) once srun has said where its task runs. What cannot be
    credited is counted in `refused` ((who, why) -> lines), never handed on."""

    def __init__(self, nodes: list[str], on_line: Callable[[str, str], None]):
        self.nodes, self.on_line = set(nodes), on_line
        self.tasks: dict[int, str] = {}
        self.held: list[tuple[int, str]] = []
        self.failed: dict[str, str] = {}     # node -> srun's reason it could not start the task
        self.said: dict[str, str] = {}       # node -> srun's words for how its task ended
        self.task_stderr: dict[int, str] = {}   # task -> the tail of its own stderr (credited at the end)
        self.refused: collections.Counter = collections.Counter()

    def take(self, item) -> None:
        if isinstance(item, TaskStderr):
            if item.task < len(self.nodes):      # a step's tasks are 0..n-1: no other number grows the map
                tail = self.task_stderr.get(item.task, "") + item.text + "\n"
                self.task_stderr[item.task] = tail[-STDERR_TAIL_CHARS:]
        elif isinstance(item, LaunchFailed):
            self.failed[item.node] = item.why
        elif isinstance(item, SrunTasks) and item.kind == "launched":
            self.tasks.update({task: item.node for task in item.tasks})
            held, self.held = self.held, []
            for task, text in held:
                self.line(task, text)
        elif isinstance(item, SrunTasks):
            self.said[item.node] = item.how
        elif isinstance(item, tuple):
            self.line(*item)

    def line(self, task: int | None, text: str) -> None:
        if task is None:
            self.refused[(NOT_LABELLED, "a line without srun's task label")] += 1
            return
        node = self.tasks.get(task)
        if node is None:
            if len(self.held) < MAX_HELD:
                self.held.append((task, text))
            else:
                self.refused[(f"task {task}", "srun never said where this task runs")] += 1
        elif node not in self.nodes:
            self.refused[(node, "srun placed a task on a node outside this step")] += 1
        else:
            self.on_line(node, text)

    def unplaced(self) -> None:
        """At the end: lines of tasks srun never placed are refused."""
        for task, _ in self.held:
            self.refused[(f"task {task}", "srun never said where this task runs")] += 1
        self.held = []

    def ends(self, nodes: list[str], finished: bool) -> dict[str, NodeEnd]:
        """How each node's part ended: unreachable (srun could not launch there), exited (srun said how),
        silent (no word by the deadline), or exited with no status (the step ended without a word on it).
        Each end carries its task's own stderr tail, credited to the node srun placed the task on."""
        stderr = {self.tasks[task]: text for task, text in self.task_stderr.items() if task in self.tasks}
        ends = {}
        for node in nodes:
            if node in self.failed:
                ends[node] = NodeEnd(node, "unreachable", why=f"{node}: {self.failed[node]}")
            elif node in self.said:
                ends[node] = NodeEnd(node, "exited", exit_code_of(self.said[node]), said=self.said[node])
            else:
                ends[node] = NodeEnd(node, "exited" if finished else "silent")
            ends[node].stderr_tail = stderr.get(node, "")
        return ends


class SrunTransport:
    """A step through srun: `placement` is where it runs (engine/placement.py's srun_args: --overlap,
    --jobid=ID --overlap, or a job of our own); `kill_on_bad_exit` True ends every node when one fails,
    False keeps the others going, None leaves SLURM's default. `chdir`: the folder the tasks start in on
    their node (srun --chdir; by default srun's own, which the node may not have)."""

    def __init__(self, placement: tuple[str, ...] | list[str] = (), *, env: dict | None = None,
                 job_name: str | None = None, kill_on_bad_exit: bool | None = False, grace_s: float = 15,
                 chdir: str | None = None):
        self.placement = tuple(placement)
        self.chdir = chdir
        self.env = env
        self.job_name = job_name
        self.kill_on_bad_exit = kill_on_bad_exit
        self.grace_s = grace_s
        self.refused: collections.Counter = collections.Counter()
        self.stderr_tail = ""              # srun's own stderr of the last step (its words name nodes)
        self.leftovers: list[str] = []     # steps scancel had to stop
        self._cancelled = threading.Event()

    def argv(self, argv: list[str], *, nodes: list[str] | None = None, count: int | None = None,
             label: bool = False, verbose: bool = False, quiet: bool = False) -> list[str]:
        """srun's argv for one task per node: on `nodes` (--nodelist), or on `count` nodes SLURM picks
        inside the placement. argv runs as given (no shell unless argv is one)."""
        n = len(nodes) if nodes is not None else count
        if not n or n < 1:
            raise ValueError("a step needs at least one node")
        if nodes is not None and any(not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", node) for node in nodes):
            raise ValueError("a node name is letters, digits, _ . - (none may start like an option)")
        return ["srun", f"--nodes={n}", f"--ntasks={n}",
                *(["--ntasks-per-node=1"] if n > 1 else []),          # implied for one node
                *([f"--nodelist={','.join(nodes)}"] if nodes is not None else []),
                *([f"--kill-on-bad-exit={int(self.kill_on_bad_exit)}"] if self.kill_on_bad_exit is not None else []),
                *(["--quiet"] if quiet else []), *(["-v"] if verbose else []), *(["--label"] if label else []),
                *([f"--job-name={self.job_name}"] if self.job_name else []),
                *self.placement, *([f"--chdir={self.chdir}"] if self.chdir else []), *argv]

    def command(self, node: str, argv: list[str]) -> list[str]:
        """The srun argv that runs argv on one node, its output as the command prints it (the `node=` option)."""
        return self.argv(argv, nodes=[node], quiet=True)

    def run_step(self, nodes: list[str], argv: list[str], deadline_s: float,
                 on_line: Callable[[str, str], None]) -> dict[str, NodeEnd]:
        """Start argv on every node in one srun step; on_line(node, line) for each stdout line, credited
        by srun's label and placement; return how each node ended. The step is always stopped before
        this returns."""
        from .processes import Supervised

        lines = SrunLines(nodes, on_line)
        deadline = time.monotonic() + deadline_s
        cmd = self.argv(argv, nodes=nodes, verbose=True, label=True)
        with Supervised(cmd, parse_line=labelled, parse_stderr=srun_said, env=self.env) as child:
            finished = child.follow(lines.take, deadline, self._cancelled)
            child.stop(grace_s=self.grace_s, exit_wait_s=2 if finished else 0)
            self.stderr_tail = child.stderr_text()[-STDERR_TAIL_CHARS:]
            # What srun's stderr said after stdout closed (two pipes: its -v words may come after the tasks'
            # lines). At the deadline or a cancel, the nodes cut end silent whatever srun then says of them,
            # and what the tasks printed after the cut is not read.
            while (late := child.next_event(0)) not in (None, Supervised.EOF):
                if finished or isinstance(late, (LaunchFailed, TaskStderr)) or (
                        isinstance(late, SrunTasks) and late.kind == "launched"):
                    lines.take(late)
        lines.unplaced()
        lines.failed.update(launch_failures(self.stderr_tail))
        self.refused.update(lines.refused)
        for why, count in child.skipped.items():
            self.refused[(NOT_LABELLED, why)] += count
        if self.job_name:
            self.leftovers += cancel_named(self.job_name, self.env)
        self._cancelled.clear()   # a cancel ends the step it came during, as SshTransport's does
        return lines.ends(nodes, finished)

    def cancel(self) -> None:
        """Stop the step (from another thread): run_step stops srun, which signals every node's tasks."""
        self._cancelled.set()


def cancel_named(name: str, env: dict | None = None) -> list[str]:
    """scancel any step (or job of our own) still carrying this unique name; returns the steps cancelled.
    Best effort: no SLURM client or no answer cancels nothing."""
    def run(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=20, env=env)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.stdout if out.returncode == 0 else ""

    steps = [line.split()[0] for line in run(["squeue", "-h", "-s", "-o", "%i %j"]).splitlines()
             if line.split()[1:2] == [name]]
    for step in steps:
        run(["scancel", step])
    run(["scancel", f"--name={name}"])
    return steps


# SLURM node states (sinfo -o %T) in which it starts no task; a trailing * is "not responding" in any of them
UNREACHABLE = ("down", "drain", "fail", "maint", "reboot", "future", "unknown", "power")


def unreachable_reason(state: str) -> str | None:
    """Why SLURM would not start a task on a node in `state` (as `sinfo -o %T` prints it), or None when it would."""
    if state.endswith("*"):
        return f"SLURM reports the node {state} (not responding to slurmctld)"
    if any(state.startswith(word) for word in UNREACHABLE):
        return f"SLURM reports the node {state}"
    return None
