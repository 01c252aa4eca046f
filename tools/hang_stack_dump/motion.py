"""Whether the dumped processes move: a second look before a job is called stuck (issue 35).

One snapshot cannot tell a hang from a healthy data-parallel job: in the latter most ranks are inside
a collective at any instant, so one dump reads "all ranks wait in all_reduce" (or "rank 0 is the odd one
out" when it was caught computing). So after the first dump every process is read again, GAP_S apart,
until each has moved or LOOK_S has passed. A process moved when its main thread's fingerprint changed:
its user frames (function, file, line, and their local variables: name, object address and the value
py-spy prints), or which library functions are on the stack. A frame blocked in a collective cannot
rebind its locals, while a loop that came back to the same collective call has a new step counter or
batch, so a tight all_reduce loop whose stack reads the same at every look still shows it moved. A
library's own lines and locals are left out: a wait that polls in Python (`while not work.is_completed():
sleep`) changes line and counter inside the library while the job stands still. The locals are hashed
here and never kept or shown: they may hold anything (tokens, paths).

The CPU time each process used between its first and last look is reported beside it (a stuck gloo
collective sleeps; a NCCL wait may spin, so CPU alone proves nothing and decides nothing).
"""

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

from .stacks import ProcessStack
from ..shared.pyspy import dump_one, library_file, main_thread

LOOK_S = 6.0        # the second look's bound: a job whose step is longer may look still (the answer says so)
GAP_S = 1.0         # between two reads of one process


def fingerprint(threads: list[dict], pid: int) -> str:
    """A digest of the main thread: its user frames' places and locals (py-spy --locals), the library functions."""
    t = main_thread(threads, pid) or {}
    h = hashlib.sha256()
    for f in t.get("frames") or []:
        if library_file(str(f.get("filename") or "")):
            h.update(f"{f.get('name')}|{f.get('filename')}\n".encode())
            continue
        h.update(f"{f.get('name')}|{f.get('filename')}|{f.get('line')}\n".encode())
        for v in f.get("locals") or []:
            h.update(f"  {v.get('name')}={v.get('addr')}:{v.get('repr')}\n".encode())
    return h.hexdigest()


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (/proc/PID/stat), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def look_again(procs: list[ProcessStack], first: dict[int, str], cpu0: dict[int, float | None], since: float,
               timeout_s: float, py_spy: str, progress, bound_s: float = LOOK_S) -> None:
    """Read `procs` again until each has moved or bound_s has passed since `since` (the first look's end);
    sets each one's `moved` and `watched_s`, and `cpu_s` when its CPU time could be read."""
    left = {p.pid: p for p in procs if not p.error and p.pid in first}
    seen: dict[int, float] = {}
    while left and time.monotonic() - since < bound_s:
        time.sleep(min(GAP_S, max(0.0, bound_s - (time.monotonic() - since))))

        def read(p: ProcessStack) -> tuple[ProcessStack, str | None]:
            threads, _ = dump_one(p.pid, False, timeout_s, py_spy, nonblocking=bool(p.frozen), with_locals=True)
            return p, fingerprint(threads, p.pid) if threads is not None else None

        with ThreadPoolExecutor(max_workers=min(8, len(left))) as pool:
            for p, fp in pool.map(read, list(left.values())):
                seen[p.pid] = time.monotonic() - since
                if fp is None:               # gone since the first look: neither moved nor still
                    left.pop(p.pid)
                elif fp != first[p.pid]:
                    p.moved = True
                    left.pop(p.pid)
        progress(0.9, f"second look: {len(procs) - len(left)}/{len(procs)} moved after {time.monotonic() - since:.1f} s")
    for p in procs:
        if p.pid in seen:
            p.watched_s = round(seen[p.pid], 1)
            if p.pid in left:
                p.moved = False
            cpu = cpu_seconds(p.pid)
            if cpu is not None and cpu0.get(p.pid) is not None:
                p.cpu_s = round(cpu - cpu0[p.pid], 2)
