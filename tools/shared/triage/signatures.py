"""The failure signature catalog (knowledge/data/log_signatures.toml) compiled, the gate strings that keep
the scan fast, and the per-signature post-processing that reads figures out of a matched line (CUDA OOM
sizes, watchdog SeqNums, torchrun's root-cause summary, XID meanings, loss scales)."""

import re
from dataclasses import dataclass

from ...engine.spec import ToolFailure
from ...engine.data import load_data
from .. import xid
from ..actions import worst_action

MAX_RANKS_TRACKED = 100_000    # per signature

SILENT_DEATHS = (-9, -11, -7, 137, 139, 135)  # exit codes of SIGKILL, SIGSEGV, SIGBUS (as -N or 128+N)
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_SIGNAL_HINTS = {9: "killed, often by the OOM killer or the scheduler", 6: "aborted (a C++ exception or assert)",
                 11: "segfault in native code", 7: "bus error, often /dev/shm exhausted",
                 15: "terminated, usually by the launcher after another rank failed"}


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
    action: str = "none"


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
                example=raw.get("example", ""), order=order, action=raw.get("action", "none")))
        except (KeyError, re.error) as exc:
            raise ToolFailure(f"log_signatures.toml entry {raw.get('id', order)!r} is malformed ({exc}); "
                              "fix the data file") from None
    return sigs


def xid_meaning(code: int) -> str | None:
    return load_data("log_signatures").get("xid", {}).get(str(code))


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


# Numbers start only after a non-number character: retried inside one long run of digits, these were quadratic.
_SIZE = re.compile(r"(?<![\d.])([\d.]+) (B|bytes|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _gib(text: str | None) -> float | None:
    m = _SIZE.search(text or "")
    return float(m[1]) * _UNITS[m[2]] / (1 << 30) if m else None


_OOM_NEW = re.compile(r"total capacity of (?P<total>[\d.]+ \w+) of which (?P<free>[\d.]+ \w+) is free")
_OOM_UNALLOC = re.compile(r"(?<![\d.])(?P<unalloc>[\d.]+ \w+) is reserved by PyTorch but unallocated")
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


_ROOT_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:(.*)$")   # value stripped after: linear


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
                current[m[1]] = m[2].strip()[:200]
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


_WATCHDOG_WORDS = ("watchdog caught", "watchdog thread terminated", "collective operation timeout")


def _post_terminate(details, extra, rank, line, after):
    """A C++ exception that ended the process; the watchdog's own (DistBackendError after a collective timed out)
    is the echo of a rank that did not arrive, not a failure of this one."""
    what = next((ln.strip() for ln in after(2) if "what()" in ln), None)
    if what:
        details["what"] = what[:300]
    if "DistBackendError" in details.get("exception", "") or any(w in (what or "").lower() for w in _WATCHDOG_WORDS):
        details["after"] = "a watchdog timeout: this rank was waiting, not failing"
        return "cascade"
    return None


def _note_action(details, extra, action: str) -> None:
    """The action of this occurrence, and the worst one seen for the signature (read by the result)."""
    details["action"] = action
    extra["worst_action"] = worst_action([extra.get("worst_action", "none"), action])


def _post_xid(details, extra, rank, line, after):
    """Meaning and action from the Xid catalog; Xid 45 naming an earlier Xid is that Xid's consequence."""
    code = int(details["xid"])
    event = xid.XidEvent(bus=xid.short_bus(details.get("pci", "")), code=code, text=line[-160:],
                         previous=int(details["previous"]) if details.get("previous") else None)
    key = (event.bus, code)
    extra[key] = extra.get(key, 0) + 1
    action, meaning = xid.judge(event, repeated=extra[key] > 1)
    details["xid_meaning"] = xid_meaning(code) or meaning
    _note_action(details, extra, action)
    if event.previous is not None:
        details["caused_by"] = f"Xid {event.previous}"
        return "cascade"
    return None


def _post_sxid(details, extra, rank, line, after):
    event = xid.XidEvent(bus=xid.short_bus(details.get("pci", "")), code=int(details["sxid"]), text=line[-160:],
                         switch=int(details["switch"]), fatal=details.get("fatal") == "Fatal")
    action, details["sxid_meaning"] = xid.judge(event)
    _note_action(details, extra, action)


def _post_gpu_lost_multiline(details, extra, rank, line, after):
    """The first of the three lines; the third says what happened to the GPU."""
    rest = " ".join(ln.split("NVRM:", 1)[-1].strip() for ln in after(3) if "NVRM:" in ln)
    details["state"] = "fallen off the bus" if "fallen off the bus" in rest else rest[:160]
    _note_action(details, extra, "drain_node" if "fallen off the bus" in rest else "monitor")


def _post_ib_completion(details, extra, rank, line, after):
    """Status 4 is a local protection error, on GPU memory the GPU Direct RDMA registration (nccl#214, #928)."""
    if details.get("vendor"):
        details["vendor_hex"] = hex(int(details["vendor"]))
    if details.get("status") == "4":
        details["likely"] = "GPU Direct RDMA memory registration (nvidia-peermem / dma-buf), not the fabric"
        _note_action(details, extra, "none")
    elif details.get("status") == "12":
        details["likely"] = "retry exceeded: the peer or a link went away (cable, switch port, flapping link)"
        _note_action(details, extra, "monitor")


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


# Signature id -> post(details, extra, rank, line, after) run on each match: it adds parsed figures to
# `details`, may aggregate into the tally's `extra`, and returns a role override or None. `after(n)` gives
# the n lines that follow the match (torchrun's summary, a C++ what()).
POST = {
    "cuda_oom": _post_oom,
    "nccl_watchdog_timeout": _post_watchdog,
    "torchrun_worker_failed": _post_exitcode,
    "torchrun_child_failed": _post_root_cause,
    "xid": _post_xid,
    "nvswitch_sxid": _post_sxid,
    "gpu_lost_multiline": _post_gpu_lost_multiline,
    "nccl_ib_completion_error": _post_ib_completion,
    "cpp_terminate": _post_terminate,
    "fp16_overflow_skip": _post_loss_scale,
}

