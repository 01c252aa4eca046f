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
here and never kept or shown: they may hold anything (tokens, paths). stacks.look_again does the looking.

The CPU time each process used between its first and last look is reported beside it (a stuck gloo
collective sleeps; a NCCL wait may spin, so CPU alone proves nothing and decides nothing).
"""

import hashlib

from ..shared.pyspy import library_file, main_thread

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
