"""log_triage — known failure signatures in training / job logs: the first failure, per rank, with evidence.

Reads log files (any size, streamed in bounded memory; .gz too; plain files over 96 MiB are split over
worker processes), directories (recursively), globs or pasted text, and matches every line against the
signature catalog in knowledge/data/log_signatures.toml
(NCCL watchdog timeouts, CUDA OOM, XID, NaN loss, OOM killer, SLURM time limit, ...). It understands
rank prefixes (torchrun `[rank3]:` / `[default3]:`, srun `--label` `3: `, mpirun `[1,3]<stdout>:`) and
per-rank file names (`rank3.log`, torchelastic `attempt_0/3/stderr.log`), and reports, for each
signature, the count, the ranks, the first occurrence and a few evidence lines; then the chronological
first failure: the first *cause* (OOM, XID, exception), not the cascade it set off on the other ranks
(watchdog timeouts, "connection closed by peer", torchrun's ChildFailedError).

By hand (no GPU needed, it only reads files):
    python -m tools.log_triage --paths train.log
    python -m tools.log_triage --paths 'logs/*.err' slurm-1234.out --json
    python -m tools.log_triage --text "$(tail -n 2000 train.log)"
One GPU or one node: the torchrun output (torchrun labels lines `[rankN]:`), or the per-rank files of
`torchrun --log-dir DIR --redirects 3` (`python -m tools.log_triage --paths DIR`; the rank taken from
`attempt_N/<r>/stderr.log` is the local rank, which is the rank on one node).
Under SLURM: the job's output, ideally from `srun --label` so every line carries its rank:
    python -m tools.log_triage --paths slurm-$SLURM_JOB_ID.out /var/log/kern.log
(slurm_job_diagnose finds a job's files itself and calls triage_paths on them).

Library use (stable; slurm_job_diagnose imports it):
    from tools.log_triage import triage_paths, triage_text
    result = triage_paths(["slurm-1234.out", "logs/"])     # -> LogTriageResult (same as the tool's)
    result = triage_text(pasted_log)
Both raise ToolFailure for unusable input (no such path, a binary file named explicitly).
"""

import bisect
import glob
import itertools
import os
import re
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, model_validator

from tools.harness import (
    Field,
    Params,
    Progress,
    Result,
    ToolFailure,
    ToolSpec,
    load_data,
    main,
)

CHUNK_BYTES = 4 << 20          # read size; memory stays a small multiple of this whatever the log size
MAX_LINE_CHARS = 400           # evidence lines are cut to this
MAX_RANKS_TRACKED = 100_000    # per signature
BINARY_EXTENSIONS = {".pt", ".pth", ".bin", ".safetensors", ".pkl", ".pickle", ".npy", ".npz",
                           ".so", ".png", ".jpg", ".zip", ".tar", ".whl"}

# Rank labels at the start of a line: torchrun `[rank3]:` and `[default3]:`, srun --label `3: `,
# mpirun --tag-output `[1,3]<stdout>:`.
_LINE_RANK = re.compile(r"^[ \t]*(?:\[(?:rank|default)(\d+)\]:|(\d{1,6}): |\[\d+,(\d+)\]<std(?:out|err)>:)", re.MULTILINE)
_LINE_RANK_NO_SRUN = re.compile(r"^[ \t]*(?:\[(?:rank|default)(\d+)\]:|(?!)(\d)|\[\d+,(\d+)\]<std(?:out|err)>:)",
                                re.MULTILINE)
_SRUN_LABEL = re.compile(r"^[ \t]*\d{1,6}: ", re.MULTILINE)
# Rank named inside a message when the line has no label: `[Rank 3]`, `[PG ID 0 PG GUID 0(default_pg) Rank 3]`.
_MSG_RANK = re.compile(r"\[(?:PG [^\]\n]*?)?Rank (\d+)\]")
# Rank in a file path: rank3.log, rank_3, log-rank-3.txt, torchelastic .../attempt_0/3/stderr.log
_PATH_RANK = (re.compile(r"rank[_-]?(\d+)", re.IGNORECASE), re.compile(r"attempt_\d+/(\d+)/std(?:out|err)\.log$"))

_MONTHS = {m: i for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)}
_TS_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T _](\d{2}):(\d{2}):(\d{2}(?:[.,]\d+)?)")
_TS_GLOG = re.compile(r"\b[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)")
_TS_SYSLOG = re.compile(r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2})")

SILENT_DEATHS = (-9, -11, -7, 137, 139, 135)  # exit codes of SIGKILL, SIGSEGV, SIGBUS (as -N or 128+N)
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_SIGNAL_HINTS = {9: "killed, often by the OOM killer or the scheduler", 6: "aborted (a C++ exception or assert)",
                 11: "segfault in native code", 7: "bus error, often /dev/shm exhausted",
                 15: "terminated, usually by the launcher after another rank failed"}


# ---------------------------------------------------------------------------------------------------
# Signature catalog

@dataclass(frozen=True)
class Signature:
    id: str
    name: str
    category: str
    severity: str
    role: str
    keywords: tuple[str, ...]
    regex: re.Pattern
    fallback: bool
    weak: bool
    meaning: str
    next: tuple[str, ...]
    example: str
    order: int


def load_signatures() -> list[Signature]:
    """The catalog, compiled. A malformed entry is a packaging bug: say which one."""
    data = load_data("log_signatures")
    sigs = []
    for order, raw in enumerate(data.get("signature", [])):
        try:
            flags = re.MULTILINE | (re.IGNORECASE if raw.get("ignore_case") else 0)
            sigs.append(Signature(
                id=raw["id"], name=raw["name"], category=raw["category"], severity=raw["severity"],
                role=raw["role"], keywords=tuple(raw["keywords"]), regex=re.compile(raw["pattern"], flags),
                fallback=bool(raw.get("fallback", False)), weak=bool(raw.get("weak", raw.get("fallback", False))),
                meaning=raw["meaning"], next=tuple(raw["next"]),
                example=raw.get("example", ""), order=order))
        except (KeyError, re.error) as exc:
            raise ToolFailure(f"log_signatures.toml entry {raw.get('id', order)!r} is malformed ({exc}); "
                              "fix the data file") from None
    return sigs


def xid_meaning(code: int) -> str | None:
    return load_data("log_signatures").get("xid", {}).get(str(code))


# ---------------------------------------------------------------------------------------------------
# Reading logs: paths, streaming, rank labels

class NotText(Exception):
    """The file is not a text log (binary content)."""


