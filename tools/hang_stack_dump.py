"""hang_stack_dump — py-spy stacks of a stuck job's processes, grouped, with the odd ranks named.

"It's stuck": dump the Python stack of every rank (py-spy attaches with ptrace; the job is not
stopped or changed), group identical stacks, and name the minority — typically most ranks wait in a
collective and one is somewhere else: "ranks 0-6 wait in all_reduce called from train.py:212;
rank 7 is in the dataloader at data.py:88". Each process's rank comes from its environment
(RANK / LOCAL_RANK / SLURM_PROCID).

By hand (the node the job runs on, as the job's user or root):
    python -m tools.hang_stack_dump --launcher-pid 12345             # a torchrun pid: all its workers
    python -m tools.hang_stack_dump --pattern 'train.py'             # processes whose command matches
    python -m tools.hang_stack_dump --gpu-processes                  # every process holding GPU memory
    python -m tools.hang_stack_dump --pids 101 102 --native --save-path /tmp/stacks.txt
Under SLURM (from a login node or inside the allocation; needs this checkout on a shared filesystem):
    python -m tools.hang_stack_dump --slurm-job-id 4242              # prints the all-nodes srun command
    python -m tools.hang_stack_dump --slurm-job-id 4242 --all-nodes  # runs it: every node, one report
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel

from tools.harness import REPO_ROOT, Field, Params, Result, ToolFailure, ToolSpec

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
MAX_PROCESSES = 1024
LAUNCHER_FILES = ("torch/distributed/elastic/", "torch/distributed/run.py", "torch/distributed/launch")


class StackGroup(BaseModel):
    ranks: list[int] = Field(default_factory=list, description="Ranks with this stack (from each process's env).")
    pids: list[int] = Field(default_factory=list, description="Processes with this stack (host:pid in procs).")
    hosts: list[str] = Field(default_factory=list, description="Hosts these processes run on.")
    where: str = Field("", description="Innermost frame: function (file:line).")
    called_from: str = Field("", description="Innermost frame in user code (outside torch and the stdlib).")
    in_collective: bool = Field(False, description=(
        "Whether the stack waits on other ranks: inside torch.distributed, or in torch.cuda.synchronize "
        "(NCCL collectives return at once; the wait shows up at the next synchronize)."))
    stack: list[str] = Field(default_factory=list, description="Main-thread frames, innermost first (bounded).")


class ProcessStack(BaseModel):
    pid: int = Field(0, description="Process id.")
    host: str = Field("", description="Host name.")
    rank: int | None = Field(None, description="Global rank from RANK / SLURM_PROCID, if readable.")
    local_rank: int | None = Field(None, description="LOCAL_RANK / SLURM_LOCALID, if readable.")
    command: str = Field("", description="Command line (shortened).")
    parent_pid: int = Field(0, description="Parent process id.")
    role: str = Field("rank", description=(
        "rank | helper (a child of a rank with the same RANK: dataloader worker, compile worker) | "
        "other (no rank in its environment: launcher, unrelated process)."))
    stack: list[str] = Field(default_factory=list, description="Main-thread frames, innermost first.")
    called_from: str = Field("", description="Innermost main-thread frame in user code.")
    in_collective: bool = Field(False, description="Whether the main thread is inside torch.distributed.")
    error: str = Field("", description="Why this process could not be dumped.")


class HangStackDumpParams(Params):
    pids: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list, max_length=MAX_PROCESSES,
                                                    description="Process ids to dump.")
    launcher_pid: int | None = Field(None, ge=1, description=(
        "A launcher's pid (torchrun, deepspeed, a python parent): dump its descendants. For an srun pid, "
        "the local tasks of its job are dumped (srun's tasks are children of slurmstepd, not srun)."))
    pattern: str = Field("", max_length=200, description="Regex on the command line, e.g. 'train.py'.")
    gpu_processes: bool = Field(False, description="Dump every process holding GPU memory (NVML).")
    slurm_job_id: str = Field("", max_length=32, pattern=r"^[0-9_]*$", description=(
        "A SLURM job: dump its processes on this node; with all_nodes, on every node of the job."))
    all_nodes: bool = Field(False, description=(
        "With slurm_job_id: run `srun --overlap --jobid` to dump every node and merge the reports. "
        "Without it the command is only returned."))
    native: bool = Field(False, description="Add C/C++ frames (py-spy --native; ~1 s per torch process).")
    save_path: str = Field("", max_length=4096, description=(
        "Write every full dump (all threads) to this file; '{host}' in it becomes the host name. With "
        "all_nodes each node writes its own file (a '.{host}' suffix is added when '{host}' is missing)."))
    max_frames: int = Field(12, ge=1, le=200, description="Frames kept per stack in the report.")
    max_groups: int = Field(8, ge=1, le=200, description="Stack groups reported (largest and odd ones first).")
    per_process_timeout_s: float = Field(30.0, gt=0, le=600, description="Give up on one py-spy after this.")
    detail: bool = Field(False, description="Also return each process's stack (always on for --all-nodes tasks).")


class HangStackDumpResult(Result):
    groups: list[StackGroup] = Field(default_factory=list, description="Identical main-thread stacks, largest first.")
    odd_ranks: list[int] = Field(default_factory=list, description="Ranks outside the majority stack: look here first.")
    processes: list[ProcessStack] = Field(default_factory=list, description="Every process examined.")
    dumped: int = Field(0, description="Processes whose stack was read.")
    failed: int = Field(0, description="Processes that could not be dumped (see processes[].error).")
    slurm_command: str = Field("", description="The srun command that dumps every node of the job.")
    saved_to: str = Field("", description="File holding the full dumps, when save_path was given.")


# ---------------------------------------------------------------------------------------------------
# Which processes

def _env_int(env: dict, names) -> int | None:
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


def _is_ours(cmdline: list[str]) -> bool:
    cmd = " ".join(cmdline)
    return "hang_stack_dump" in cmd or "py-spy" in cmd


def _processes_with_env(key: str, value: str) -> list[int]:
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


def _launcher_targets(pid: int) -> list[int]:
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
        return [p for p in _processes_with_env("SLURM_JOB_ID", job) if p != pid] if job else []
    ranked = []
    for p in kids:
        try:
            if _env_int(p.environ(), RANK_VARS + LOCAL_RANK_VARS) is not None:
                ranked.append(p.pid)
        except (psutil.Error, OSError):
            pass
    # Dataloader workers inherit RANK too; kept (a stuck worker matters) but not compared with ranks.
    return ranked or [p.pid for p in kids]


def _pattern_targets(pattern: str) -> list[int]:
    import psutil

    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ToolFailure(f"pattern {pattern!r} is not a valid regex: {e}") from None
    ours, out = _ourselves(), []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if p.pid not in ours and cmdline and rx.search(" ".join(cmdline)) and not _is_ours(cmdline):
            out.append(p.pid)
    return out


def _gpu_targets() -> list[int]:
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


def resolve_targets(params: HangStackDumpParams) -> list[int]:
    pids = list(params.pids)
    if params.launcher_pid:
        pids += _launcher_targets(params.launcher_pid)
    if params.pattern:
        pids += _pattern_targets(params.pattern)
    if params.gpu_processes:
        pids += _gpu_targets()
    if params.slurm_job_id and not params.all_nodes:
        pids += _processes_with_env("SLURM_JOB_ID", params.slurm_job_id)
    pids = [p for p in dict.fromkeys(pids) if p != os.getpid()]
    return pids[:MAX_PROCESSES]


# ---------------------------------------------------------------------------------------------------
# Dumping one process

def py_spy_path() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise ToolFailure("py-spy is not installed: `pip install py-spy` (it is a dependency of mleng), "
                          "then run again as the job's user or root.")
    return found


def explain_py_spy_error(pid: int, stderr: str, command: str) -> str:
    err = stderr.strip().split("\nStack backtrace:")[0].strip()[-400:]
    low = err.lower()
    if "failed to suspend process" in low:
        return (f"could not pause pid {pid} to read it: another tracer (gdb, strace, a second py-spy) is attached, "
                f"or ptrace is denied. Check `grep TracerPid /proc/{pid}/status`; py-spy said: {err}")
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope")
        now = f" (kernel.yama.ptrace_scope is {scope.read_text().strip()} here)" if scope.exists() else ""
        return (f"no permission to attach to pid {pid}{now}: run as the same user as the job, or root; with Yama set "
                "`sysctl kernel.yama.ptrace_scope=0` (1 lets only root / CAP_SYS_PTRACE attach to non-children); "
                "in Docker add `--cap-add SYS_PTRACE`, in Kubernetes securityContext.capabilities.add "
                f"[SYS_PTRACE]. py-spy said: {err}")
    if "failed to find python version" in low or "not a python" in low:
        return (f"pid {pid} is not a Python process ({command[:80]}): py-spy reads Python stacks only; for native "
                f"code use `gdb -p {pid} -batch -ex 'thread apply all bt'`.")
    if ("no such process" in low or "failed to get process executable name" in low
            or "check that the process is running" in low):
        return f"pid {pid} exited before or during the dump (the job may have moved on or died)."
    return f"py-spy failed on pid {pid}: {err or 'no error text'}"


def _frame(f: dict) -> str:
    name = f.get("name") or "?"
    short = f.get("short_filename") or f.get("filename") or "?"
    return f"{name} ({short}:{f.get('line', '?')})" if f.get("line") else f"{name} ({short})"


def main_thread(threads: list[dict], pid: int) -> dict | None:
    for t in threads:
        if t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread":
            return t
    return threads[0] if threads else None


def dump_one(pid: int, native: bool, timeout_s: float, py_spy: str) -> tuple[list[dict] | None, str]:
    """(threads from `py-spy dump --json`, error text)."""
    cmd = [py_spy, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
    for attempt in range(3):
        try:
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout_s,
                                  env=dict(os.environ, RUST_BACKTRACE="0"))
        except subprocess.TimeoutExpired:
            return None, (f"py-spy gave no answer for pid {pid} in {timeout_s:.0f} s: a process in uninterruptible "
                          f"I/O (state D) cannot be read; as root, `cat /proc/{pid}/stack` shows where the kernel "
                          "holds it")
        # Only one tracer at a time: a second py-spy (another dump, a colleague) makes this one fail.
        if proc.returncode == 0 or "failed to suspend process" not in proc.stderr.lower():
            break
        time.sleep(0.3 * (attempt + 1))
    if proc.returncode != 0:
        return None, proc.stderr
    try:
        return json.loads(proc.stdout), ""
    except json.JSONDecodeError:
        return None, f"unreadable py-spy output: {proc.stdout[:200]}"


def _describe(pid: int) -> tuple[str, int, int | None, int | None]:
    """(command line, parent pid, rank, local rank) of a live process."""
    import psutil

    try:
        p = psutil.Process(pid)
        command, ppid = " ".join(p.cmdline())[:300], p.ppid()
    except psutil.Error:
        return "", 0, None, None
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        env = {}
    return command, ppid, _env_int(env, RANK_VARS), _env_int(env, LOCAL_RANK_VARS)


def assign_roles(procs: list[ProcessStack]) -> None:
    """Ranks are compared with ranks; a rank's own children (same RANK) and rank-less processes are not."""
    by_pid = {(p.host, p.pid): p for p in procs}
    for p in procs:
        parent = by_pid.get((p.host, p.parent_pid))
        if p.rank is None:
            p.role = "other"
        elif parent is not None and parent.rank == p.rank:
            p.role = "helper"


