"""What the kernel says about one process (private to the process_targets door): who it is, whether it runs
Python, whether it is ours, its cgroups, whether it can run at all."""

import os
from dataclasses import dataclass

from ..process_origin import cgroup_paths

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
# Command-line marks of our own processes: a per-node agent started through srun, py-spy, and every tool run of
# the server (`<package>.engine.child TOOL`, this one's siblings) and the SSH transport's wrappers are no rank to read.
OUR_MARKS = ("hang_stack_dump", "straggler_find", "py-spy", "engine.child", "engine.remote_step", "engine.ssh_lines")


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


def is_python_proc(proc) -> bool:
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
        return is_python_proc(psutil.Process(pid))
    except psutil.Error:
        return False


def ourselves() -> set[int]:
    """This tool's own process and its ancestors (the CLI, the server, a shell, init): never targets."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}


def is_ours(cmdline: list[str]) -> bool:
    cmd = " ".join(cmdline)[:8192]
    return any(mark in cmd for mark in OUR_MARKS)


def command_of(pid: int) -> list[str]:
    import psutil

    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def uid_of(pid: int) -> int | None:
    import psutil

    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


def user_words(uid: int | None, name_only: bool = False) -> str:
    """'uid 65534 (nobody)', or 'nobody' with name_only (the uid where it has no name)."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError):
        return f"uid {uid}"
    return name if name_only else f"uid {uid} ({name})"


def job_cgroups(pid: int | str) -> list[str]:
    """The cgroup paths /proc/PID/cgroup lists for the process ([] when unreadable)."""
    return cgroup_paths(pid)


def in_job_cgroup(pid: int | str, job_id: str) -> bool:
    return any(f"job_{job_id}" in path.split("/") for path in job_cgroups(pid))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (/proc/PID/stat); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()     # the command in parentheses may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _tracer(pid: int) -> str | None:
    """'pid N ('name')' of the process tracing pid (its TracerPid), "" when none is seen, None when that cannot be
    read. Read as bytes: a process names itself, in any bytes; the name is quoted escaped. A tracer in a pid
    namespace this tool cannot see reads as none."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            tracer = next((int(line.split()[1]) for line in f if line.startswith(b"TracerPid:")), 0)
    except (OSError, ValueError, IndexError):
        return None
    if not tracer:
        return ""
    try:
        with open(f"/proc/{tracer}/comm", "rb") as f:
            name = f.read().strip()[:32].decode(errors="backslashreplace")
    except OSError:
        name = "?"
    return f"pid {tracer} ({name.encode('unicode_escape').decode('ascii')!r})"


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
        # Asked in model round 12 (twice): whether SIGCONT alone resumes it, or a debugger holds it.
        tracer = _tracer(pid)
        if tracer:
            return (f"pid {pid} is stopped (state {state}) and traced by {tracer}: a debugger (gdb, strace, a "
                    "py-spy without --nonblocking) holds it; detach that tracer, then SIGCONT if it stays stopped")
        seen = "no tracer seen" if tracer == "" else "whether a tracer holds it could not be read"
        return (f"pid {pid} is stopped (state {state}: SIGSTOP or SIGTSTP; {seen}), not waiting on a peer: nothing "
                f"in it runs until SIGCONT (kill -CONT {pid} on its host)")
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