def resolve_paths(paths: list[str], max_files: int) -> tuple[list[Path], list[str]]:
    """Files named by paths (files, directories searched recursively, globs), in a stable order.

    Returns (files, skipped notes). Raises ToolFailure when a path matches nothing.
    """
    files: list[Path] = []
    skipped: list[str] = []
    for raw in paths:
        path = os.path.expanduser(raw)
        if any(c in path for c in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise ToolFailure(f"the glob {raw!r} matches no file; check the pattern and quote it so the "
                                  "shell does not expand it")
            candidates = [Path(m) for m in matches]
        elif os.path.isdir(path):
            candidates = sorted(p for p in Path(path).rglob("*")
                                if not any(part.startswith(".") for part in p.relative_to(path).parts))
        elif os.path.exists(path):
            candidates = [Path(path)]
        else:
            raise ToolFailure(f"no such file or directory: {raw!r}; give a log file, a directory of logs, "
                              "or a glob such as 'logs/*.out'")
        for cand in candidates:
            if not cand.is_file():
                continue
            if cand.suffix.lower() in BINARY_EXTENSIONS:
                skipped.append(f"{cand} (not a log: {cand.suffix} file)")
            elif cand not in files:
                files.append(cand)
    if not files:
        raise ToolFailure(f"no files to read in {', '.join(map(repr, paths))}"
                          + (f" ({'; '.join(skipped[:3])})" if skipped else "") + ": give log files or a directory of them")
    if len(files) > max_files:
        skipped.append(f"{len(files) - max_files} more files not read (max_files={max_files})")
        files = files[:max_files]
    return files, skipped


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    if head.count(0) > len(head) // 100:
        return True
    text = head.decode("utf-8", errors="replace")
    return text.count("\ufffd") > len(text) // 10


def _raw_chunks(path: Path, chunk_bytes: int, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The file's bytes in pieces; gzip (also multi-member or truncated) is decompressed on the way.
    start/end: a byte range of a plain file (parallel scans)."""
    with open(path, "rb") as raw:
        if start or end is not None:
            raw.seek(start)
            left = (end if end is not None else os.path.getsize(path)) - start
            while left > 0:
                piece = raw.read(min(chunk_bytes, left))
                if not piece:
                    return
                left -= len(piece)
                yield piece
            return
        first = raw.read(chunk_bytes)
        if first[:2] != b"\x1f\x8b":
            while first:
                yield first
                first = raw.read(chunk_bytes)
            return
        unzip = zlib.decompressobj(wbits=47)
        data = first
        while data:
            try:
                out = unzip.decompress(data, chunk_bytes)
                while True:
                    if out:
                        yield out
                    if not unzip.unconsumed_tail:
                        break
                    out = unzip.decompress(unzip.unconsumed_tail, chunk_bytes)
            except zlib.error as exc:
                raise NotText(f"cannot decompress ({exc})") from None
            if unzip.eof and unzip.unused_data:  # another gzip member follows
                rest, unzip = unzip.unused_data, zlib.decompressobj(wbits=47)
                data = rest
                continue
            data = raw.read(chunk_bytes)


def iter_text_blocks(path: Path, chunk_bytes: int = CHUNK_BYTES, start: int = 0,
                     end: int | None = None) -> Iterator[str]:
    """The file's text in blocks that end at line boundaries (one huge line is cut at ~2 chunks).

    Memory is bounded by a few chunks whatever the file size. gzip files are read through (a truncated
    one up to where it ends). Raises NotText for binary content, OSError when the file cannot be read.
    start/end: only that byte range of a plain file (the binary check is then the caller's).
    """
    buf, checked = b"", bool(start)
    for piece in _raw_chunks(path, chunk_bytes, start, end):
        buf += piece
        if not checked:
            if len(buf) < 65536 and len(piece) == chunk_bytes:
                continue
            if _looks_binary(buf[:65536]):
                raise NotText("binary content (NUL bytes or undecodable), not a text log")
            checked = True
        cut = buf.rfind(b"\n")
        if cut < 0:
            if len(buf) < 2 * chunk_bytes:
                continue
            cut = len(buf) - 1
        yield buf[:cut + 1].decode("utf-8", errors="replace")
        buf = buf[cut + 1:]
    if buf:
        if not checked and _looks_binary(buf[:65536]):
            raise NotText("binary content (NUL bytes or undecodable), not a text log")
        yield buf.decode("utf-8", errors="replace")


def iter_text_chunks_of_string(text: str, chunk_chars: int = CHUNK_BYTES) -> Iterator[str]:
    """Pasted text in the same line-aligned blocks as iter_text_blocks."""
    start = 0
    while start < len(text):
        end = min(len(text), start + chunk_chars)
        if end < len(text):
            nl = text.rfind("\n", start, end)
            end = nl + 1 if nl >= start else end
        yield text[start:end]
        start = end


def rank_of_path(path: str) -> int | None:
    for rx in _PATH_RANK:
        m = rx.search(path)
        if m:
            return int(m.group(1))
    return None


def srun_labelled(block: str) -> bool:
    """Whether `N: ` at line starts are srun --label task ids (most lines have one), not step counters."""
    return len(_SRUN_LABEL.findall(block)) * 3 >= block.count("\n") + 1


def line_rank(line: str, srun: bool = True) -> int | None:
    """Rank from the line's label, else from a `[Rank N]` inside the message."""
    m = (_LINE_RANK if srun else _LINE_RANK_NO_SRUN).match(line)
    if m:
        return int(next(g for g in m.groups() if g is not None))
    m = _MSG_RANK.search(line)
    return int(m.group(1)) if m else None


def ranks_in_block(block: str, srun: bool = True) -> set[int]:
    """Every rank label at a line start in this block (C-speed findall, not a Python loop per line)."""
    return {int(a or b or c) for a, b, c in set((_LINE_RANK if srun else _LINE_RANK_NO_SRUN).findall(block))}


def timestamp_key(line: str) -> tuple | None:
    """(month, day, seconds) from an ISO, glog ([E1206 18:44:12.7]) or syslog time stamp; year ignored."""
    head = line[:120]
    m = _TS_ISO.search(head)
    if m:
        mo, d, h, mi, s = int(m[2]), int(m[3]), int(m[4]), int(m[5]), float(m[6].replace(",", "."))
    else:
        m = _TS_GLOG.search(head)
        if m:
            mo, d, h, mi, s = int(m[1]), int(m[2]), int(m[3]), int(m[4]), float(m[5])
        else:
            m = _TS_SYSLOG.search(head)
            if not m:
                return None
            mo, d, h, mi, s = _MONTHS[m[1].lower()], int(m[2]), int(m[3]), int(m[4]), float(m[5])
    return (mo, d, h * 3600 + mi * 60 + s)


def timestamp_near(block: str, line_start: int, max_lines: int = 30) -> tuple | None:
    """Time stamp of the line at line_start, else of the closest earlier line in the block that has one
    (a traceback's last line has none; the log line that opened it usually does)."""
    end = block.find("\n", line_start)
    end = len(block) if end < 0 else end
    for _ in range(max_lines):
        ts = timestamp_key(block[line_start:end])
        if ts is not None or line_start == 0:
            return ts
        end = line_start - 1
        line_start = block.rfind("\n", 0, end) + 1
    return None


def format_ranks(ranks) -> str:
    """[0,1,2,3,5,7,8] -> '0-3,5,7-8'."""
    out, run = [], []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


# ---------------------------------------------------------------------------------------------------
# Scanning

@dataclass
class Hit:
    file: str
    line_no: int
    rank: int | None
    text: str
    details: dict
    role: str
    order: int            # global scan order, for ties and logs without time stamps
    ts: tuple | None = None


@dataclass
class Tally:
    sig: Signature
    count: int = 0
    first: Hit | None = None
    first_cause: Hit | None = None
    evidence: list[Hit] = field(default_factory=list)
    ranks: set = field(default_factory=set)
    extra: dict = field(default_factory=dict)   # per-signature aggregates (watchdog per rank, loss scale)


@dataclass
class ScanState:
    sigs: list[Signature]
    evidence_lines: int
    gates: tuple[str, ...] = ()
    tallies: dict = field(default_factory=dict)
    ranks_seen: set = field(default_factory=set)
    rank_first: dict = field(default_factory=dict)   # rank -> signature id of its first error line
    rank_last_ts: dict = field(default_factory=dict)  # rank -> time stamp of its last labelled line
    lines: int = 0
    bytes: int = 0
    hits: int = 0


_LABELS = re.compile(r"^(\[(?:rank|default)\d+\]:|\d{1,6}: |\[\d+,\d+\]<std(?:out|err)>:)", re.MULTILINE)
_LABELS_NO_SRUN = re.compile(r"^(\[(?:rank|default)\d+\]:|\[\d+,\d+\]<std(?:out|err)>:)", re.MULTILINE)


def _track_ranks(block: str, srun: bool, state: ScanState) -> None:
    """Ranks labelled in this block, and the time stamp of each rank's last line (for ranks that go quiet).
    C-speed: one findall for the distinct labels, then one rfind per label."""
    labels = set((_LABELS if srun else _LABELS_NO_SRUN).findall(block))
    for label in labels:
        rank = line_rank(label, srun)
        if rank is None:
            continue
        state.ranks_seen.add(rank)
        if len(labels) > 64:  # a big job: keep the rank set, skip the per-rank timing
            continue
        pos = block.rfind("\n" + label) + 1  # 0 when its only line starts the block
        ts = timestamp_near(block, pos, max_lines=3)
        if ts is not None and ts >= state.rank_last_ts.get(rank, ts):
            state.rank_last_ts[rank] = ts


def _new_state(evidence_lines: int) -> ScanState:
    sigs = load_signatures()
    return ScanState(sigs, evidence_lines, gates_for(sigs))


def _after_lines(block: str, end: int, n: int) -> list[str]:
    return block[end:].split("\n", n + 1)[1:n + 1]


# Short strings that failure lines contain and ordinary log lines rarely do. A block is searched for
# these first (each search is a full pass, ~1 ms per 4 MiB); only the lines holding one are matched
# against the signatures. A keyword that contains no gate is its own gate.
GATES = ("error", "fail", "warn", "timed out", "timeout", "watchdog", "nan", "kill", "oom", "out of memory",
         "signal", "assert", "overflow", "cancelled", "due to", "xid", "137", "mismatch", "closed by", "reset by",
         "invalid", "duplicate", "illegal", "unavailable", "_status_", "no cuda", "no device", "fallen off",
         "is lost", "device handle", "minimum", "segmentation", "sigsegv", "terminate called", "already in use",
         "no space", "quota", "stale", "too many open", "read-only", "dataloader worker", "unexpectedly",
         "undefined symbol", "too old", "insufficient", "kernel image", "not compiled", "built in",
         "exception", "got completion", "async event", "call to connect", "socketstartconnect", "process down",
         "doesn't match", "finished reduction", "bad_alloc", "allocate memory", "waiting for clients")


def gates_for(sigs: list[Signature]) -> tuple[str, ...]:
    gates = set()
    for sig in sigs:
        for kw in sig.keywords:
            gates.add(next((g for g in GATES if g in kw), kw))
    return tuple(sorted(gates))


def _suspect_lines(block: str, low: str, gates: tuple[str, ...]) -> list[int]:
    """Start offsets of the lines that hold a gate string, in order."""
    starts = set()
    for gate in gates:
        i = low.find(gate)
        while i >= 0:
            starts.add(low.rfind("\n", 0, i) + 1)
            nl = low.find("\n", i)
            if nl < 0:
                break
            i = low.find(gate, nl)
    return sorted(starts)


def _scan_block(block: str, base_line: int, label: str, file_rank: int | None, state: ScanState,
                srun: bool = True) -> int:
    """Match one block; returns the number of lines it holds. srun: honour `N: ` labels (srun --label)."""
    nlines = block.count("\n") + (0 if block.endswith("\n") else 1)
    if len(state.ranks_seen) < MAX_RANKS_TRACKED:
        _track_ranks(block, srun, state)
    starts = _suspect_lines(block, block.lower(), state.gates)
    if not starts:
        return nlines
    ends = [block.find("\n", st) for st in starts]
    lines = [block[st:en if en >= 0 else len(block)].rstrip("\r") for st, en in zip(starts, ends)]
    suspect = "\n".join(lines)
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    low = suspect.lower()
    by_line: dict[int, list] = {}
    for sig in state.sigs:
        if any(k in low for k in sig.keywords):
            for m in sig.regex.finditer(suspect):
                by_line.setdefault(bisect.bisect_right(offsets, m.start()) - 1, []).append((sig, m))
    pos, line_no = 0, base_line
    for idx in sorted(by_line):
        line_no += block.count("\n", pos, starts[idx])
        pos = starts[idx]
        group = sorted(by_line[idx], key=lambda sm: sm[0].order)
        specific = [(sig, m) for sig, m in group if not sig.fallback]
        chosen, seen_ids = [], set()
        for sig, m in (specific or group):
            if sig.id not in seen_ids:
                seen_ids.add(sig.id)
                chosen.append((sig, m))
        rank = line_rank(lines[idx], srun)
        if rank is None:
            rank = file_rank
        line_end = ends[idx] if ends[idx] >= 0 else len(block)
        for sig, m in chosen:
            _record(state, sig, m, lines[idx], line_no, label, rank, block, starts[idx], line_end)
    return nlines


def _record(state: ScanState, sig: Signature, m: re.Match, line: str, line_no: int, label: str,
            rank: int | None, block: str, line_start: int, line_end: int) -> None:
    details = {k: v for k, v in m.groupdict().items() if v is not None}
    tally = state.tallies.get(sig.id) or state.tallies.setdefault(sig.id, Tally(sig))
    role = sig.role
    post = _POST.get(sig.id)
    if post:
        role = post(details, tally.extra, rank, line, lambda n: _after_lines(block, line_end, n)) or role
        override = details.pop("rank_override", None)
        rank = override if rank is None and override is not None else rank
    state.hits += 1
    if rank is not None and sig.severity == "error" and len(state.rank_first) < MAX_RANKS_TRACKED:
        state.rank_first.setdefault(rank, sig.id)
    hit = Hit(label, line_no, rank, line[:MAX_LINE_CHARS], details, role, state.hits)
    tally.count += 1
    if rank is not None and len(tally.ranks) < MAX_RANKS_TRACKED:
        tally.ranks.add(rank)
    if tally.first is None or (role == "cause" and tally.first_cause is None):
        hit.ts = timestamp_near(block, line_start)
    if tally.first is None:
        tally.first = hit
    if role == "cause" and tally.first_cause is None:
        tally.first_cause = hit
    if len(tally.evidence) < state.evidence_lines and all(e.text != hit.text for e in tally.evidence):
        tally.evidence.append(hit)


# ---------------------------------------------------------------------------------------------------
# Per-signature details: each returns a role override (or None) and may aggregate into `extra`.

_SIZE = re.compile(r"([\d.]+) (B|bytes|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _gib(text: str | None) -> float | None:
    m = _SIZE.search(text or "")
    return float(m[1]) * _UNITS[m[2]] / (1 << 30) if m else None


_OOM_NEW = re.compile(r"total capacity of (?P<total>[\d.]+ \w+) of which (?P<free>[\d.]+ \w+) is free")
_OOM_UNALLOC = re.compile(r"(?P<unalloc>[\d.]+ \w+) is reserved by PyTorch but unallocated")
_OOM_OLD = re.compile(r"\(GPU (?P<gpu>\d+); (?P<total>[\d.]+ \w+) total capacity; (?P<alloc>[\d.]+ \w+) already "
                      r"allocated; (?P<free>[\d.]+ \w+) free; (?P<reserved>[\d.]+ \w+) reserved in total by PyTorch")


def oom_figures(line: str) -> dict:
    """GiB figures from a CUDA OOM message (both the 2.x and the older format) and a fragmentation call."""
    out: dict = {}
    m = re.search(r"Tried to allocate ([\d.]+ \w+)", line)
    tried = _gib(m[1]) if m else None
    new, old = _OOM_NEW.search(line), _OOM_OLD.search(line)
    if new:
        total, free = _gib(new["total"]), _gib(new["free"])
        unalloc_m = _OOM_UNALLOC.search(line)
        unalloc = _gib(unalloc_m["unalloc"]) if unalloc_m else None
    elif old:
        total, free = _gib(old["total"]), _gib(old["free"])
        unalloc = _gib(old["reserved"]) - _gib(old["alloc"])
    else:
        total = free = unalloc = None
    for key, val in (("tried_gib", tried), ("total_gib", total), ("free_gib", free),
                     ("reserved_unallocated_gib", unalloc)):
        if val is not None:
            out[key] = f"{val:.2f}"
    if tried is not None and unalloc is not None:
        out["fragmentation"] = "yes" if unalloc >= tried else "no"
    return out


def _post_oom(details, extra, rank, line, after):
    details.update(oom_figures(line))


def _post_watchdog(details, extra, rank, line, after):
    if rank is not None and len(extra) < MAX_RANKS_TRACKED:
        extra.setdefault(rank, (int(details["seq"]), details["op"], details.get("numel_in")))


def _post_exitcode(details, extra, rank, line, after):
    code = int(details["exitcode"])
    details["exit_meaning"] = describe_exit(code)
    # SIGKILL / SIGSEGV / SIGBUS often leave no other trace: the exit is the evidence. Exit 1 follows a
    # Python traceback, SIGABRT a C++ exception or the NCCL watchdog, SIGTERM the launcher's cleanup.
    return "cause" if code in SILENT_DEATHS else "cascade"


_ROOT_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*?)\s*$")


def parse_torchrun_summary(lines: list[str]) -> dict:
    """torchrun's ChildFailedError summary -> {'root': {rank, host, exitcode...}, 'failures': [...]}."""
    section, entries, current = None, {"root": [], "failures": []}, None
    for line in lines:
        if line.startswith("Root Cause"):
            section = "root"
        elif line.startswith("Failures:"):
            section = "failures"
        elif line.startswith("=") and entries["root"]:
            break
        elif section and re.match(r"^\[\d+\]:\s*$", line):
            current = {}
            entries[section].append(current)
        elif section and current is not None:
            m = _ROOT_FIELD.match(line)
            if m:
                current[m[1]] = m[2][:200]
    out: dict = {}
    for section in ("root", "failures"):
        for entry in entries[section]:
            rank = re.match(r"(\d+)", entry.get("rank", ""))
            code = re.match(r"(-?\d+)", entry.get("exitcode", ""))
            if rank and code:
                out.setdefault(section, []).append((int(rank[1]), int(code[1]), entry.get("host", "")))
    return out


def _post_root_cause(details, extra, rank, line, after):
    summary = parse_torchrun_summary(after(80) if "Root Cause" not in line else [line] + after(12))
    for entry in summary.get("failures", []):
        extra.setdefault("failures", {})[entry[0]] = entry[1]
    if not summary.get("root"):
        return None
    root_rank, code, host = summary["root"][0]
    details.update(root_rank=str(root_rank), root_exitcode=str(code), exit_meaning=describe_exit(code))
    if host:
        details["root_host"] = host
    extra.setdefault("root", (root_rank, code, host))
    details["rank_override"] = root_rank
    # a rank killed by SIGKILL / SIGSEGV / SIGBUS often leaves no other trace: the summary is the evidence
    return "cause" if code in SILENT_DEATHS else None


def _post_terminate(details, extra, rank, line, after):
    what = next((ln.strip() for ln in after(2) if "what()" in ln), None)
    if what:
        details["what"] = what[:300]


def _post_xid(details, extra, rank, line, after):
    meaning = xid_meaning(int(details["xid"]))
    if meaning:
        details["xid_meaning"] = meaning


def _post_loss_scale(details, extra, rank, line, after):
    scale = details.get("scale") or details.get("scale2")
    if scale:
        value = float(scale)
        extra["min_scale"] = min(extra.get("min_scale", value), value)
        extra["last_scale"] = value


def describe_exit(code: int) -> str:
    if code == 0:
        return "exited normally"
    if code == 1:
        return "exit 1: a Python exception (its traceback is in this rank's output)"
    sig = -code if code < 0 else code - 128 if code > 128 else None
    if sig in _SIGNALS:
        return f"{_SIGNALS[sig]}: {_SIGNAL_HINTS.get(sig, 'killed by a signal')}"
    return f"exit code {code}"


_POST = {
    "cuda_oom": _post_oom,
    "nccl_watchdog_timeout": _post_watchdog,
    "torchrun_worker_failed": _post_exitcode,
    "torchrun_child_failed": _post_root_cause,
    "xid": _post_xid,
    "cpp_terminate": _post_terminate,
    "fp16_overflow_skip": _post_loss_scale,
}



# ---------------------------------------------------------------------------------------------------
# Result

class SignatureHit(BaseModel):
    id: str = Field(description="Signature id from knowledge/data/log_signatures.toml.")
    name: str = Field(description="Short name.")
    category: str = Field(description="cuda, nccl, collective, numerics, slurm, storage, ...")
    severity: str = Field(description="error | warn")
    role: str = Field(description="cause (why a run fails) | cascade (usually a consequence of a failure elsewhere)")
    count: int = Field(0, description="Matching lines.")
    ranks: str = Field("", description="Ranks whose lines match, as ranges ('0-6,8'); empty when lines carry no rank.")
    first: str = Field("", description="First occurrence: 'file:line'.")
    details: dict[str, str] = Field(default_factory=dict, description="Values parsed from the first occurrence "
                                    "(op, seq, sizes in GiB, exit code, XID meaning ...).")
    evidence: list[str] = Field(default_factory=list, description="A few matching lines as 'file:line: text'.")
    meaning: str = Field("", description="What it means and what to check.")
    next: list[str] = Field(default_factory=list, description="Tools and knowledge pages to go to next.")


class FirstFailure(BaseModel):
    signature: str = Field(description="Signature id.")
    name: str = Field(description="Signature name.")
    role: str = Field(description="cause, or cascade when no cause was found in the logs.")
    location: str = Field(description="'file:line'.")
    rank: int | None = Field(None, description="Rank of that line, when known.")
    text: str = Field("", description="The line (cut at 400 characters).")
    details: dict[str, str] = Field(default_factory=dict, description="Values parsed from it.")


class LogInputParams(Params):
    """Where logs come from: paths or pasted text (shared by log_triage and nccl_log_analyze)."""

    paths: list[str] = Field(default_factory=list, max_length=64, description=(
        "Log files, directories (read recursively) or globs ('logs/*.err'); .gz is read through. "
        "Give paths or text, not both."))
    text: str | None = Field(None, max_length=50_000_000, description="Pasted log text instead of paths.")
    max_files: int = Field(2000, ge=1, le=100_000, description="Read at most this many files.")

    @model_validator(mode="after")
    def _one_input(self):
        if bool(self.paths) == bool(self.text):
            raise ValueError("give either paths (files, directories, globs) or text (a pasted log), not both "
                             "and not neither")
        return self


class LogTriageParams(LogInputParams):
    max_signatures: int = Field(12, ge=1, le=100, description="Report at most this many distinct signatures.")
    evidence_lines: int = Field(3, ge=0, le=20, description="Matching lines kept per signature.")


class LogTriageResult(Result):
    first_failure: FirstFailure | None = Field(None, description=(
        "The chronologically first cause (time stamps where lines have them, otherwise order of appearance); "
        "the first cascade line when no cause is present."))
    signatures: list[SignatureHit] = Field(default_factory=list, description="Signatures found, first failure first, "
                                           "then by first occurrence.")
    signatures_omitted: int = Field(0, description="Distinct signatures found but left out (max_signatures).")
    suspect_ranks: list[int] = Field(default_factory=list, description=(
        "Ranks that report no error while others timed out waiting for them in a collective (first 64)."))
    by_rank: dict[str, str] = Field(default_factory=dict, description=(
        "Ranks (as ranges) -> the signature of their first error line, e.g. {'3': 'cuda_oom', '0-2': "
        "'nccl_remote_error'}; at most 20 groups."))
    files_scanned: list[str] = Field(default_factory=list, description="Files read (at most 50 listed).")
    files_skipped: list[str] = Field(default_factory=list, description="Files not read, with the reason.")
    lines_scanned: int = Field(0, description="Lines read.")
    bytes_scanned: int = Field(0, description="Bytes read (uncompressed size for .gz).")
    ranks_seen: str = Field("", description="Ranks that appear in rank labels, as ranges.")
    seconds: float = Field(0.0, description="Wall time of the scan (s).")


# ---------------------------------------------------------------------------------------------------
# Summary: first failure, findings, verdict

def _chronological(hits: list[Hit]) -> list[Hit]:
    """By time stamp when every hit has one (logs from several files), else by order of appearance."""
    if hits and all(h.ts is not None for h in hits):
        return sorted(hits, key=lambda h: (h.ts, h.order))
    return sorted(hits, key=lambda h: h.order)


def _pick_first_failure(tallies: list[Tally]) -> Hit | None:
    errors = [t for t in tallies if t.sig.severity == "error"]
    causes = [t.first_cause for t in errors if t.first_cause]
    if causes:
        ordered = _chronological(causes)
        weak = {t.first_cause.order for t in errors if t.first_cause and t.sig.weak}
        first = ordered[0]
        # a generic line (a bare exception, "terminate called ...") followed within 3 lines by a specific
        # cause: the specific one says what happened
        for later in ordered[1:]:
            if first.order in weak and later.file == first.file and 0 < later.line_no - first.line_no <= 3:
                return later
        return first
    cascades = [t.first for t in errors if t.first]
    return _chronological(cascades)[0] if cascades else None


def _where(hit: Hit) -> str:
    return f"{hit.file}:{hit.line_no}"


def _on_rank(rank: int | None) -> str:
    return f" on rank {rank}" if rank is not None else ""


def ranks_phrase(ranks) -> str:
    ranks = set(ranks)
    return f"rank {format_ranks(ranks)}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _watchdog_findings(per_rank: dict) -> list[str]:
    """Per-rank (SeqNum, op) of NCCL watchdog timeouts: ops that differ at one SeqNum, SeqNums that differ."""
    out = []
    by_seq: dict[int, dict[str, list[int]]] = {}
    for rank, (seq, op, _) in per_rank.items():
        by_seq.setdefault(seq, {}).setdefault(op, []).append(rank)
    for seq, ops in sorted(by_seq.items()):
        if len(ops) > 1:
            parts = "; ".join(f"{ranks_phrase(rs)} in {op}" for op, rs in sorted(ops.items()))
            out.append(f"Collective mismatch at SeqNum {seq}: {parts}. The ranks disagree on which collective "
                       "comes next: a rank-dependent code path; flight_recorder_analyze shows the history.")
    if len(by_seq) > 1:
        parts = "; ".join(f"SeqNum {seq} on {ranks_phrase(r for rs in ops.values() for r in rs)}"
                          for seq, ops in sorted(by_seq.items())[:6])
        out.append(f"Ranks time out at different sequence numbers ({parts}): they wait in different collectives "
                   "or different process groups; the ranks furthest behind are the first suspects.")
    return out


TIMEOUT_SIGNATURES = ("nccl_watchdog_timeout", "gloo_timeout", "nccl_watchdog_work_state")


def _silent_ranks(state: ScanState) -> tuple[list[int], list[str]]:
    """Ranks that timed out waiting vs ranks that said nothing: the silent ones are the suspects.
    Returns (suspect ranks, findings)."""
    tallies = state.tallies
    waiting = set().union(*(tallies[i].ranks for i in TIMEOUT_SIGNATURES if i in tallies))
    if not waiting:
        return [], []
    known = set(state.ranks_seen) | waiting
    summary = tallies["torchrun_child_failed"].extra if "torchrun_child_failed" in tallies else {}
    known |= set(summary.get("failures", {})) | ({summary["root"][0]} if "root" in summary else set())
    if len(known) * 2 > max(known) + 1:  # labels look like ranks 0..N-1: ranks missing in between count too
        known |= set(range(max(known) + 1))
    failed_themselves = set().union(*(t.ranks for t in tallies.values()
                                      if t.first_cause is not None and t.sig.severity == "error"))
    silent = sorted(known - waiting - failed_themselves)
    if not silent:
        return [], []
    verb = "reports" if len(silent) == 1 else "report"
    text = (f"{ranks_phrase(waiting).capitalize()} timed out waiting in a collective; {ranks_phrase(silent)} "
            f"{verb} no error of its own: likely stuck before the collective (data loading, a different code "
            "path) or dead. Dump the stacks of the live ranks (hang_stack_dump) or read the flight recorder.")
    return silent, [text]


QUIET_GAP_S = 60.0


def _clock(ts: tuple) -> str:
    secs = int(ts[2])
    return f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"


def _quiet_ranks(state: ScanState) -> tuple[list[int], list[str]]:
    """A minority of ranks whose output stops well before the others': where a hang usually starts."""
    last = state.rank_last_ts
    if len(last) < 2:
        return [], []
    latest = max(last.values())
    seconds = {r: (latest[0] - ts[0]) * 31 * 86400 + (latest[1] - ts[1]) * 86400 + latest[2] - ts[2]
               for r, ts in last.items()}
    quiet = sorted(r for r, gap in seconds.items() if gap > QUIET_GAP_S)
    if not quiet or len(quiet) * 2 >= len(last):
        return [], []
    first = min(quiet, key=lambda r: last[r])
    text = (f"{ranks_phrase(quiet).capitalize()} stopped writing first: {'its' if len(quiet) == 1 else 'the'} last "
            f"line at {_clock(last[first])}, {seconds[first]:.0f} s before the other ranks' last output "
            f"({_clock(latest)}). The rank that goes quiet first is where a hang usually starts.")
    return quiet, [text]


def _special_findings(tally: Tally) -> list[str]:
    sig_id, first = tally.sig.id, tally.first
    d = first.details
    if sig_id == "cuda_oom":
        if "fragmentation" not in d:
            return []
        verdict = ("fragmentation: the cache holds enough free memory, but not in one block; try "
                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PYTORCH_ALLOC_CONF on torch >= 2.9)"
                   if d["fragmentation"] == "yes" else
                   "not fragmentation: the working set does not fit; cut batch / sequence, shard more, or "
                   "checkpoint activations (memory_estimate)")
        free = f", {d['free_gib']} GiB free of {d['total_gib']} GiB" if "free_gib" in d else ""
        text = (f"CUDA OOM{_on_rank(first.rank)}: asked for {d['tried_gib']} GiB{free}, "
                f"{d['reserved_unallocated_gib']} GiB reserved but unallocated: {verdict}.")
        return [text]
    if sig_id == "nccl_watchdog_timeout":
        head = (f"NCCL watchdog timeout on {len(tally.ranks) or 'some'} rank(s): first {d.get('op')} "
                f"SeqNum {d.get('seq')} after {int(d.get('timeout_ms', 0)) / 1000:g} s timeout")
        return [head + "."] + _watchdog_findings(tally.extra)
    if sig_id == "torchrun_child_failed" and "root" in tally.extra:
        root_rank, code, host = tally.extra["root"]
        others = tally.extra.get("failures", {})
        killed = sorted(r for r, c in others.items() if c in (-15, 143))
        return [f"torchrun's root cause names rank {root_rank}" + (f" on {host}" if host else "")
                + f" ({describe_exit(code)}): the first rank to exit, not always the one that caused the failure"
                + (f"; {ranks_phrase(killed)} {'was' if len(killed) == 1 else 'were'} stopped with SIGTERM (bystanders, "
                   "or the hung rank)" if killed
                   else "") + "."]
    if sig_id == "monitored_barrier_failed":
        return [(f"monitored_barrier names rank(s) {d['culprit'].strip()} as not arriving within "
                f"{int(d['timeout_ms']) / 1000:g} s: those are the stuck or dead ranks.")]
    if sig_id == "rendezvous_timeout" and "joined" in d:
        missing = int(d["expected"]) - int(d["joined"])
        return [(f"Only {d['joined']} of {d['expected']} processes reached the store in {d['waited_s']} s: {missing} "
                "never started, crashed before init, or cannot reach MASTER_ADDR:MASTER_PORT.")]
    if sig_id == "nccl_duplicate_gpu":
        return [(f"Ranks {d['rank_a']} and {d['rank_b']} both use the GPU at bus id {d['device']}: set the device from "
                "LOCAL_RANK (torch.cuda.set_device) or give each task its own CUDA_VISIBLE_DEVICES.")]
    if sig_id == "xid":
        return [f"XID {d['xid']} on GPU at PCI {d['pci']}: {d.get('xid_meaning', 'see the XID table')}."]
    if sig_id == "fp16_overflow_skip" and "min_scale" in tally.extra:
        return [f"{tally.count} overflow-skipped steps; the loss scale fell to {tally.extra['min_scale']:g}"
                + (" (very low: the run is diverging)" if tally.extra["min_scale"] < 1 else "") + "."]
    return []


def _summarise(state: ScanState, scanned: list[str], skipped: list[str], max_signatures: int,
               seconds: float) -> LogTriageResult:
    tallies = list(state.tallies.values())
    first = _pick_first_failure(tallies)
    first_tally = state.tallies[next(t.sig.id for t in tallies if first in (t.first, t.first_cause))] if first else None
    ordered = sorted(tallies, key=lambda t: (t is not first_tally, t.sig.severity != "error", t.first.order))
    shown = ordered[:max_signatures]
    findings: list[str] = []
    if first:
        sig = first_tally.sig
        findings.append(f"First failure: {sig.name}{_on_rank(first.rank)} at {_where(first)}: {first.text[:240]}")
        if first.role == "cascade":
            findings.append("No root cause line in these logs, only consequences: add the logs of every rank "
                            "(and the kernel log for XIDs / OOM kills) or dump stacks of a live job.")
        findings.append(sig.meaning)
    for tally in shown:
        findings.extend(_special_findings(tally))
    suspects, silent_findings = _silent_ranks(state)
    findings.extend(silent_findings)
    quiet, quiet_findings = _quiet_ranks(state)
    findings.extend(quiet_findings)
    suspects = sorted(set(suspects) | set(quiet))
    by_rank = _by_rank(state)
    if len(state.rank_first) > 1 and len(by_rank) > 1:
        names = {t.sig.id: t.sig.name for t in tallies}
        findings.append("By rank, first error: " + "; ".join(
            f"{ranks_phrase(_parse_ranges(r))}: {names[sig]}" for r, sig in list(by_rank.items())[:6]) + ".")
    for tally in shown:
        if tally is first_tally:
            continue
        ranks = f" on {ranks_phrase(tally.ranks)}" if tally.ranks else ""
        findings.append(f"{tally.sig.name}: {tally.count} line(s){ranks}, first at {_where(tally.first)}.")
    mib = state.bytes / (1 << 20)
    findings.append(f"Read {len(scanned)} file(s), {mib:.1f} MiB, {state.lines} lines in {seconds:.1f} s.")
    if not tallies:
        findings.insert(0, "The log is empty." if state.lines == 0 else
                        f"No known failure signature in {state.lines} lines. If the job hangs without an error, "
                        "dump the stacks of the live ranks (hang_stack_dump).")
    next_steps: list[str] = []
    for tally in ([first_tally] if first_tally else []) + shown:
        for step in tally.sig.next:
            if step not in next_steps:
                next_steps.append(step)
    if not tallies:
        next_steps = ["hang_stack_dump", "knowledge://debugging/logs.md"]
    severities = {t.sig.severity for t in tallies}
    verdict = "fail" if "error" in severities else "warn" if severities or quiet else (
        "info" if state.lines == 0 else "ok")
    return LogTriageResult(
        verdict=verdict, findings=findings, next=next_steps[:6],
        first_failure=FirstFailure(signature=first_tally.sig.id, name=first_tally.sig.name, role=first.role,
                                   location=_where(first), rank=first.rank, text=first.text,
                                   details={k: str(v) for k, v in first.details.items()}) if first else None,
        signatures=[_hit_model(t) for t in shown], signatures_omitted=len(ordered) - len(shown),
        files_scanned=scanned[:50], files_skipped=skipped[:50], lines_scanned=state.lines,
        bytes_scanned=state.bytes, ranks_seen=format_ranks(state.ranks_seen), seconds=round(seconds, 3),
        by_rank=by_rank, suspect_ranks=suspects[:64])


def _by_rank(state: ScanState) -> dict[str, str]:
    """Group ranks by the signature of their first error line; groups in order of their lowest rank."""
    groups: dict[str, list[int]] = {}
    for rank, sig_id in state.rank_first.items():
        groups.setdefault(sig_id, []).append(rank)
    ordered = sorted(groups.items(), key=lambda kv: min(kv[1]))[:20]
    return {format_ranks(ranks): sig_id for sig_id, ranks in ordered}


def _parse_ranges(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _hit_model(t: Tally) -> SignatureHit:
    return SignatureHit(
        id=t.sig.id, name=t.sig.name, category=t.sig.category, severity=t.sig.severity, role=t.sig.role,
        count=t.count, ranks=format_ranks(t.ranks), first=_where(t.first),
        details={k: str(v) for k, v in t.first.details.items()},
        evidence=[f"{_where(e)}: {e.text}" for e in t.evidence], meaning=t.sig.meaning, next=list(t.sig.next))


# ---------------------------------------------------------------------------------------------------
# Entry points

PARALLEL_MIN_BYTES = 96 << 20   # plain files at least this large are split across worker processes


def _scan_range(path: str, start: int, end: int | None, label: str, file_rank: int | None, srun: bool,
                evidence_lines: int) -> ScanState:
    """Scan one byte range of a file (all of it when end is None) into a fresh state; runs in a worker
    process when a big file is split."""
    state = _new_state(evidence_lines)
    line_no = 1
    for block in iter_text_blocks(Path(path), start=start, end=end):
        state.bytes += len(block)
        line_no += _scan_block(block, line_no, label, file_rank, state, srun)
    state.lines = line_no - 1
    return state


def _line_ranges(path: Path, parts: int) -> list[tuple[int, int]]:
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, parts):
            f.seek(k * size // parts)
            f.readline()  # move to the next line start
            cuts.append(f.tell())
    cuts.append(size)
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _scan_file(path: Path, label: str, file_rank: int | None, srun: bool, evidence_lines: int,
               workers: int | None) -> list[ScanState]:
    """The file's scan, split over worker processes when it is big, plain text and CPUs are free."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if workers is None:
        workers = 1 if gz or size < PARALLEL_MIN_BYTES else min(os.cpu_count() or 1, 8, size // (48 << 20))
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and not os.path.exists(main_file):  # `python - <script`: spawned workers could not start
        workers = 1
    if workers <= 1 or gz:
        return [_scan_range(str(path), 0, None, label, file_rank, srun, evidence_lines)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ranges = _line_ranges(path, workers)
    try:
        with ProcessPoolExecutor(len(ranges), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_scan_range, str(path), a, b, label, file_rank, srun, evidence_lines)
                       for a, b in ranges]
            return [f.result() for f in futures]
    except (BrokenProcessPool, PermissionError, NotImplementedError):  # no processes here: one pass then
        return [_scan_range(str(path), 0, None, label, file_rank, srun, evidence_lines)]


def _merge(into: ScanState, part: ScanState, line_offset: int) -> None:
    """Fold a later part of the same scan into `into`: its hits come after everything already there."""
    order_offset = into.hits
    for tally in part.tallies.values():
        for hit in {id(h): h for h in (tally.first, tally.first_cause, *tally.evidence) if h}.values():
            hit.line_no += line_offset
            hit.order += order_offset
    into.hits += part.hits
    into.lines += part.lines
    into.bytes += part.bytes
    if len(into.ranks_seen) < MAX_RANKS_TRACKED:
        into.ranks_seen |= part.ranks_seen
    for rank, ts in part.rank_last_ts.items():
        into.rank_last_ts[rank] = max(ts, into.rank_last_ts.get(rank, ts))
    for rank, sig_id in part.rank_first.items():
        into.rank_first.setdefault(rank, sig_id)
    for sig_id, t in part.tallies.items():
        cur = into.tallies.get(sig_id)
        if cur is None:
            into.tallies[sig_id] = t
            continue
        cur.count += t.count
        cur.ranks |= t.ranks
        cur.first = cur.first or t.first
        cur.first_cause = cur.first_cause or t.first_cause
        room = into.evidence_lines - len(cur.evidence)
        cur.evidence += [e for e in t.evidence if all(e.text != x.text for x in cur.evidence)][:max(0, room)]
        for key, value in t.extra.items():
            if key == "min_scale":
                cur.extra[key] = min(cur.extra.get(key, value), value)
            elif key == "last_scale":
                cur.extra[key] = value
            elif isinstance(value, dict):
                for k, v in value.items():
                    cur.extra.setdefault(key, {}).setdefault(k, v)
            else:
                cur.extra.setdefault(key, value)


def _head(path: Path) -> str:
    """The first MiB as text, for the binary check and the label conventions of the file."""
    head = next(iter(_raw_chunks(path, 1 << 20)), b"")
    if _looks_binary(head[:65536]):
        raise NotText("binary content (NUL bytes or undecodable), not a text log")
    return head.decode("utf-8", errors="replace")


def triage_paths(paths: list[str], *, max_files: int = 2000, max_signatures: int = 12, evidence_lines: int = 3,
                 progress: Progress | None = None, workers: int | None = None) -> LogTriageResult:
    """Triage log files / directories / globs. Stable API (slurm_job_diagnose uses it).

    workers: processes per big file (None: automatic, plain files over 96 MiB use up to 8 CPUs; 1: never split).
    """
    files, skipped = resolve_paths([str(p) for p in paths], max_files)
    state = _new_state(evidence_lines)
    t0 = time.monotonic()
    scanned = []
    for i, path in enumerate(files):
        if progress:
            progress(i / max(1, len(files)), f"reading {path}")
        label, file_rank = str(path), rank_of_path(str(path))
        try:
            head = _head(path)
            srun = srun_labelled(head)
            if file_rank is not None and ranks_in_block(head, srun):
                file_rank = None  # a multi-rank log whose name happens to say "rank3"
            parts = _scan_file(path, label, file_rank, srun, evidence_lines, workers)
        except NotText as exc:
            if len(paths) == 1 and len(files) == 1:
                raise ToolFailure(f"{path}: {exc}. log_triage reads text logs (plain or .gz); for flight-recorder "
                                  "dumps use flight_recorder_analyze") from None
            skipped.append(f"{path} ({exc})")
            continue
        except OSError as exc:
            skipped.append(f"{path} (cannot read: {exc.strerror or exc})")
            continue
        offset = 0
        for part in parts:
            _merge(state, part, offset)
            offset += part.lines
        scanned.append(label)
    if not scanned and skipped:
        raise ToolFailure("no readable text log among the paths given: " + "; ".join(skipped[:5]))
    return _summarise(state, scanned, skipped, max_signatures, time.monotonic() - t0)


def triage_text(text: str, *, max_signatures: int = 12, evidence_lines: int = 3) -> LogTriageResult:
    """Triage pasted log text. Stable API."""
    if "\x00" in text[:65536] and text[:65536].count("\x00") > len(text[:65536]) // 100:
        raise ToolFailure("the text holds binary data (NUL bytes), not a log; paste the text output of the job")
    state = _new_state(evidence_lines)
    t0 = time.monotonic()
    line_no, srun = 1, srun_labelled(text[:CHUNK_BYTES])
    for block in iter_text_chunks_of_string(text):
        state.bytes += len(block.encode("utf-8", errors="replace"))
        line_no += _scan_block(block, line_no, "<text>", None, state, srun)
    state.lines = line_no - 1
    return _summarise(state, ["<text>"], [], max_signatures, time.monotonic() - t0)


def run(params: LogTriageParams, progress: Progress) -> LogTriageResult:
    if params.text:
        return triage_text(params.text, max_signatures=params.max_signatures, evidence_lines=params.evidence_lines)
    return triage_paths(params.paths, max_files=params.max_files, max_signatures=params.max_signatures,
                        evidence_lines=params.evidence_lines, progress=progress)


SPEC = ToolSpec(
    name="log_triage",
    summary="Find known failure signatures in training / job logs and name the first failure, per rank.",
    description=(
        "Use when a run crashed, died or failed and there is output to read (what killed my job, what is the real "
        "cause in this traceback): a torchrun / srun / SLURM output file, per-rank log files, a directory of them, "
        "or pasted text. Matches 70+ known signatures (NCCL watchdog timeouts "
        "with op and SeqNum, NCCL error classes, CUDA OOM with a fragmentation call, illegal memory access, "
        "device-side asserts, XID / ECC, NaN loss, fp16 overflow, OOM killer / exit 137, segfaults, torchrun "
        "ChildFailedError, rendezvous failures, SLURM time limit / node failure, disk full, stale NFS handles, "
        "dataloader deaths, version mismatches) and reports the chronologically first *cause* rather than the "
        "cascade on the other ranks, with per-rank counts and evidence lines. Streams files of any size in "
        "bounded memory (~30 MB/s per core; plain files over 96 MiB are split over up to 8 processes). Not for "
        "NCCL_DEBUG=INFO setup logs (use nccl_log_analyze), for flight-recorder dumps (flight_recorder_analyze) "
        "or for a job that hangs with nothing in its log (hang_stack_dump). Read-only; needs no GPU."),
    Params=LogTriageParams, Result=LogTriageResult, run=run,
    runs="in_process", read_only=True, destructive=False, idempotent=True, open_world=False,
    timeout_s=600, store=True,
)

if __name__ == "__main__":
    main(SPEC)