def _library_file(path: str) -> bool:
    """Not the user's code: installed packages, the stdlib, frozen modules, native libraries."""
    return ("/site-packages/" in path or "/dist-packages/" in path or "/lib/python3" in path
            or path.startswith("<frozen") or ".so" in Path(path).name)


def _waits_on_peers(frame: dict) -> bool:
    """Inside torch.distributed (not the launcher), or blocked on the GPU stream where a NCCL kernel waits."""
    path = str(frame.get("filename", ""))
    if "torch/distributed/" in path:
        return not any(x in path for x in LAUNCHER_FILES)
    return "torch/cuda/" in path and frame.get("name") == "synchronize"


def summarise_threads(threads: list[dict], pid: int, max_frames: int) -> dict:
    """Main-thread frames (bounded), the user's innermost frame, and whether it waits in torch.distributed."""
    t = main_thread(threads, pid) or {}
    frames = t.get("frames") or []
    user = next((f for f in frames if f.get("filename") and not _library_file(str(f["filename"]))), None)
    in_dist = any(_waits_on_peers(f) for f in frames)
    return {"stack": [_frame(f) for f in frames][:max_frames], "called_from": _frame(user) if user else "",
            "in_collective": in_dist}


def render_full_dump(pid: int, command: str, rank, threads: list[dict] | None, error: str) -> str:
    lines = [f"=== pid {pid} rank {rank if rank is not None else '?'}: {command}"]
    if threads is None:
        return "\n".join(lines + [f"  (not dumped: {error})", ""])
    for t in threads:
        lines.append(f"Thread {t.get('os_thread_id') or t.get('thread_id')} "
                     f"({'active' if t.get('active') else 'idle'}): {t.get('thread_name') or ''}")
        lines += [f"    {_frame(f)}" for f in t.get("frames") or []]
    return "\n".join(lines + [""])


