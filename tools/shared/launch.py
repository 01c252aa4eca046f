"""Launcher side of the distributed tools: start ranks, follow their side channel, name culprits.

`launch_ranks()` starts a tool's rank module (`python -m tools.<tool>.rank`) on every rank through torchrun (one node:
--standalone; inside a SLURM allocation: one torchrun per node through srun with a c10d rendezvous on
the first node; with `rdzv_endpoint`: this node's share of a multi-node run), reads the events each
rank writes (see tools/shared/ranks.py), and stops everything when the run ends, stalls or overruns:
nothing is left running. tools/shared/culprits.py turns the last state of every rank into findings.
"""

import glob
import json
import os
import random
import re
import secrets
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import field_validator

from . import slurm as _slurm
from . import sidechannel
from .nccl_env import check_nccl_env, nccl_env_field
from .ranks import check_event
from .scratch import LockedScratch
from ..engine.data import IMPORT_ROOT, PACKAGE
from ..engine.spec import Field, Params
from ..engine.processes import Supervised, descendants, local_gpu_count, torchrun_command
from ..engine.transport import TRANSPORT_ENV

@dataclass
class RankState:
    rank: int
    host: str | None = None
    local_rank: int | None = None
    pid: int | None = None
    status: str = "not_started"  # running | done | error | terminated | vanished | stuck | not_started
    stage: str = "(no report)"
    stages_seen: int = 0          # how far it got: all ranks walk the same stage sequence
    stage_entered_t: float | None = None
    end_t: float | None = None
    error: str | None = None
    exitcode: int | None = None
    stage_seconds: dict = field(default_factory=dict)
    last_beat: float | None = None   # launcher's monotonic clock when its last heartbeat arrived
    first_beat: float | None = None
    # (from, to) on the same clock: the longest gap between two of its beats. A frozen rank that SLURM thaws
    # (SIGCONT before it ends a step) beats again at once, so its last beat alone no longer shows the freeze.
    longest_silence: tuple[float, float] | None = None

    def where(self) -> str:
        return f"rank {self.rank} ({self.host or 'unknown host'}, pid {self.pid or '?'})"

    def waited_s(self) -> float:
        if self.stage_entered_t is None or self.end_t is None:
            return 0.0
        return max(0.0, self.end_t - self.stage_entered_t)


@dataclass
class LaunchOutcome:
    command: list[str]
    world_size: int
    ranks: dict[int, RankState]
    data: list[dict]              # every "data" event, in arrival order
    returncode: int | None
    stalled: bool                 # the launcher stopped a run that made no progress
    overran: bool                 # the launcher stopped a run that passed its deadline
    elapsed_s: float
    stderr_tail: str
    output_tail: str              # rank output that was not an event
    launch_failures: dict = field(default_factory=dict)  # node -> why the launcher could not start its ranks there
    skipped_lines: list[str] = field(default_factory=list)   # side-channel lines not believed, and why
    cut: str = ""                 # why the caller's `cut` stopped the run early ("" when it did not)
    launcher: str = "srun"        # who started the ranks on other nodes: srun, or ssh (launch_ssh.py)


class RankLayout(Params):
    """Where the ranks run: the fields every distributed tool shares."""

    nproc_per_node: int | None = Field(None, ge=1, le=64, description=(
        "Default: every GPU; 2 gloo ranks without."))
    nnodes: int | None = Field(None, ge=1, le=4096, description=(
        "Default: the SLURM allocation's, else 1."))
    rdzv_endpoint: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-\[\]:]+:\d+$", description=(
        "host:port of node 0's c10d rendezvous (started by hand on each node, outside SLURM)."))
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description=(
        "auto: NCCL when ranks see GPUs, else gloo."))
    nccl_env: dict[str, str] = nccl_env_field()

    @field_validator("nccl_env")
    @classmethod
    def _allowed_nccl_env(cls, value: dict[str, str]) -> dict[str, str]:
        return check_nccl_env(value)


def rank_reader(reader: sidechannel.Reader | None = None) -> Callable[[str], dict | None]:
    """parse_line for a launch: the side channel's reader with the rank events' check (malformed
    lines are skipped and counted in the reader, never raised)."""
    reader = reader or sidechannel.Reader(check_event)

    def parse(line: str) -> dict | None:
        event = reader.parse(line)
        return event.data if event else None
    return parse


