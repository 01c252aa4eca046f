"""Saved `py-spy dump` output read back as processes (private to hang_stack_dump: no SPEC).

Users save one dump per rank (files, a folder per node, or text pasted in a chat). Both of py-spy's forms are
read: the text form ("Process 123: python train.py --local_rank=1", then "Thread 123 (idle): "MainThread"" and
one "    function (file.py:line)" per frame, innermost first) and the `--json` form (a list of threads, each with
its pid and frames). Each dump becomes a ProcessStack, so the grouping is the live path's (stacks.group_stacks).

The rank: "rank3" in the file's path is the global rank; "--local_rank=N" in the command or "local_rank1" in the
path is the local rank, and the host is the folder (or file) named like a host. Global ranks are derived from local
ranks only when every dump has a host and a local rank and every host has as many: host order x ranks per host +
local rank, which is torchrun's numbering with --node-rank in host order (the findings say so).
"""

import json
import re
from pathlib import Path

from .stacks import ProcessStack, summarise_threads
from ..engine.spec import ToolFailure
from ..shared.log_hosts import host_of_path
from ..shared.logscan import MAX_MATCH_CHARS, resolve_paths
from ..shared.safe_read import read_limited

MAX_DUMP_BYTES = 4 << 20
MAX_DUMPS = 1024
_PROCESS = re.compile(r"^Process (\d+): (.*)$")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?::\s*"([^"]*)")?')
_FRAME = re.compile(r"^\s+(\S.*?) \(([^()]*?)(?::(\d+))?\)\s*$")
_LOCAL_IN_TEXT = re.compile(r"--local[_-]rank[= ](\d+)|local[_-]?rank[_=-]?(\d+)", re.IGNORECASE)
_GLOBAL_IN_PATH = re.compile(r"(?<!local_)(?<!local-)(?<!local)rank[_=-]?(\d+)", re.IGNORECASE)


def parse_text(text: str) -> list[tuple[int, str, list[dict]]]:
    """py-spy's text form -> [(pid, command, threads)]; a paste without a Process line is one process (pid 0)."""
    procs: list[tuple[int, str, list[dict]]] = []
    thread: dict | None = None
    for line in text.splitlines()[:200_000]:
        line = line[:MAX_MATCH_CHARS]          # a frame line is short; a megabyte "line" is not one to match
        if m := _PROCESS.match(line.strip()):
            procs.append((int(m[1]), m[2][:300], []))
            thread = None
        elif m := _THREAD.match(line.strip()):
            if not procs:
                procs.append((0, "", []))
            ident = m[1]
            thread = {"thread_name": m[3], "active": m[2].startswith("active"),
                      "os_thread_id": int(ident) if ident.isdigit() else None, "frames": []}
            procs[-1][2].append(thread)
        elif thread is not None and (m := _FRAME.match(line)):
            short = m[2]
            thread["frames"].append({"name": m[1], "short_filename": short, "filename": short,
                                     "line": int(m[3]) if m[3] else None})
    return [p for p in procs if p[2]]


def parse_json(text: str) -> list[tuple[int, str, list[dict]]]:
    """`py-spy dump --json`: a list of threads, each naming its pid."""
    try:
        threads = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not py-spy JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(threads, list) or not all(isinstance(t, dict) for t in threads):
        raise ValueError("py-spy --json output is a list of threads")
    by_pid: dict[int, list[dict]] = {}
    for n, t in enumerate(threads):
        pid, frames = t.get("pid", 0), t.get("frames", [])
        if not (isinstance(pid, int) and 0 <= pid < 1 << 32) or not isinstance(frames, list) \
                or not all(isinstance(f, dict) for f in frames):
            raise ValueError(f"thread {n}: expected 'pid' a whole number and 'frames' a list of objects, as py-spy "
                             "--json writes them")
        by_pid.setdefault(pid, []).append(t)
    return [(pid, "", ts) for pid, ts in by_pid.items()]


def parse_dump(text: str) -> list[tuple[int, str, list[dict]]]:
    return parse_json(text) if text.lstrip().startswith("[") else parse_text(text)


def _where(path: str) -> tuple[str, int | None, int | None]:
    """(host, global rank, local rank) that a dump's path says."""
    p = Path(path)
    glob_m = _GLOBAL_IN_PATH.search(p.name) or _GLOBAL_IN_PATH.search(p.parent.name)
    local_m = _LOCAL_IN_TEXT.search(p.name)
    host = host_of_path(p.name) or host_of_path(p.parent.name) or ""
    local = int(local_m[1] or local_m[2]) if local_m else None
    return host, int(glob_m[1]) if glob_m else None, local


def _process(source: str, pid: int, command: str, threads: list[dict], max_frames: int) -> ProcessStack:
    host, rank, local = _where(source) if source != "<text>" else ("", None, None)
    cmd_local = _LOCAL_IN_TEXT.search(command)
    if cmd_local:
        local = int(cmd_local[1] or cmd_local[2])
    ps = ProcessStack(pid=pid, host=host, rank=rank, local_rank=local, command=command or source)
    for key, value in summarise_threads(threads, pid, max_frames).items():
        setattr(ps, key, value)
    return ps


def _global_from_local(procs: list[ProcessStack]) -> str:
    """Fill in global ranks from host order and local rank, where every dump allows it; the finding says how."""
    if any(p.rank is not None for p in procs) or not procs or any(not p.host or p.local_rank is None for p in procs):
        return ""
    hosts = sorted({p.host for p in procs}, key=lambda h: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", h)])
    per_host = {h: sorted(p.local_rank for p in procs if p.host == h) for h in hosts}
    width = len(per_host[hosts[0]])
    if any(ranks != list(range(width)) for ranks in per_host.values()):
        return ""
    for p in procs:
        p.rank = hosts.index(p.host) * width + p.local_rank
    return (f"Global ranks taken as host order ({', '.join(hosts)}) x {width} + local rank, as torchrun numbers them "
            "with --node-rank in that order.")


def read_saved(paths: list[str], text: str | None, max_frames: int) -> tuple[list[ProcessStack], list[str]]:
    """Every process in the saved dumps, and notes (files skipped, how ranks were derived)."""
    sources: list[tuple[str, str]] = []
    notes: list[str] = []
    if text:
        sources.append(("<text>", text))
    if paths:
        files, skipped = resolve_paths(paths, MAX_DUMPS)
        notes += [f"not read: {s}" for s in skipped[:5]]
        for f in files:
            try:
                sources.append((str(f), read_limited(f, MAX_DUMP_BYTES, "dump_paths").decode("utf-8", "replace")))
            except OSError as e:
                notes.append(f"not read: {f} ({e.strerror or e})")
    procs: list[ProcessStack] = []
    for source, body in sources:
        try:
            parsed = parse_dump(body)
        except ValueError as e:
            notes.append(f"{source}: {e}")
            continue
        procs += [_process(source, pid, cmd, threads, max_frames) for pid, cmd, threads in parsed]
    if not procs:
        raise ToolFailure("no py-spy dump found in " + (", ".join(map(repr, paths)) if paths else "the text")
                          + ": expected `py-spy dump` output (\"Thread 123 (idle): \\\"MainThread\\\"\" then one "
                          "\"    function (file.py:12)\" line per frame) or `py-spy dump --json` output"
                          + (f" ({'; '.join(notes[:3])})" if notes else ""))
    how = _global_from_local(procs)
    return procs, notes + ([how] if how else [])