# ---------------------------------------------------------------------------------------------------
# Grouping and naming the odd ranks

def _who(ranks: list[int], pids: list[int]) -> str:
    from tools.flight_recorder_analyze import rank_list

    if ranks:
        extra = f" (+{len(pids) - len(ranks)} processes without a rank)" if len(pids) > len(ranks) else ""
        return f"rank{'s' if len(ranks) > 1 else ''} {rank_list(ranks)}{extra}"
    return f"pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids[:8]))}"


def group_stacks(procs: list[ProcessStack]) -> list[StackGroup]:
    by_stack: dict[tuple, StackGroup] = {}
    for p in procs:
        if p.error:
            continue
        g = by_stack.setdefault(tuple(p.stack), StackGroup(
            where=p.stack[0] if p.stack else "(no Python frames: idle in C code)", called_from=p.called_from,
            in_collective=p.in_collective, stack=p.stack))
        g.pids.append(p.pid)
        if p.rank is not None:
            g.ranks.append(p.rank)
        if p.host not in g.hosts:
            g.hosts.append(p.host)
    for g in by_stack.values():
        g.ranks.sort()
    return sorted(by_stack.values(), key=lambda g: (-len(g.pids), g.ranks[:1], g.pids[:1]))


def odd_groups(groups: list[StackGroup]) -> list[StackGroup]:
    """The groups to look at first: outside a collective while others wait in one, else the minority."""
    if len(groups) < 2:
        return []
    waiting = [g for g in groups if g.in_collective]
    elsewhere = [g for g in groups if not g.in_collective]
    if waiting and elsewhere:
        return elsewhere
    if len(groups[0].pids) > len(groups[1].pids):
        return groups[1:]
    return []                              # a tie: no majority to measure the others against


