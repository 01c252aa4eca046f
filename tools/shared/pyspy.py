"""py-spy, the one reader of a live process's Python stack (hang_stack_dump, straggler_find).

`py-spy dump --json` attaches with ptrace, reads the stacks and detaches: the process is paused for
the ~10-20 ms of the read, never changed. Errors are turned into what to do (permissions, a second
tracer, not Python, gone).
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..engine.spec import ToolFailure
from ..engine.printable import printable

LAUNCHER_FILES = ("torch/distributed/elastic/", "torch/distributed/run.py", "torch/distributed/launch")


def py_spy_path() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise ToolFailure("py-spy is not installed: `pip install py-spy` (it is a dependency of mleng), "
                          "then run again as the job's user or root.")
    return found


def explain_py_spy_error(pid: int, stderr: str, command: str) -> str:
    # The command line and py-spy's text (which may quote it) are the process's own words: one line each.
    err = printable(stderr.strip().split("\nStack backtrace:")[0].strip()[-400:], newlines=False)
    command = printable(command, newlines=False)
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


def frame_text(f: dict) -> str:
    name = f.get("name") or "?"
    short = f.get("short_filename") or f.get("filename") or "?"
    return f"{name} ({short}:{f.get('line', '?')})" if f.get("line") else f"{name} ({short})"


def main_thread(threads: list[dict], pid: int) -> dict | None:
    for t in threads:
        if t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread":
            return t
    return threads[0] if threads else None


def dump_one(pid: int, native: bool, timeout_s: float, py_spy: str,
             nonblocking: bool = False, with_locals: bool = False) -> tuple[list[dict] | None, str]:
    """(threads from `py-spy dump --json`, error text). nonblocking: read without pausing the process (a
    stopped process cannot be paused again: py-spy then answers with no threads). with_locals: each frame's
    local variables too (`locals`: name, addr, repr)."""
    cmd = ([py_spy, "dump", "--json", "--pid", str(pid)] + (["--native"] if native and not nonblocking else [])
           + (["--nonblocking"] if nonblocking else []) + (["--locals"] if with_locals else []))
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


# py-spy's text form prints paths short ("torch/distributed/distributed_c10d.py"): packages known by their folder.
SHORT_LIBRARY_PREFIXES = ("torch/", "deepspeed/", "accelerate/", "transformers/", "megatron/core/", "apex/", "numpy/",
                          "tqdm/", "lightning/", "pytorch_lightning/", "multiprocessing/", "concurrent/", "importlib/",
                          "asyncio/", "threading.py", "queue.py", "selectors.py", "socket.py", "runpy.py",
                          "subprocess.py")


def library_file(path: str) -> bool:
    """Not the user's code: installed packages, the stdlib, frozen modules, native libraries."""
    return ("/site-packages/" in path or "/dist-packages/" in path or "/lib/python3" in path
            or path.startswith("<frozen") or ".so" in Path(path).name
            or (not path.startswith("/") and path.startswith(SHORT_LIBRARY_PREFIXES)))


def waits_on_peers(frame: dict) -> bool:
    """Inside torch.distributed (not the launcher), or blocked on the GPU stream where a NCCL kernel waits."""
    path = str(frame.get("filename", ""))
    if "torch/distributed/" in path:
        return not any(x in path for x in LAUNCHER_FILES)
    return "torch/cuda/" in path and frame.get("name") == "synchronize"