def apply_event(ranks: dict[int, RankState], event: dict) -> None:
    state = ranks.setdefault(int(event["rank"]), RankState(rank=int(event["rank"])))
    state.host, state.local_rank, state.pid = event.get("host"), event.get("local_rank"), event.get("pid")
    kind, t = event["ev"], float(event.get("t", time.time()))
    if kind == "beat":  # alive, nothing more: its stage and status stay as they were
        now = time.monotonic()
        if state.last_beat is not None and (state.longest_silence is None
                                            or now - state.last_beat > state.longest_silence[1] - state.longest_silence[0]):
            state.longest_silence = (state.last_beat, now)
        state.first_beat = state.first_beat if state.first_beat is not None else now
        state.last_beat = now
        return
    if state.status == "not_started":
        state.status, state.stage_entered_t = "running", t
    state.stage = event.get("stage", state.stage)
    if kind == "stage":
        state.stages_seen += 1
        state.stage_entered_t = t
    elif kind in ("error", "terminated", "done"):
        state.status = kind
        state.end_t = t
        state.error = event.get("error") if kind == "error" else state.error
        state.stage_seconds = event.get("stage_seconds", state.stage_seconds)


_FAILURE_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_exitcodes(stderr: str) -> dict[int, int]:
    """rank -> exit code from torchrun's ChildFailedError summary (empty when there is none)."""
    return {int(rank): int(code) for rank, code in _FAILURE_RE.findall(stderr)}


def rank_command(rank_module: str, params: dict, nproc_per_node: int, *, nnodes: int = 1,
                 rdzv_endpoint: str | None = None, rdzv_id: str | None = None) -> list[str]:
    """torchrun command line that starts `rank_module` (e.g. 'collective_bench.rank') on this node's ranks."""
    return torchrun_command(f"{PACKAGE}.{rank_module}", nproc_per_node, [json.dumps(params)], nnodes=nnodes,
                            rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id)


def per_node_command(tool: str, nnodes: int, nproc_per_node: int, first_host: str, port: int = 29500) -> str:
    """What to run by hand on every node when we cannot start the other nodes ourselves."""
    return (f"PYTHONPATH={shlex.quote(str(IMPORT_ROOT))} {shlex.quote(sys.executable)} -m {PACKAGE}.{tool} "
            f"--nnodes {nnodes} --nproc-per-node {nproc_per_node} --rdzv-endpoint {first_host}:{port}")


def visible_gpus() -> int:
    """GPUs the ranks will see: CUDA_VISIBLE_DEVICES when set, else NVML's count, else /dev/nvidiaN files
    (NVML's Python binding may be missing where torch is installed)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    return local_gpu_count() or len(glob.glob("/dev/nvidia[0-9]*"))


def slurm_gpus_per_node(env: dict | None = None) -> int:
    """GPUs per node the SLURM allocation granted (0 when it says nothing): the node we run on (a login
    node under salloc) may have none even though the compute nodes do."""
    env = os.environ if env is None else env
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        m = re.search(r"(?<!\d)(\d+)\s*$", env.get(key, ""))  # "8" or "h100:8"
        if m:
            return int(m.group(1))
    jobs_gpus = env.get("SLURM_JOB_GPUS", "")
    return len([g for g in jobs_gpus.split(",") if g.strip()])


def layout(nproc_per_node: int | None, nnodes: int | None) -> tuple[int, int]:
    """(ranks per node, nodes): given values, else the GPUs per node of the SLURM allocation or every
    visible GPU (2 gloo ranks without GPUs), and the allocation's node count (1 outside SLURM)."""
    in_slurm = _slurm.in_allocation()
    nodes = nnodes or (len(_slurm.allocation_nodes()) if in_slurm else 1) or 1
    return nproc_per_node or (slurm_gpus_per_node() if in_slurm else 0) or visible_gpus() or 2, nodes


def manual_start(tool: str, nnodes: int, nproc_per_node: int, rdzv_endpoint: str | None) -> str | None:
    """The per-node command when several nodes are asked for and we cannot start them (no SLURM, no
    rendezvous given); None when we can run."""
    if nnodes > 1 and not rdzv_endpoint and not use_srun(nnodes):
        return per_node_command(tool, nnodes, nproc_per_node, "<first-node-address>")
    return None