def _place(g: StackGroup) -> str:
    via = f", called from {g.called_from}" if g.called_from and g.called_from != g.where else ""
    return f"{g.where}{via}"


def findings_for(groups: list[StackGroup], odd: list[StackGroup]) -> list[str]:
    if not groups:
        return []
    if len(groups) == 1:
        g = groups[0]
        what = ("the collective itself is stuck (network, NCCL, a GPU) or a rank not dumped here (another node?) "
                "never arrived: run flight_recorder_analyze on the dumps, nccl_log_analyze on the log"
                if g.in_collective else "no rank is behind the others at the Python level")
        return [f"All {len(g.pids)} processes ({_who(g.ranks, g.pids)}) sit in the same place: {_place(g)}; {what}."]
    out = []
    for g in groups:
        verb = "wait in" if g.in_collective else "are in"
        if len(g.pids) == 1:
            verb = "waits in" if g.in_collective else "is in"
        tag = " <- the odd one out: look here first" if g in odd else ""
        out.append(f"{_who(g.ranks, g.pids)} {verb} {_place(g)}{tag}.")
    if odd and any(g.in_collective for g in groups):
        out.append(f"The ranks in a collective are waiting for {_who(sorted(r for g in odd for r in g.ranks), [p for g in odd for p in g.pids])}, "
                   "which never reached it.")
    elif not odd:
        out.append("No majority stack: compare the groups' frames side by side.")
    return out


