"""Grouping Python stacks read with py-spy (private to hang_stack_dump: no SPEC).

One `py-spy dump --json` per process (shared/pyspy.py, in parallel), its
main thread boiled down to the frames that matter, identical stacks grouped; then the same processes read
again until they move or a bound passes (look_again; what "move" means: motion.py). Other nodes run the
same dump through a node transport (step.py).
"""

import socket
import time
from concurrent.futures import ThreadPoolExecutor

from .motion import GAP_S, LOOK_S, fingerprint
from ..shared.process_targets import cpu_seconds, describe, frozen_reason, roles
from ..shared.pyspy import (
    dump_one, explain_py_spy_error, frame_text, library_file, main_thread, py_spy_path, waits_on_peers,
)
from ..engine.spec import Field, Record



# The report's records: hang_stack_dump's output schema, so every field keeps its description.
class StackGroup(Record):
    ranks: list[int] = Field(default_factory=list, description="Ranks with this stack (from each process's env).")
    pids: list[int] = Field(default_factory=list, description="Processes with this stack (host:pid in procs).")
    hosts: list[str] = Field(default_factory=list, description="Hosts these processes run on.")
    where: str = Field("", description="Innermost frame: function (file:line).")
    called_from: str = Field("", description="Innermost frame in user code (outside torch and the stdlib).")
    in_collective: bool = Field(False, description=(
        "Whether the stack waits on other ranks: inside torch.distributed, or in torch.cuda.synchronize "
        "(NCCL collectives return at once; the wait shows up at the next synchronize)."))
    stack: list[str] = Field(default_factory=list, description="Main-thread frames, innermost first (bounded).")


class ProcessStack(Record):
    pid: int = Field(0, description="Process id.")
    host: str = Field("", description="Host name.")
    rank: int | None = Field(None, description="Global rank from RANK / SLURM_PROCID, if readable.")
    local_rank: int | None = Field(None, description="LOCAL_RANK / SLURM_LOCALID, if readable.")
    command: str = Field("", description="Command line (shortened).")
    parent_pid: int = Field(0, description="Parent process id.")
    role: str = Field("rank", description=(
        "rank | helper (a rank's child with its RANK: dataloader, compile worker) | launcher (parent of ranks) | "
        "other (no rank in its environment)."))
    stack: list[str] = Field(default_factory=list, description="Main-thread frames, innermost first.")
    called_from: str = Field("", description="Innermost main-thread frame in user code.")
    in_collective: bool = Field(False, description="Whether the main thread is inside torch.distributed.")
    error: str = Field("", description="Why this process could not be dumped.")
    frozen: str = Field("", description=(
        "Why the process cannot run at all (stopped by SIGSTOP, frozen by a cgroup freezer); empty when it can. "
        "Its stack is read without pausing it (py-spy --nonblocking)."))
    moved: bool | None = Field(None, description=(
        "Whether its stack or its frames' local variables changed between looks (None: read once)."))
    watched_s: float = Field(0.0, description="Seconds between its first and last look.")
    cpu_s: float | None = Field(None, description="CPU seconds it used over watched_s.")


def assign_roles(procs: list[ProcessStack]) -> None:
    """Ranks are compared with ranks; launchers, a rank's own children (same RANK) and rank-less processes are
    not (the rule: process_targets.roles)."""
    by_key = {(p.host, p.pid): p for p in procs}
    role = roles(by_key, {k: (p.host, p.parent_pid) for k, p in by_key.items()},
                 {k: p.rank for k, p in by_key.items()})
    for key, p in by_key.items():
        p.role = role[key]


def summarise_threads(threads: list[dict], pid: int, max_frames: int) -> dict:
    """Main-thread frames (bounded), the user's innermost frame, and whether it waits in torch.distributed."""
    t = main_thread(threads, pid) or {}
    frames = t.get("frames") or []
    user = next((f for f in frames if f.get("filename") and not library_file(str(f["filename"]))), None)
    in_dist = any(waits_on_peers(f) for f in frames)
    return {"stack": [frame_text(f) for f in frames][:max_frames], "called_from": frame_text(user) if user else "",
            "in_collective": in_dist}


def render_full_dump(pid: int, command: str, rank, threads: list[dict] | None, error: str) -> str:
    lines = [f"=== pid {pid} rank {rank if rank is not None else '?'}: {command}"]
    if threads is None:
        return "\n".join(lines + [f"  (not dumped: {error})", ""])
    for t in threads:
        lines.append(f"Thread {t.get('os_thread_id') or t.get('thread_id')} "
                     f"({'active' if t.get('active') else 'idle'}): {t.get('thread_name') or ''}")
        lines += [f"    {frame_text(f)}" for f in t.get("frames") or []]
    return "\n".join(lines + [""])



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


def dump_processes(pids: list[int], native: bool, timeout_s: float, max_frames: int, progress,
                   fingerprints: dict[int, str] | None = None,
                   cpu: dict[int, float | None] | None = None) -> tuple[list[ProcessStack], list[str]]:
    """Every pid's summary, and each one's full dump (all threads) as text for save_path. `fingerprints` and
    `cpu`, when given, are filled with each process's main-thread fingerprint and CPU time (motion.py)."""
    py_spy = py_spy_path()
    host = socket.gethostname()
    full = []

    def one(pid: int) -> ProcessStack:
        command, ppid, rank, local_rank = describe(pid)
        frozen = frozen_reason(pid)
        if cpu is not None:
            cpu[pid] = cpu_seconds(pid)
        watch = fingerprints is not None
        threads, err = dump_one(pid, native, timeout_s, py_spy, nonblocking=bool(frozen), with_locals=watch and not native)
        if watch and threads is not None:
            # native frames are not read on the later looks: the fingerprint comes from a Python-only read
            again = threads if not native else dump_one(pid, False, timeout_s, py_spy, nonblocking=bool(frozen),
                                                         with_locals=True)[0]
            if again is not None:
                fingerprints[pid] = fingerprint(again, pid)
        full.append(render_full_dump(pid, command, rank, threads, err))
        ps = ProcessStack(pid=pid, host=host, rank=rank, local_rank=local_rank, command=command, parent_pid=ppid,
                          frozen=frozen)
        if threads is None:
            ps.error = explain_py_spy_error(pid, err, command) if "no answer" not in err else err
        else:
            for key, value in summarise_threads(threads, pid, max_frames).items():
                setattr(ps, key, value)
        return ps

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(pids)))) as pool:
        procs = []
        for i, ps in enumerate(pool.map(one, pids)):
            procs.append(ps)
            progress(0.1 + 0.8 * (i + 1) / len(pids), f"dumped {i + 1}/{len(pids)} processes")
    return procs, full


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