def use_srun(nnodes: int) -> bool:
    """Start the ranks through srun: we are in a SLURM allocation but not inside one of its job steps
    (an salloc shell may run on a login node, so even one node goes through srun to reach its GPUs)."""
    return nnodes >= 1 and _slurm.in_allocation() and not os.environ.get("SLURM_STEP_ID") \
        and shutil.which("srun") is not None


def over_ssh(env: dict | None = None) -> bool:
    """A host list goes over SSH (engine/transport.py) where there is no SLURM here, or where
    MLENG_TRANSPORT=ssh asks for it; through srun otherwise."""
    env = os.environ if env is None else env
    if env.get(TRANSPORT_ENV) == "ssh":
        return True
    return not _slurm.client_configured(env) and not _slurm.in_allocation(env)


def plan_command(rank_module: str, params: dict, nproc_per_node: int, nnodes: int,
                 rdzv_endpoint: str | None) -> list[str]:
    """The command to run here: local torchrun, this node's part of a rendezvous, or srun over SLURM."""
    if rdzv_endpoint:
        return rank_command(rank_module, params, nproc_per_node, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
                            rdzv_id=f"mleng-{rank_module.split('.')[0]}")
    if use_srun(nnodes):
        return _slurm.srun_torchrun_command([f"{PACKAGE}.{rank_module}", json.dumps(params)], nnodes=nnodes,
                                            nproc_per_node=nproc_per_node,
                                            rdzv_port=29500 + random.randrange(1000))
    return rank_command(rank_module, params, nproc_per_node)


def launch_ranks(command: list[str], world_size: int, *, timeout_s: float, stall_s: float,
                 deadline_s: float, on_event=None, env: dict | None = None,
                 cut: Callable[[float], str | None] | None = None) -> LaunchOutcome:
    """Run `command` (from plan_command) and follow its ranks until they finish, stall or overrun.

    world_size: ranks expected to report here (0 when this node is one of several started by hand:
    only the ranks that report are followed).

    stall_s: stop when no rank reported anything for this long. deadline_s: stop regardless.
    On stop, the whole process tree is killed (torchrun workers are their own session leaders, so
    by descendants, not by process group). on_event(event) is called for every event as it arrives.
    cut(elapsed_s): the caller's own reason to stop now (pairwise: a pair far slower than the healthy
    ones), or None to go on; asked about every 50 ms.
    """
    run_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONUNBUFFERED": "1", **(env or {})}
    # A killed torchrun leaves its torchelastic_* log directory behind: give a local launch a scratch
    # TMPDIR of its own and remove it afterwards. Through srun each task makes and removes its own
    # (slurm.srun_torchrun_command): other nodes would not have a path made here. A task SIGKILLed by
    # SLURM cannot remove its own, so the run tags the folders and, when it was stopped or failed, one
    # cleanup step removes what is left on the allocation's nodes (a caller that runs many steps, as
    # pairwise does, passes its own tag and cleans up once at the end).
    scratch = None if command[0] == "srun" else LockedScratch()
    if scratch:
        run_env["TMPDIR"] = scratch.path
    own_tag = None
    if command[0] == "srun" and not run_env.get(_slurm.SCRATCH_TAG_ENV):
        own_tag = run_env[_slurm.SCRATCH_TAG_ENV] = secrets.token_hex(8)
    t0 = time.monotonic()
    reader = sidechannel.Reader(check_event)
    child = Supervised(command, parse_line=rank_reader(reader), env=run_env)
    ranks = {r: RankState(rank=r) for r in range(world_size)}
    data: list[dict] = []
    last_progress, stalled, overran, reported_world = time.monotonic(), False, False, world_size
    cut_reason = ""

    def drain(wait_s: float = 0.0):
        """Apply every event that has come in (waiting up to wait_s for the first one)."""
        nonlocal last_progress, reported_world
        while True:
            event = child.next_event(wait_s)
            wait_s = 0.0
            if event is None or event is Supervised.EOF:
                return
            apply_event(ranks, event)
            reported_world = max(reported_world, int(event.get("world_size") or 0))
            if event["ev"] == "beat":
                continue  # alive is not progress: a hung run still beats
            last_progress = time.monotonic()
            if event["ev"] == "data":
                data.append(event)
            if on_event:
                on_event(event)

    next_stopped_check = 0.0
    try:
        while child.proc.poll() is None:
            drain(wait_s=0.05)
            _mark_gone(ranks)
            if time.monotonic() >= next_stopped_check:
                _kill_ranks_left_stopped(child.proc.pid, ranks)
                next_stopped_check = time.monotonic() + 0.5
            now = time.monotonic()
            stop, cut_reason = stop_reason(now - t0, now - last_progress, stall_s=stall_s, deadline_s=deadline_s, cut=cut)
            stalled, overran = stop == "stalled", stop == "overran"
            if stop:
                break
    finally:
        child.stop(grace_s=3.0)
        if scratch:
            scratch.remove()
        if own_tag and (stalled or overran or cut_reason or child.proc.returncode):
            nodes = _slurm.allocation_nodes(run_env)
            if nodes:   # 15 s at most: a frozen node keeps its own, and the answer does not wait for it
                _slurm.remove_tagged_scratch(nodes, own_tag, timeout_s=15, env=run_env)
    drain()
    stderr_tail = child.stderr_text()
    settle(ranks, torchrun_exitcodes(stderr_tail), stopped=bool(stalled or overran or cut_reason))
    failed_nodes = _slurm.launch_failures(stderr_tail) if command[0] == "srun" else {}
    return LaunchOutcome(command=command, world_size=max([reported_world, *(r + 1 for r in ranks)]),
                         ranks=ranks, data=data, returncode=child.proc.returncode, stalled=stalled,
                         overran=overran, elapsed_s=round(time.monotonic() - t0, 2),
                         stderr_tail=stderr_tail[-4000:], output_tail="\n".join(child.output_tail)[-2000:],
                         skipped_lines=reader.notes(lambda task: "the ranks") + [
                             f"{n} line(s) skipped: {why}" for why, n in child.skipped.items()],
                         launch_failures=failed_nodes, cut=cut_reason)


