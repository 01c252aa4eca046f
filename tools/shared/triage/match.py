"""Matching log text against the signature catalog into a ScanState: per-signature tallies, first hits,
evidence, ranks seen and the last time stamp per rank; big plain files split over worker processes and
the parts merged back in order."""

import bisect
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..actions import worst_action
from ...engine.redact import redact
from .signatures import MAX_RANKS_TRACKED, POST, Signature, gates_for, load_signatures
from ..safe_read import read_head
from ..log_hosts import gpu_identities, host_addresses, host_of_path, line_host, rank_devices
from ..logscan import MAX_MATCH_CHARS, iter_text_blocks, line_ranges, line_rank, timestamp_near

MAX_LINE_CHARS = 400           # evidence lines are cut to this
PARALLEL_MIN_BYTES = 96 << 20   # plain files at least this large are split across worker processes
MAX_TIMED_HITS = 256           # per signature: cause lines kept with their time stamp, to weigh against the crash
# Events judged by when they happened, not by being first: a GPU or a port that failed at the second a rank died.
TIMED_CATEGORIES = ("gpu_hardware", "network", "host_memory")


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
    host: str | None = None   # the host the line says it came from (syslog / NCCL prefix, or the file's name)


@dataclass
class Tally:
    sig: Signature
    count: int = 0
    first: Hit | None = None
    first_cause: Hit | None = None
    evidence: list[Hit] = field(default_factory=list)
    ranks: set = field(default_factory=set)
    extra: dict = field(default_factory=dict)   # per-signature aggregates (watchdog per rank, loss scale)
    timed: list[Hit] = field(default_factory=list)  # cause lines with time stamps (TIMED_CATEGORIES only)
    hosts: set = field(default_factory=set)         # hosts whose lines match


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
    gpu_ids: dict = field(default_factory=dict)      # (host, PCI bus as printed) -> (GPU UUID, board serial)
    addresses: dict = field(default_factory=dict)    # IPv4 address -> host (from NCCL's own lines)
    rank_devices: dict = field(default_factory=dict)  # rank -> (host, CUDA device, bus id) as the rank said at start
    pyspy_threads: int = 0                            # py-spy dump thread headers: saved stacks, not a log


_PYSPY_THREAD = re.compile(r'^Thread (?:0x[0-9A-Fa-f]+|\d+) \((?:idle|active)[^)]*\)|^\s*"os_thread_id": \d+,$',
                           re.MULTILINE)
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


def _track_identities(block: str, label: str, state: ScanState) -> None:
    """GPU serials per (host, bus) and NCCL's address -> host map: what names a culprit beyond its line."""
    for bus, ident in gpu_identities(block).items():
        if len(state.gpu_ids) < 4096:
            state.gpu_ids[(host_of_path(label), bus)] = ident
    for address, host in host_addresses(block).items():
        if len(state.addresses) < 4096:
            state.addresses.setdefault(address, host)
    for rank, device in rank_devices(block).items():
        if len(state.rank_devices) < 4096:
            state.rank_devices.setdefault(rank, device)


def new_state(evidence_lines: int) -> ScanState:
    sigs = load_signatures()
    return ScanState(sigs, evidence_lines, gates_for(sigs))


def _after_lines(block: str, end: int, n: int) -> list[str]:
    return block[end:].split("\n", n + 1)[1:n + 1]


def _suspect_lines(block: str, low: str, gates: tuple[str, ...]) -> dict[int, int]:
    """Start offset of each line that holds a gate string -> where its first gate string is, in order."""
    starts: dict[int, int] = {}
    for gate in gates:
        i = low.find(gate)
        while i >= 0:
            st = low.rfind("\n", 0, i) + 1
            starts[st] = min(i, starts.get(st, i))
            nl = low.find("\n", i)
            if nl < 0:
                break
            i = low.find(gate, nl)
    return dict(sorted(starts.items()))


