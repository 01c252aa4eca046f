"""The one door for finding a job's processes (hang_stack_dump, straggler_find): who they are, proven by the kernel.

`select(TargetRequest)` turns a pid list, a launcher pid, a command-line regex, GPU memory (NVML) or a SLURM job
id into the processes to read, each with its role (`roles`), plus what was refused and why. Nothing else in
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

from ..engine.redact import redact
from ..engine.spec import ToolFailure
from ..engine.printable import printable

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
# Command-line marks of our own readers: a per-node agent started through srun is no rank to read.
OUR_MARKS = ("hang_stack_dump", "straggler_find", "py-spy")
ALLOW_OTHER_USERS_HELP = "Root only: also other users' processes (default: yours)."


@dataclass(frozen=True)
class Identity:
    """Who a process is, as the kernel says (uid, start) and as it says itself (environment, cwd)."""
    pid: int
    uid: int                 # real uid
    started: float           # seconds since the epoch (psutil create_time)
    environ: dict
    cwd: str


def identity(pid: int) -> Identity | None:
    """The process's uid, start time, environment and working directory; None when gone or unreadable."""
    import psutil

    try:
        p = psutil.Process(pid)
        return Identity(pid=pid, uid=p.uids().real, started=p.create_time(), environ=p.environ(), cwd=p.cwd())
    except (psutil.Error, OSError):
        return None


def env_int(env: dict, names) -> int | None:
    for n in names:
        v = env.get(n, "")
        if v.strip().isdigit():
            return int(v)
    return None


def _is_python_proc(proc) -> bool:
    import psutil

    try:
        exe = " ".join(proc.cmdline()[:1]) + " " + proc.name()     # the program, not its arguments (srun python ...)
    except (psutil.Error, OSError):
        return False
    return "python" in exe.lower() or "torchrun" in exe.lower()


def is_python(pid: int) -> bool:
    """Whether the process runs Python (or torchrun): py-spy reads nothing else."""
    import psutil

    try:
        return _is_python_proc(psutil.Process(pid))
    except psutil.Error:
        return False


def _ourselves() -> set[int]:
    """This tool's own process and its ancestors (the CLI, the server, a shell, init): never targets."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}


def _is_ours(cmdline: list[str]) -> bool:
    cmd = " ".join(cmdline)
    return any(mark in cmd for mark in OUR_MARKS)


def _uid(pid: int) -> int | None:
    import psutil

    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


def _user(uid: int | None) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, TypeError):
        return f"uid {uid}"


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

def job_cgroups(pid: int | str) -> list[str]:
    """The cgroup paths /proc/PID/cgroup lists for the process ([] when unreadable)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return [line.rstrip("\n").split(":", 2)[2] for line in f if line.count(":") >= 2]
    except OSError:
        return []


def in_job_cgroup(pid: int | str, job_id: str) -> bool:
    return any(f"job_{job_id}" in path.split("/") for path in job_cgroups(pid))


def _claim(pid: int, env: dict, job_id: str) -> str:
    rank = env_int(env, RANK_VARS)
    return f"pid {pid} claims {'rank ' + str(rank) if rank is not None else 'to be a process'} of job {job_id}"


def job_processes(job_id: str, job_uid: int) -> tuple[list[int], list[str]]:
    """(pids of job `job_id` on this node, one line per process that claims the job but is not in it).

    Candidates are Python processes whose environment names the job (on this slurmd's node); each must be the
    job user's, and in `job_<id>`'s cgroup where SLURM's cgroup plugin puts any of them (or us) in one."""
    import psutil

    ours = _ourselves()
    node = os.environ.get("SLURMD_NODENAME")      # several slurmd may run on one host: this node's share
    candidates = []
    for p in psutil.process_iter():
        if p.pid in ours:
            continue
        try:
            env = p.environ()
            claims = env.get("SLURM_JOB_ID") == job_id and (node is None or env.get("SLURMD_NODENAME", node) == node)
            if claims and _is_python_proc(p) and not _is_ours(p.cmdline()):
                candidates.append((p.pid, p.uids().real, env, in_job_cgroup(p.pid, job_id)))
        except (psutil.Error, OSError):
            continue
    cgroup_plugin = in_job_cgroup("self", job_id) or any(c[3] for c in candidates)
    kept, refused = [], []
    for pid, uid, env, in_cgroup in candidates:
        if uid != job_uid:
            refused.append(f"{_claim(pid, env, job_id)} but belongs to {_user(uid)}, not the job's user "
                           f"({_user(job_uid)}): left out")
        elif cgroup_plugin and not in_cgroup:
            refused.append(f"{_claim(pid, env, job_id)} but is not in job_{job_id}'s cgroup: left out")
        else:
            kept.append(pid)
    return kept, refused


@dataclass(frozen=True)
class RunningJob:
    job_id: str              # SLURM's own id (%A: an array task's raw id), as in SLURM_JOB_ID and job_<id>
    user: str
    uid: int
    nodes: int
    nodelist: str


