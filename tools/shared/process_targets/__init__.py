"""The one door for finding a job's processes (hang_stack_dump, straggler_find): who they are, proven by the kernel.

`select(TargetRequest)` turns a pid list, a launcher pid, a command-line regex, GPU memory (NVML), a SLURM job
id or a torchrun run started without SLURM (its rendezvous id or its launcher's command line: runs.py) into the processes to read, each with its role (`roles`), plus what was refused and why. Nothing else in
tools/ reads another process's environment or working directory or lists processes to pick targets
(tests/test_door_processes.py fails when something does).

Trust: a process's environment is its own to write. `SLURM_JOB_ID=4242 RANK=2` makes a claim, not a rank: a
process is of job J only when the kernel says so, its uid being the job's user (squeue %U) and, where SLURM's
cgroup plugin runs (some process here sits in a `job_J` cgroup), its /proc/PID/cgroup holding `job_J`. A
claim that fails is reported ("pid P claims rank 2 of job J but belongs to uid 65534 ..."), never sampled.
A pid list, launcher or pattern reaches only the caller's own processes, unless the caller is root and set
allow_other_users. This tool's own process and its ancestors (the CLI, the MCP server, a shell, init) are
never targets, nor is anything whose command line marks it as one of our readers.
"""

import os
import re
from dataclasses import dataclass, field

from ..logscan import MAX_MATCH_CHARS
from ...engine.printable import printable
from ...engine.redact import redact
from ...engine.spec import ToolFailure
from .jobs import RunningJob, job_processes, running_job
from .runs import check_job_name, check_launcher_match, check_run_id, run_processes
from .kernel import (LOCAL_RANK_VARS, OUR_MARKS, RANK_VARS, Identity, command_of, cpu_seconds, env_int, frozen_reason, identity,
                     is_ours, is_python, is_python_proc, ourselves, uid_of, user_words)

ALLOW_OTHER_USERS_HELP = "Root: other users' too."
__all__ = ["ALLOW_OTHER_USERS_HELP", "LOCAL_RANK_VARS", "OUR_MARKS", "RANK_VARS", "Identity", "RunningJob",
           "TargetRequest", "Targets", "check_job_name", "check_launcher_match", "check_run_id", "cpu_seconds", "describe", "env_int", "frozen_reason", "identity", "is_python", "roles",
           "running_job", "select"]


def caller_scope(allow_other_users: bool) -> int | None:
    """The uid targets must have (the caller's), or None for anyone (root that asked for it)."""
    if not allow_other_users:
        return os.geteuid()
    if os.geteuid() != 0:
        raise ToolFailure("allow_other_users needs root: a user's tools read only that user's processes "
                          "(drop allow_other_users, or run as root).")
    return None


# ---------------------------------------------------------------------------------------------------
# Roles: one rule for every reader

def roles(procs: dict, parent_of: dict, rank_of: dict) -> dict:
    """Role of each key in `procs` (any hashable: a pid, (host, pid)): 'launcher' when one of its children has
    another rank than its own (torchrun, srun's task), 'helper' when its parent has its rank and is no launcher
    (a dataloader or compile worker inherits RANK), 'other' with no rank, else 'rank'. Only ranks are compared."""
    launchers = {parent_of[k] for k in procs if rank_of.get(k) is not None and parent_of.get(k) in procs
                 and rank_of.get(parent_of[k]) != rank_of[k]}
    out = {}
    for k in procs:
        parent, rank = parent_of.get(k), rank_of.get(k)
        if k in launchers:
            out[k] = "launcher"
        elif rank is None:
            out[k] = "other"
        elif parent in procs and parent not in launchers and rank_of.get(parent) == rank:
            out[k] = "helper"
        else:
            out[k] = "rank"
    return out


# ---------------------------------------------------------------------------------------------------
# Job membership: uid and cgroup, never the environment alone


# ---------------------------------------------------------------------------------------------------
# Selecting targets

@dataclass
class TargetRequest:
    pids: list[int] = field(default_factory=list)
    launcher_pid: int | None = None
    pattern: str = ""
    gpu_processes: bool = False
    job_id: str = ""                  # SLURM's id of a job running here
    job_uid: int | None = None        # its user's uid, when the caller already asked squeue
    run_id: str = ""                  # torchrun's --rdzv-id (TORCHELASTIC_RUN_ID in its workers): a job without SLURM
    launcher_match: str = ""          # or a literal piece of its launcher's command line
    allow_other_users: bool = False


@dataclass
class Targets:
    pids: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)       # claims not proven, other users' processes left out


def _refuse_ours(pids: list[int], what: str) -> None:
    ours = ourselves()
    for pid in pids:
        if pid in ours:
            raise ToolFailure(f"{what} {pid} is this tool's own process or one of its ancestors (the CLI, the MCP "
                              "server, a shell, init): its descendants are everything, not a job. Give the job's "
                              "launcher or its ranks.")
        if is_ours(command_of(pid)):
            raise ToolFailure(f"{what} {pid} is one of mleng's own processes (a tool run of the server, a per-node "
                              "agent, py-spy), not a rank: give the job's launcher or its ranks.")


def _scoped(pids: list[int], scope: int | None, what: str, out: Targets) -> list[int]:
    """The pids of the caller's uid (all when scope is None); the others named in out.refused."""
    if scope is None:
        return pids
    kept = []
    for pid in pids:
        uid = uid_of(pid)
        if uid is None or uid == scope:
            kept.append(pid)
        else:
            out.refused.append(f"{what} pid {pid} belongs to {user_words(uid)}, not to you, {user_words(scope)}: left out "
                               "(root may pass allow_other_users)")
    return kept


