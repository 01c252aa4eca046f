"""Run a multi-node tool from outside SLURM (an agent's MCP server on a login node) inside an allocation:
another RUNNING job's (`job_id`: steps go beside its own, --overlap) or one of our own (`partition`:
`salloc --no-shell` for N nodes, cancelled when the run ends). Inside, this process's SLURM_JOB_ID and
SLURM_JOB_NODELIST are the allocation's, so srun places every step there and the tool's code is the one it
runs under salloc. Only for a process that is the tool's own child (a subprocess tool): the environment
is changed for the run and put back after.

The own job's time limit is the call's deadline (tools/engine/placement.py): the net under a run killed before
its `finally` cancels the job. Waiting for nodes is bounded (salloc --immediate): a busy partition is an
error naming it, not a call that hangs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from ..engine.placement import own_job
from ..engine.spec import ToolFailure
from . import slurm

WAIT_FOR_NODES_S = 120
GRANTED = re.compile(r"Granted job allocation (\d+)")


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: list[str]
    ours: bool            # we asked for it (and cancel it at the end)
    gpus_per_node: int = 0   # GPUs the job holds on each node (what the tool's default rank count follows)

    def sentence(self) -> str:
        whose = "a job of our own, cancelled at the end" if self.ours else "beside that job's own steps"
        return f"Ran in SLURM job {self.job_id} ({whose}) on {len(self.nodes)} nodes: {', '.join(self.nodes[:8])}" + (
            " ..." if len(self.nodes) > 8 else "")


def _states(partition: str) -> list[list[str]]:
    out = slurm.run_cmd(["sinfo", "-h", "-N", "-p", partition, "-o", "%N %T"], timeout_s=30)
    return [line.split() for line in out.splitlines() if len(line.split()) == 2]


def idle_nodes(partition: str) -> list[str]:
    """Nodes of `partition` SLURM reports idle; ToolFailure naming partition when it has none or is unknown."""
    states = _states(partition)
    if not states:
        raise ToolFailure(f"partition: unknown or empty partition {partition!r} (sinfo -s lists them)")
    return list(dict.fromkeys(name for name, state in states if state == "idle"))


def out_of_service(partition: str) -> str:
    """The partition's nodes SLURM would start no task on, with their state ('' when none, or sinfo fails): said
    beside a failed salloc, since a DOWN node is most often why N nodes cannot be had (a model round, cl-link-down:
    "salloc said 'Connection timed out'" with the partition's one DOWN node left for the agent to find)."""
    try:
        states = _states(partition)
    except slurm.SlurmError:
        return ""
    out = sorted({name: state for name, state in states if slurm.unreachable_reason(state.lower())}.items())
    return "; ".join(f"{name} ({state})" for name, state in out[:16])


def _refuse_what_cannot_start(partition: str, count: int, nodelist: list[str] | None) -> None:
    """ToolFailure before salloc when SLURM would start no task on a node asked for by name, or the partition has
    fewer nodes it can start tasks on than `count`: salloc would wait WAIT_FOR_NODES_S for nothing (model round 8,
    cl-link-down: 120 s, then "Connection timed out" over an 8-node partition with mln6 not responding)."""
    try:
        states = _states(partition)
    except slurm.SlurmError:
        return                     # salloc's own answer, and out_of_service beside it, still say what went wrong
    down = {name: state for name, state in states if slurm.unreachable_reason(state.lower())}
    said = "; ".join(f"{name} ({state})" for name, state in sorted(down.items())[:16])
    if nodelist and set(nodelist) & down.keys():
        raise ToolFailure(f"nodes: SLURM will start no task on {', '.join(n for n in nodelist if n in down)} now "
                          f"(out of service in SLURM: {said}); leave them out, or check them first (slurm_status "
                          "dials a silent node's slurmd)")
    usable = len({name for name, _ in states} - down.keys())
    if not nodelist and down and count > usable:
        raise ToolFailure(f"nnodes: {count} node(s) of {partition!r} cannot be had now: SLURM can start tasks on "
                          f"{usable} of its {usable + len(down)} nodes; out of service in SLURM: {said}. A job "
                          "that needs every node waits or hangs at start-up until they answer: they are the first "
                          f"suspects. Measure the rest with nnodes={usable}; slurm_status dials a silent node's slurmd")


GPU_COUNT = re.compile(r"gpu(?::[A-Za-z0-9_.\-]{1,64})?[:=](\d{1,4})")


def gpu_count(gres: str) -> int:
    """GPUs per node in SLURM's words: 'gpu:8', 'gpu:h100:8(S:0-1)', 'gres/gpu=8', 'gres:gpu:4'; 0 without."""
    return max((int(m.group(1)) for m in GPU_COUNT.finditer(gres[:4096])), default=0)


def partition_gpus(partition: str) -> int:
    """GPUs per node in `partition` (the fewest any node has, so every node can give them)."""
    out = slurm.run_cmd(["sinfo", "-h", "-p", partition, "-o", "%G"], timeout_s=30)
    counts = [gpu_count(line) for line in out.splitlines() if line.strip()]
    return min(counts, default=0)


def request(partition: str, count: int | None, nodelist: list[str] | None, timeout_s: float) -> Allocation:
    """salloc --no-shell: `nodelist`, or `count` nodes (default: every idle one) of `partition`."""
    if nodelist:
        count = len(nodelist)
    elif count is None:
        count = len(idle_nodes(partition))
    if count < 2:
        raise ToolFailure(f"nnodes: partition {partition!r} has {count} idle node(s); pairwise and bisect need 2 or "
                          "more (give nnodes, or nodes by name)")
    _refuse_what_cannot_start(partition, count, nodelist)
    name = f"mleng-collective_bench-{uuid.uuid4().hex[:8]}"
    gpus = partition_gpus(partition)
    argv = ["salloc", "--no-shell", f"--nodes={count}", f"--immediate={WAIT_FOR_NODES_S}",
            *([f"--gres=gpu:{gpus}"] if gpus else []),
            *own_job(partition, timeout_s, name).srun_args, *([f"--nodelist={','.join(nodelist)}"] if nodelist else [])]
    env = own_job(partition, timeout_s).env(dict(os.environ))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=WAIT_FOR_NODES_S + 30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        slurm.run_cmd(["scancel", f"--name={name}"], timeout_s=20, check=False)
        raise ToolFailure(f"partition: salloc for {count} node(s) of {partition!r} gave no allocation ({exc})") from None
    granted = GRANTED.search(done.stderr + done.stdout)
    if done.returncode or not granted:
        slurm.run_cmd(["scancel", f"--name={name}"], timeout_s=20, check=False)
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no answer"]
        down = out_of_service(partition)
        raise ToolFailure(f"partition: no allocation of {count} node(s) in {partition!r} within "
                          f"{WAIT_FOR_NODES_S} s: salloc said {said[0][:300]!r}"
                          + (f"; out of service in SLURM: {down} (ask for fewer nodes, or name others)" if down else ""))
    job_id = granted.group(1)
    return Allocation(job_id, slurm.allocation_nodes(slurm.job_allocation_env(job_id)), ours=True, gpus_per_node=gpus)


def existing(job_id: str) -> Allocation:
    try:
        env = slurm.job_allocation_env(job_id)
        job = slurm.parse_kv_line(slurm.run_cmd(["scontrol", "show", "job", "-o", job_id], timeout_s=10))
    except slurm.SlurmError as exc:
        raise ToolFailure(f"job_id: {exc}") from None
    nodes = slurm.allocation_nodes(env)
    gpus = gpu_count(job.get("TresPerNode", "")) or gpu_count(job.get("TRES", "")) // max(1, len(nodes))
    return Allocation(job_id, nodes, ours=False, gpus_per_node=gpus)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def inside(allocation: Allocation) -> Iterator[Allocation]:
    """This process acts as a shell of the allocation for the block; the own job is cancelled after it,
    also when the call is cancelled (the runner's SIGTERM unwinds the block instead of ending us at once)."""
    previous = (signal.signal(signal.SIGTERM, _interrupt) if allocation.ours
                and threading.current_thread() is threading.main_thread() else None)
    saved = {k: v for k, v in os.environ.items() if k.startswith("SLURM_") and k != "SLURM_CONF"}
    for key in saved:
        del os.environ[key]
    given = {"SLURM_JOB_ID": allocation.job_id, "SLURM_JOB_NODELIST": ",".join(allocation.nodes),
             **({"SLURM_GPUS_PER_NODE": str(allocation.gpus_per_node)} if allocation.gpus_per_node else {})}
    os.environ.update(given)
    try:
        yield allocation
    finally:
        for key in given:
            os.environ.pop(key, None)
        os.environ.update(saved)
        if allocation.ours:
            slurm.run_cmd(["scancel", allocation.job_id], timeout_s=20, check=False)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