def _window(block: str, start: int, end: int, gate_at: int) -> str:
    """The text a line is matched on: all of it, or for a line longer than MAX_MATCH_CHARS the
    MAX_MATCH_CHARS around its first gate string (a bound on what any regex can cost on one line)."""
    if end - start > MAX_MATCH_CHARS:
        start = max(start, gate_at - MAX_MATCH_CHARS // 2)
        end = min(end, start + MAX_MATCH_CHARS)
    return block[start:end].rstrip("\r")


def scan_block(block: str, base_line: int, label: str, file_rank: int | None, state: ScanState,
                srun: bool = True) -> int:
    """Match one block; returns the number of lines it holds. srun: honour `N: ` labels (srun --label)."""
    nlines = block.count("\n") + (0 if block.endswith("\n") else 1)
    if len(state.ranks_seen) < MAX_RANKS_TRACKED:
        _track_ranks(block, srun, state)
    _track_identities(block, label, state)
    if "Thread " in block or "os_thread_id" in block:
        state.pyspy_threads += len(_PYSPY_THREAD.findall(block))
    gate_at = _suspect_lines(block, block.lower(), state.gates)
    if not gate_at:
        return nlines
    starts = list(gate_at)
    ends = [block.find("\n", st) for st in starts]
    lines = [_window(block, st, en if en >= 0 else len(block), gate_at[st]) for st, en in zip(starts, ends)]
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
        rank = line_rank(block[starts[idx]:starts[idx] + 200], srun)  # the label, also when the line was windowed
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
    post = POST.get(sig.id)
    if post:
        role = post(details, tally.extra, rank, line, lambda n: _after_lines(block, line_end, n)) or role
        override = details.pop("rank_override", None)
        rank = override if rank is None and override is not None else rank
    state.hits += 1
    if rank is not None and sig.severity == "error" and len(state.rank_first) < MAX_RANKS_TRACKED:
        state.rank_first.setdefault(rank, sig.id)
    # Secrets leave no reader: the line and what was captured from it are redacted here, once.
    details = {k: redact(v) if isinstance(v, str) else v for k, v in details.items()}
    hit = Hit(label, line_no, rank, redact(line[:MAX_LINE_CHARS]), details, role, state.hits,
              host=line_host(line) or details.get("host") or host_of_path(label))
    tally.count += 1
    if rank is not None and len(tally.ranks) < MAX_RANKS_TRACKED:
        tally.ranks.add(rank)
    if hit.host and len(tally.hosts) < 1024:
        tally.hosts.add(hit.host)
    timed = role == "cause" and sig.category in TIMED_CATEGORIES and len(tally.timed) < MAX_TIMED_HITS
    if timed or tally.first is None or (role == "cause" and tally.first_cause is None):
        hit.ts = timestamp_near(block, line_start)
    if timed:
        tally.timed.append(hit)
    if tally.first is None:
        tally.first = hit
    if role == "cause" and tally.first_cause is None:
        tally.first_cause = hit
    if len(tally.evidence) < state.evidence_lines and all(e.text != hit.text for e in tally.evidence):
        tally.evidence.append(hit)


def _scan_range(path: str, start: int, end: int | None, label: str, file_rank: int | None, srun: bool,
                evidence_lines: int) -> ScanState:
    """Scan one byte range of a file (all of it when end is None) into a fresh state; runs in a worker
    process when a big file is split."""
    state = new_state(evidence_lines)
    line_no = 1
    for block in iter_text_blocks(Path(path), start=start, end=end):
        state.bytes += len(block)
        line_no += scan_block(block, line_no, label, file_rank, state, srun)
    state.lines = line_no - 1
    return state


def scan_file(path: Path, label: str, file_rank: int | None, srun: bool, evidence_lines: int,
              workers: int | None) -> list[ScanState]:
    """The file's scan, split over worker processes when it is big, plain text and CPUs are free."""
    size = path.stat().st_size
    gz = read_head(path, 2) == b"\x1f\x8b"
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

    ranges = line_ranges(path, workers)
    try:
        with ProcessPoolExecutor(len(ranges), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_scan_range, str(path), a, b, label, file_rank, srun, evidence_lines)
                       for a, b in ranges]
            return [f.result() for f in futures]
    except (BrokenProcessPool, PermissionError, NotImplementedError):  # no processes here: one pass then
        return [_scan_range(str(path), 0, None, label, file_rank, srun, evidence_lines)]


def merge(into: ScanState, part: ScanState, line_offset: int) -> None:
    """Fold a later part of the same scan into `into`: its hits come after everything already there."""
    order_offset = into.hits
    for tally in part.tallies.values():
        for hit in {id(h): h for h in (tally.first, tally.first_cause, *tally.evidence, *tally.timed) if h}.values():
            hit.line_no += line_offset
            hit.order += order_offset
    into.hits += part.hits
    into.pyspy_threads += part.pyspy_threads
    into.lines += part.lines
    into.bytes += part.bytes
    if len(into.ranks_seen) < MAX_RANKS_TRACKED:
        into.ranks_seen |= part.ranks_seen
    for rank, ts in part.rank_last_ts.items():
        into.rank_last_ts[rank] = max(ts, into.rank_last_ts.get(rank, ts))
    for rank, sig_id in part.rank_first.items():
        into.rank_first.setdefault(rank, sig_id)
    for key, value in part.gpu_ids.items():
        into.gpu_ids.setdefault(key, value)
    for key, value in part.addresses.items():
        into.addresses.setdefault(key, value)
    for key, value in part.rank_devices.items():
        into.rank_devices.setdefault(key, value)
    for sig_id, t in part.tallies.items():
        cur = into.tallies.get(sig_id)
        if cur is None:
            into.tallies[sig_id] = t
            continue
        cur.count += t.count
        cur.ranks |= t.ranks
        cur.hosts |= t.hosts
        cur.timed += t.timed[:max(0, MAX_TIMED_HITS - len(cur.timed))]
        cur.first = cur.first or t.first
        cur.first_cause = cur.first_cause or t.first_cause
        room = into.evidence_lines - len(cur.evidence)
        cur.evidence += [e for e in t.evidence if all(e.text != x.text for x in cur.evidence)][:max(0, room)]
        _merge_extra(cur.extra, t.extra)


def _merge_extra(into: dict, later: dict) -> None:
    """Per-signature aggregates of a later part: the lowest loss scale, the latest one, first values otherwise."""
    for key, value in later.items():
        if key == "min_scale":
            into[key] = min(into.get(key, value), value)
        elif key == "last_scale":
            into[key] = value
        elif key == "worst_action":
            into[key] = worst_action([into.get(key, "none"), value])
        elif isinstance(key, tuple) and isinstance(value, int):    # Xid occurrences per (bus, code)
            into[key] = into.get(key, 0) + value
        elif isinstance(value, dict):
            for k, v in value.items():
                into.setdefault(key, {}).setdefault(k, v)
        else:
            into.setdefault(key, value)