# ---------------------------------------------------------------------------------------------------
# SLURM: every node of a job

def slurm_all_nodes_command(params: HangStackDumpParams, nnodes: int | None) -> list[str]:
    cmd = ["srun", "--overlap", f"--jobid={params.slurm_job_id}", "--ntasks-per-node=1", "--label",
           "--kill-on-bad-exit=0", f"--chdir={REPO_ROOT}"]
    if nnodes:
        cmd.append(f"--nodes={nnodes}")
    cmd += [sys.executable, "-m", "tools.hang_stack_dump", "--slurm-job-id", params.slurm_job_id, "--detail",
            "--max-frames", str(params.max_frames), "--json"]
    if params.save_path:
        path = params.save_path if "{host}" in params.save_path else params.save_path + ".{host}"
        cmd += ["--save-path", path]
    return cmd + (["--native"] if params.native else [])


def _job_nodes(job_id: str) -> int | None:
    from tools import _slurm

    try:
        out = _slurm.run_cmd(["squeue", "-h", "-j", job_id, "-o", "%D"], timeout_s=20).split()
        return int(out[0]) if out and out[0].isdigit() else None
    except _slurm.SlurmError as e:
        raise ToolFailure(str(e)) from None


def run_all_nodes(params: HangStackDumpParams, cmd: list[str]) -> tuple[list[ProcessStack], list[str]]:
    """Run the per-node dumps through srun and collect every node's processes."""
    from tools import _slurm

    timeout = params.per_process_timeout_s * 4 + 60
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ToolFailure("srun is not on PATH: run this on a node of the cluster (login or compute).") from None
    except subprocess.TimeoutExpired:
        raise ToolFailure(f"srun gave no answer in {timeout:.0f} s: a node may be unreachable "
                          f"(`scontrol show job {params.slurm_job_id}`, `sinfo -R`)") from None
    procs, problems = [], []
    tasks = _slurm.split_labelled_output(proc.stdout)
    for task, text in tasks.items():
        try:
            doc = json.loads(text[text.index("{"):])
            procs += [ProcessStack(**p) for p in doc.get("processes", [])]
        except (ValueError, TypeError) as e:
            problems.append(f"node task {task}: no report ({e}): {text[-200:]}")
    if not tasks:
        problems.append(f"srun exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}")
    return procs, problems


# ---------------------------------------------------------------------------------------------------
# The tool

def dump_processes(pids: list[int], params: HangStackDumpParams, progress) -> tuple[list[ProcessStack], list[str]]:
    py_spy = py_spy_path()
    host = socket.gethostname()
    full = []

    def one(pid: int) -> ProcessStack:
        command, ppid, rank, local_rank = _describe(pid)
        threads, err = dump_one(pid, params.native, params.per_process_timeout_s, py_spy)
        full.append(render_full_dump(pid, command, rank, threads, err))
        ps = ProcessStack(pid=pid, host=host, rank=rank, local_rank=local_rank, command=command, parent_pid=ppid)
        if threads is None:
            ps.error = explain_py_spy_error(pid, err, command) if "no answer" not in err else err
        else:
            for key, value in summarise_threads(threads, pid, params.max_frames).items():
                setattr(ps, key, value)
        return ps

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(pids)))) as pool:
        procs = []
        for i, ps in enumerate(pool.map(one, pids)):
            procs.append(ps)
            progress(0.1 + 0.8 * (i + 1) / len(pids), f"dumped {i + 1}/{len(pids)} processes")
    return procs, full