def stop_reason(elapsed_s: float, quiet_s: float, *, stall_s: float, deadline_s: float,
                cut: Callable[[float], str | None] | None) -> tuple[str, str]:
    """Why a launch stops now: ("stalled" | "overran" | "cut", the caller's reason for a cut), or ("", "")."""
    if quiet_s > stall_s:
        return "stalled", ""
    if elapsed_s > deadline_s:
        return "overran", ""
    said = (cut(elapsed_s) or "") if cut else ""
    return ("cut", said) if said else ("", "")


def settle(ranks: dict[int, RankState], exitcodes: dict[int, int], stopped: bool) -> None:
    """Each rank's last state once its launch is over: its exit code, and a rank still running is stuck
    (the launcher stopped it) or vanished (gone without a word)."""
    end = time.time()
    for state in ranks.values():
        state.exitcode = exitcodes.get(state.rank)
        if state.status == "running":
            state.status = "stuck" if stopped else "vanished"
            state.end_t = end


def _kill_ranks_left_stopped(launcher_pid: int, ranks: dict[int, RankState]) -> None:
    """SIGKILL our own tree's processes when a rank has ended and every one left is stopped (SIGSTOP, a debugger's
    stop): nothing can go on. torchrun SIGTERMs the ranks left after a failure, which a stopped process cannot act
    on, and SIGKILLs them only after a fixed 30 s (its shutdown timeout does not reach that path): every answer
    about a frozen rank waited those 30 s for nothing. The processes come from the tree, never from what a
    rank's events say its pid is."""
    if not any(s.status in ("done", "error", "terminated", "vanished") for s in ranks.values()):
        return
    try:
        import psutil
    except ImportError:
        return  # torchrun's own SIGKILL comes 30 s later
    try:
        left = [p for p in descendants(launcher_pid) if p.status() != psutil.STATUS_ZOMBIE]
        if not left or any(p.status() != psutil.STATUS_STOPPED for p in left):
            return
        for p in left:
            p.kill()
    except psutil.NoSuchProcess:
        pass  # one ended meanwhile: look again on the next round


def _mark_gone(ranks: dict[int, RankState]) -> None:
    """A local rank whose process is gone without a final event crashed: note when, to order failures."""
    try:
        import psutil
    except ImportError:
        return  # torchrun's exit codes and the ranks' own reports still tell most of the story

    here = socket.gethostname()
    for state in ranks.values():
        if state.status != "running" or not state.pid or state.host != here:
            continue
        try:
            gone = psutil.Process(state.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        if gone:
            state.status, state.end_t = "vanished", time.time()