def running_job(job_id: str) -> RunningJob:
    """The running job `job_id` if the caller may read its processes (its owner, or root); else ToolFailure."""
    from . import slurm

    try:
        out = slurm.run_cmd(["squeue", "-h", "-j", job_id, "-o", "%T|%u|%D|%N|%U|%A"], timeout_s=20, check=False)
    except slurm.SlurmError as e:
        raise ToolFailure(str(e)) from None
    line = out.strip().splitlines()[0] if out.strip() else ""
    if not line:
        raise ToolFailure(f"slurm_job_id {job_id}: no such job in squeue (wrong id, or it ended more than "
                          "MinJobAge ago): `squeue -u $USER` lists yours.")
    state, user, count, nodelist, uid, raw_id = (line.split("|") + [""] * 6)[:6]
    if state != "RUNNING":
        raise ToolFailure(f"slurm_job_id {job_id} is {state}, not RUNNING: there is nothing to read "
                          f"({slurm.explain_state(state) if state else 'unknown state'}).")
    if not uid.strip().isdigit():
        raise ToolFailure(f"slurm_job_id {job_id}: squeue gave no numeric uid for its user ({uid[:40]!r}): "
                          "its processes cannot be told from other users'.")
    if int(uid) != os.geteuid() and os.geteuid() != 0:
        raise ToolFailure(f"slurm_job_id {job_id} belongs to {user}, not to you ({_user(os.geteuid())}): only the "
                          "job's owner or root may read its processes; ask its owner.")
    return RunningJob(job_id=raw_id.strip() if raw_id.strip().isdigit() else job_id, user=user, uid=int(uid),
                      nodes=int(count) if count.isdigit() else 1, nodelist=nodelist)


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
    allow_other_users: bool = False


@dataclass
class Targets:
    pids: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)       # claims not proven, other users' processes left out


def _refuse_ours(pids: list[int], what: str) -> None:
    ours = _ourselves()
    for pid in pids:
        if pid in ours:
            raise ToolFailure(f"{what} {pid} is this tool's own process or one of its ancestors (the CLI, the MCP "
                              "server, a shell, init): its descendants are everything, not a job. Give the job's "
                              "launcher or its ranks.")


def _scoped(pids: list[int], scope: int | None, what: str, out: Targets) -> list[int]:
    """The pids of the caller's uid (all when scope is None); the others named in out.refused."""
    if scope is None:
        return pids
    kept = []
    for pid in pids:
        uid = _uid(pid)
        if uid is None or uid == scope:
            kept.append(pid)
        else:
            out.refused.append(f"{what} pid {pid} belongs to {_user(uid)}, not to you ({_user(scope)}): left out "
                               "(root may pass allow_other_users)")
    return kept


def select(req: TargetRequest) -> Targets:
    """The processes `req` names, deduplicated, never ours; what was left out, and why, in `refused`."""
    out, scope = Targets(), caller_scope(req.allow_other_users)
    _refuse_ours(req.pids, "pids:")
    for pid in req.pids:
        uid = _uid(pid)
        if scope is not None and uid is not None and uid != scope:
            raise ToolFailure(f"pids: {pid} belongs to {_user(uid)}, not to you ({_user(scope)}): a user reads only "
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
    ours = _ourselves()
    out.pids = [p for p in dict.fromkeys(pids) if p not in ours]
    return out


def _launcher_children(pid: int, scope: int | None, out: Targets) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        owner = root.uids().real
        kids = [p for p in root.children(recursive=True) if _is_python_proc(p)]
        name = root.name()
    except psutil.NoSuchProcess:
        raise ToolFailure(f"launcher pid {pid} does not exist (the job ended, or it runs on another node)") from None
    if scope is not None and owner != scope:
        raise ToolFailure(f"launcher_pid {pid} belongs to {_user(owner)}, not to you ({_user(scope)}): a user reads "
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
    ours, out = _ourselves(), []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if p.pid not in ours and cmdline and rx.search(" ".join(cmdline)[:8192]) and not _is_ours(cmdline):
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


def frozen_reason(pid: int) -> str:
    """Why the process cannot run at all, or "" when it can: stopped (state T: SIGSTOP, SIGTSTP, a debugger's
    stop) or frozen by a cgroup freezer (v1 freezer.state FROZEN, v2 cgroup.freeze 1). Such a process is not
    waiting on a peer: it is the one the others wait for."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0].decode()  # the name may hold spaces and ')'
        with open(f"/proc/{pid}/cgroup") as f:
            cgroups = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    except (OSError, IndexError):
        return ""
    if state in ("T", "t"):
        return (f"pid {pid} is stopped (state {state}: SIGSTOP/SIGTSTP, or a debugger's stop), not waiting on "
                "a peer: nothing in it runs until SIGCONT")
    for _, controllers, path in cgroups:
        for probe in ([f"/sys/fs/cgroup/freezer{path}/freezer.state"] if "freezer" in controllers.split(",") else
                      [f"/sys/fs/cgroup{path}/cgroup.freeze", f"/sys/fs/cgroup/unified{path}/cgroup.freeze"]
                      if controllers == "" else []):
            try:
                with open(probe) as f:
                    value = f.read().strip()
            except OSError:
                continue
            if value in ("FROZEN", "FREEZING", "1"):
                return f"pid {pid} is frozen by its cgroup ({probe} = {value}): nothing in it runs until thawed"
    return ""