def run(params: HangStackDumpParams, progress) -> HangStackDumpResult:
    if not (params.pids or params.launcher_pid or params.pattern or params.gpu_processes or params.slurm_job_id):
        job = os.environ.get("SLURM_JOB_ID", "")
        hint = (f" This shell is inside SLURM job {job}: slurm_job_id={job} dumps its processes on this node, "
                "and adding all_nodes=true dumps every node." if job.isdigit() else "")
        raise ToolFailure("say which processes to dump: pids, launcher_pid (torchrun's pid), pattern (e.g. "
                          "'train.py'), gpu_processes=true, or slurm_job_id." + hint)
    result = HangStackDumpResult()
    if params.slurm_job_id:
        cmd = slurm_all_nodes_command(params, _job_nodes(params.slurm_job_id) if params.all_nodes else None)
        result.slurm_command = " ".join(cmd)
    progress(0.05, "finding processes")
    problems = []
    if params.slurm_job_id and params.all_nodes:
        procs, problems = run_all_nodes(params, cmd)
        full = []
    else:
        pids = resolve_targets(params)
        if not pids:
            raise ToolFailure("no process matched: check the pid / pattern / job id on THIS node (ps -ef), or use "
                              "slurm_job_id with all_nodes to reach every node of a SLURM job.")
        procs, full = dump_processes(pids, params, progress)
    procs = list({(p.host, p.pid): p for p in procs}.values())   # nodes sharing a host report alike
    procs.sort(key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.host, p.pid))
    result.failed = sum(1 for p in procs if p.error)
    result.dumped = len(procs) - result.failed
    if params.save_path and full:
        path = Path(params.save_path.replace("{host}", socket.gethostname())).expanduser()
        path.write_text("\n".join(full))
        result.saved_to = str(path)
    elif params.save_path:
        result.saved_to = params.save_path if "{host}" in params.save_path else params.save_path + ".{host}"
    assign_roles(procs)
    ranked = [p for p in procs if p.role == "rank"]
    groups = group_stacks(ranked or procs)    # launchers and ranks' own children are not compared with ranks
    odd = odd_groups(groups)
    result.groups = (odd + [g for g in groups if g not in odd])[:params.max_groups]
    result.odd_ranks = sorted(r for g in odd for r in g.ranks)
    shown = procs if (params.detail or len(procs) <= 64) else [p for p in procs if p.error][:64]
    result.processes = shown if params.detail else [p.model_copy(update={"stack": []}) for p in shown]
    result.findings = findings_for(groups, odd)
    helpers = [p for p in procs if p.role == "helper"]
    others = [p for p in procs if p.role == "other"]
    if ranked and helpers:
        result.findings.append(f"{len(helpers)} child process(es) of ranks (dataloader or compile workers) were "
                               "dumped but not compared with the ranks: see processes (detail=true for stacks).")
    if ranked and others:
        result.findings.append(f"{len(others)} process(es) without a rank in their environment (launchers, "
                               "others) were dumped but not compared with the ranks: see processes.")
    errors = [p.error for p in procs if p.error] + problems
    if errors:
        result.findings.append(f"{len(errors)} process(es) not dumped; first: {errors[0]}")
    if not result.dumped:
        raise ToolFailure("no stack could be read. " + "; ".join(dict.fromkeys(errors))[:1500])
    result.verdict = "warn" if odd or errors else "info"
    result.next = (["flight_recorder_analyze", "log_triage", "knowledge://debugging/hangs.md"] if odd else
                   ["flight_recorder_analyze", "nccl_log_analyze", "knowledge://debugging/hangs.md"])
    progress(1.0, "done")
    return result


SPEC = ToolSpec(
    name="hang_stack_dump",
    summary="py-spy stacks of a hung job's ranks, grouped by identical stack; names the ranks that are elsewhere.",
    description=(
        "For a job that is stuck right now ('training hangs at step 300', 'GPU util 0%, no progress'): reads "
        "every rank's Python stack with py-spy (no restart, the job keeps running), groups identical stacks and "
        "names the odd ranks, e.g. 'ranks 0-6 wait in all_reduce called from train.py:212; rank 7 is in "
        "data.py:88'. Targets: pids, a launcher pid (torchrun) and its workers, a command-line regex, every "
        "process holding GPU memory, or a SLURM job (every node with all_nodes, via srun --overlap). Needs "
        "py-spy and ptrace permission (same user or root; explains how to fix it otherwise). Seconds per "
        "node. After the job died use flight_recorder_analyze or log_triage instead."),
    Params=HangStackDumpParams, Result=HangStackDumpResult, run=run, runs="subprocess",
    read_only=True, destructive=False, idempotent=True, open_world=False, timeout_s=300, store=False,
)

if __name__ == "__main__":
    from tools.harness import main

    main(SPEC)