def select(req: TargetRequest) -> Targets:
    """The processes `req` names, deduplicated, never ours; what was left out, and why, in `refused`."""
    out, scope = Targets(), caller_scope(req.allow_other_users)
    _refuse_ours(req.pids, "pids:")
    for pid in req.pids:
        uid = uid_of(pid)
        if scope is not None and uid is not None and uid != scope:
            raise ToolFailure(f"pids: {pid} belongs to {user_words(uid)}, not to you, {user_words(scope)}: a user reads only "
                              "their own processes (root: add allow_other_users, or give slurm_job_id).")
    pids = list(req.pids)
    if req.launcher_pid:
        _refuse_ours([req.launcher_pid], "launcher_pid")
        pids += _scoped(_launcher_children(req.launcher_pid, scope, out), scope, "launcher's", out)
    if req.pattern:
        pids += _scoped(_pattern_matches(req.pattern), scope, "pattern-matched", out)
    if req.gpu_processes:
        pids += _scoped(_gpu_holders(), scope, "GPU-holding", out)
    if req.job_id:
        job_uid = req.job_uid if req.job_uid is not None else running_job(req.job_id).uid
        found, refused = job_processes(req.job_id, job_uid)
        pids += found
        out.refused += refused
    if req.run_id or req.launcher_match:
        try:    # checked where the params are too; a node's own check, since it reads the spec from argv
            run_id = req.run_id and check_run_id(req.run_id)
            launcher_match = "" if run_id else check_launcher_match(req.launcher_match)
        except ValueError as e:
            raise ToolFailure(str(e)) from None
        found, refused = run_processes(run_id, launcher_match, scope)
        pids += found
        out.refused += refused
    ours = ourselves()
    out.pids = [p for p in dict.fromkeys(pids) if p not in ours]
    return out


def _launcher_children(pid: int, scope: int | None, out: Targets) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        owner = root.uids().real
        kids = [p for p in root.children(recursive=True) if is_python_proc(p)]
        name = root.name()
    except psutil.NoSuchProcess:
        raise ToolFailure(f"launcher pid {pid} does not exist (the job ended, or it runs on another node)") from None
    if scope is not None and owner != scope:
        raise ToolFailure(f"launcher_pid {pid} belongs to {user_words(owner)}, not to you, {user_words(scope)}: a user reads "
                          "only their own processes (root: add allow_other_users, or give slurm_job_id).")
    if not kids and name == "srun":
        try:
            job = root.environ().get("SLURM_JOB_ID", "")
        except (psutil.Error, OSError):
            raise ToolFailure(f"cannot read srun's environment (pid {pid}): run as the job's user or root, or "
                              "pass slurm_job_id") from None
        if not job.isdigit():
            return []
        found, refused = job_processes(job, owner)      # srun runs as the job's user
        out.refused += refused
        return [p for p in found if p != pid]
    ranked = []
    for p in kids:
        try:
            if env_int(p.environ(), RANK_VARS + LOCAL_RANK_VARS) is not None:
                ranked.append(p.pid)
        except (psutil.Error, OSError):
            pass
    # Dataloader workers inherit RANK too; kept (a stuck worker matters) but not compared with ranks.
    return ranked or [p.pid for p in kids]


def _pattern_matches(pattern: str) -> list[int]:
    import psutil

    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ToolFailure(f"pattern {printable(repr(pattern))} is not a valid regex: {e}") from None
    ours, out = ourselves(), []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        # Another user's command line is outside text: the caller's regex sees its first MAX_MATCH_CHARS only.
        if p.pid not in ours and cmdline and rx.search(" ".join(cmdline)[:MAX_MATCH_CHARS]) and not is_ours(cmdline):
            out.append(p.pid)
    return out


def _gpu_holders() -> list[int]:
    try:
        import pynvml
    except ImportError:
        raise ToolFailure("gpu_processes needs nvidia-ml-py (`pip install nvidia-ml-py`), or pick the processes "
                          "with pids, launcher_pid or pattern.") from None
    try:
        pynvml.nvmlInit()
    except (OSError, pynvml.NVMLError) as e:
        raise ToolFailure(f"gpu_processes needs NVML and it is not available here ({e}): no NVIDIA driver on "
                          "this machine. Pick the processes with pids, launcher_pid or pattern instead.") from None
    pids = set()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    pids.update(p.pid for p in getattr(pynvml, fn)(h))
                except pynvml.NVMLError:
                    pass
    finally:
        pynvml.nvmlShutdown()
    import psutil

    visible = sorted(p for p in pids if psutil.pid_exists(p))
    if not pids:
        raise ToolFailure("NVML lists no process holding GPU memory on this node: the job is not running here, "
                          "or it has not touched the GPU yet. Use pattern or launcher_pid.")
    if not visible:
        raise ToolFailure(f"NVML reports pids {sorted(pids)[:8]} holding GPU memory, but none exists in this PID "
                          "namespace (a container that does not share the host's pids?): use pattern or "
                          "launcher_pid from inside the job's container.")
    return visible


def describe(pid: int) -> tuple[str, int, int | None, int | None]:
    """(command line, parent pid, rank, local rank) of a live process."""
    import psutil

    try:
        p = psutil.Process(pid)
        command, ppid = redact(" ".join(p.cmdline()))[:300], p.ppid()   # --db-password X on a command line
    except psutil.Error:
        return "", 0, None, None
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        env = {}
    return command, ppid, env_int(env, RANK_VARS), env_int(env, LOCAL_RANK_VARS)
