"""Which processes of a running job to read with py-spy (hang_stack_dump, straggler_find).

Targets on this node by pid list, launcher, command-line regex, GPU memory (NVML) or SLURM job id,
and each one's rank from its environment. Never this tool's own processes or its ancestors: the CLI
or the MCP server would otherwise show up as a rank stuck in py-spy.
"""

import os
import re

from ..engine.redact import redact
from ..engine.spec import ToolFailure
from .logscan import MAX_MATCH_CHARS

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


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


def env_int(env: dict, names) -> int | None:
    for n in names:
        v = env.get(n, "")
        if v.strip().isdigit():
            return int(v)
    return None


def _is_python(proc) -> bool:
    import psutil

    try:
        exe = " ".join(proc.cmdline()[:1]) + " " + proc.name()
    except (psutil.Error, OSError):
        return False
    return "python" in exe.lower() or "torchrun" in exe.lower()


def _ourselves() -> set[int]:
    """This tool's own processes (and its ancestors: the CLI, the server), never targets."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}


# Command-line marks of our own readers: a per-node agent started through srun is no rank to read.
OUR_MARKS = ("hang_stack_dump", "straggler_find", "py-spy")


def _is_ours(cmdline: list[str]) -> bool:
    cmd = " ".join(cmdline)
    return any(mark in cmd for mark in OUR_MARKS)


def processes_with_env(key: str, value: str) -> list[int]:
    import psutil

    out, ours = [], _ourselves()
    # Inside a SLURM step, keep to this node's share: several slurmd may run on one host.
    node = os.environ.get("SLURMD_NODENAME")
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if (p.pid not in ours and env.get(key) == value and _is_python(p) and not _is_ours(p.cmdline())
                    and (node is None or env.get("SLURMD_NODENAME", node) == node)):
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def launcher_targets(pid: int) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        kids = [p for p in root.children(recursive=True) if _is_python(p)]
        name = root.name()
    except psutil.NoSuchProcess:
        raise ToolFailure(f"launcher pid {pid} does not exist (the job ended, or it runs on another node)") from None
    if not kids and name == "srun":
        try:
            job = root.environ().get("SLURM_JOB_ID", "")
        except (psutil.Error, OSError):
            raise ToolFailure(f"cannot read srun's environment (pid {pid}): run as the job's user or root, or "
                              "pass slurm_job_id") from None
        return [p for p in processes_with_env("SLURM_JOB_ID", job) if p != pid] if job else []
    ranked = []
    for p in kids:
        try:
            if env_int(p.environ(), RANK_VARS + LOCAL_RANK_VARS) is not None:
                ranked.append(p.pid)
        except (psutil.Error, OSError):
            pass
    # Dataloader workers inherit RANK too; kept (a stuck worker matters) but not compared with ranks.
    return ranked or [p.pid for p in kids]


def pattern_targets(pattern: str) -> list[int]:
    import psutil

    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ToolFailure(f"pattern {pattern!r} is not a valid regex: {e}") from None
    ours, out = _ourselves(), []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        # Another user's command line is outside text: the caller's regex sees its first MAX_MATCH_CHARS only.
        if p.pid not in ours and cmdline and rx.search(" ".join(cmdline)[:MAX_MATCH_CHARS]) and not _is_ours(cmdline):
            out.append(p.pid)
    return out


def gpu_targets() -> list[int]:
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
