"""The one side channel from mleng's own processes on other nodes (ranks, fleet-sweep node processes)
back to the launcher: one writer, one reader, one parse function.

Writer (`emit`): an event is a JSON object written to stdout as lines `@@mleng {json}`. An event
whose line would pass PART_BYTES goes out as numbered parts (base64, keyed), each line under 1 kB:
srun relays a task's output in messages of at most 1 kB and cuts longer lines there, and lines of
several tasks interleave between those pieces (measured on the namespace cluster, SLURM 22.05). Each
line is one os.write of under PIPE_BUF bytes, so processes sharing a pipe (ranks of one node under
torchrun) never mix inside a line.

Reader (`Reader.parse`, the `parse_line` of engine.processes.Supervised): everything on the line is
untrusted. Under `srun --label` the launcher puts the task number in front of every line: that label,
not anything inside the event, says which task (hence which node) wrote it. A line that is not ours
is ordinary output; a line that is ours but malformed, nested too deep, too long, not finite, or
refused by the channel's own check is skipped and counted in `skipped` (reason -> count, with the
task), never raised: one bad line must cost that line, not the reader or the answer.
"""

from __future__ import annotations

import base64
import binascii
import collections
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

PREFIX = "@@mleng "
PART_BYTES = 600            # raw bytes per part: base64 makes ~800 characters, the line stays under 1 kB
MAX_EVENT_BYTES = 8 << 20   # an event larger than this is refused (fleet rows carry a tool's whole result)
MAX_DEPTH = 64              # JSON nesting accepted; honest events nest under 10 deep
MAX_PENDING_EVENTS = 16     # incomplete multi-part events kept per task; the oldest goes when full
MAX_PENDING_BYTES = 32 << 20  # and their bytes, all tasks together
NOTE_EXAMPLES = 5
_LABEL = re.compile(r"\s*(\d{1,7}): ?(.*)", re.S)


class Refused(ValueError):
    """An event the channel's check does not accept; the message says what was wrong."""


@dataclass(frozen=True)
class Event:
    task: int | None     # srun's task number from the line's label (None: unlabelled, one local process)
    data: dict           # the checked event


def encode(event: dict) -> list[bytes]:
    """The lines that carry `event` (one, or numbered parts), prefix and newline included."""
    text = json.dumps(event, default=str, allow_nan=False)
    raw = text.encode()
    if len(raw) <= PART_BYTES:
        return [(PREFIX + text + "\n").encode()]
    key = f"{os.getpid()}-{id(event)}-{len(raw)}"
    count = -(-len(raw) // PART_BYTES)
    return [(PREFIX + json.dumps({"part": key, "i": i, "n": count,
                                  "data": base64.b64encode(raw[i * PART_BYTES:(i + 1) * PART_BYTES]).decode()})
             + "\n").encode() for i in range(count)]


def emit(event: dict, fd: int = 1) -> None:
    """Write one event to the channel (stdout by default). Non-finite floats must already be None:
    NaN is not JSON, and a reader would refuse the whole event."""
    for line in encode(finite(event)):
        try:
            os.write(fd, line)
        except OSError:
            return  # the launcher went away: nothing useful left to do with the event


def finite(value):
    """`value` with every NaN or infinity replaced by None (a broken device can measure NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _finite_float(text: str):
    number = float(text)
    return number if math.isfinite(number) else None   # 1e400 parses as inf: no figure, not infinity


def loads(text: str) -> object:
    """json.loads for untrusted text: NaN/Infinity and overflowing numbers become None; nesting deeper
    than MAX_DEPTH is refused (the C decoder's RecursionError too)."""
    try:
        value = json.loads(text, parse_constant=lambda _: None, parse_float=_finite_float)
    except RecursionError:
        raise Refused(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise Refused(f"not JSON ({exc.__class__.__name__})") from None
    if depth(value) > MAX_DEPTH:
        raise Refused(f"nested deeper than {MAX_DEPTH} levels")
    return value


def depth(value) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            return level
        if isinstance(item, dict):
            stack += [(v, level + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, level + 1) for v in item]
    return deepest


class Reader:
    """Reads one launch's side channel. `check(dict) -> dict` is the channel's own validation (raise
    Refused or ValueError/TypeError for a bad event); `labelled`: lines carry srun's `--label`, and a
    line of ours without one is refused (it cannot be tied to a task)."""

    def __init__(self, check: Callable[[dict], dict], *, labelled: bool = False):
        self.check = check
        self.labelled = labelled
        self.skipped: collections.Counter = collections.Counter()    # (task, reason) -> lines
        self.examples: list[str] = []
        self._parts: dict[int | None, collections.OrderedDict] = collections.defaultdict(collections.OrderedDict)
        self._held = 0   # bytes in unfinished multi-part events

    def parse(self, line: str) -> Event | None:
        """The event on this line, or None (not ours, a part of a longer event, or skipped and counted)."""
        task, text = None, line
        if self.labelled:
            m = _LABEL.fullmatch(line)
            if m:
                task, text = int(m.group(1)), m.group(2)
        at = text.find(PREFIX)
        if at < 0:
            return None
        if self.labelled and task is None:
            return self._skip(None, "no srun task label", line)
        try:
            data = loads(text[at + len(PREFIX):])
            if isinstance(data, dict) and "part" in data:
                data = self._part(task, data)
                if data is None:
                    return None
            if not isinstance(data, dict):
                raise Refused("not a JSON object")
            return Event(task, self.check(data))
        except (ValueError, TypeError, KeyError) as exc:   # Refused, pydantic's ValidationError, bad parts
            return self._skip(task, _reason(exc), line)

    def _part(self, task: int | None, part: dict) -> dict | None:
        """Keep one part; the whole event once its last part is in (parts of one task only)."""
        key, i, n = str(part.get("part"))[:100], part.get("i"), part.get("n")
        if not (type(i) is int and type(n) is int and 0 <= i < n <= MAX_EVENT_BYTES // PART_BYTES):
            raise Refused("part numbers out of range")
        try:
            chunk = base64.b64decode(str(part.get("data", "")), validate=True)
        except (binascii.Error, ValueError):
            raise Refused("part data not base64") from None
        if len(chunk) > PART_BYTES:
            raise Refused(f"part longer than {PART_BYTES} bytes")
        pending = self._parts[task]
        parts = pending.setdefault(key, {})
        self._held += len(chunk) - len(parts.get(i, b""))
        parts[i] = chunk
        while len(pending) > MAX_PENDING_EVENTS or (self._held > MAX_PENDING_BYTES and len(pending) > 1):
            dropped_key, dropped = pending.popitem(last=False)
            self._held -= sum(map(len, dropped.values()))
            self._skip(task, "too many unfinished multi-part events (the oldest was dropped)", dropped_key)
        if len(parts) < n:
            return None
        del pending[key]
        self._held -= sum(map(len, parts.values()))
        if set(parts) != set(range(n)):
            raise Refused("parts do not fit together")
        return loads(b"".join(parts[j] for j in range(n)).decode(errors="replace"))

    def _skip(self, task: int | None, reason: str, line: str) -> None:
        self.skipped[(task, reason)] += 1
        if len(self.examples) < NOTE_EXAMPLES:
            self.examples.append(f"{reason}: {line[:80]!r}")
        return None

    def notes(self, name_of: Callable[[int | None], str] = str) -> list[str]:
        """One sentence per (who, reason): what was skipped and how often."""
        return [f"{count} line(s) from {name_of(task)} skipped: {reason}"
                for (task, reason), count in sorted(self.skipped.items(), key=lambda kv: -kv[1])]


def _reason(exc: Exception) -> str:
    if isinstance(exc, Refused):
        return str(exc)
    errors = getattr(exc, "errors", None)
    if callable(errors):   # pydantic: name the first bad field, not the whole dump
        first = errors()[0] if errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"field {where or '?'}: {first.get('msg', 'invalid')}"[:200]
    return f"{type(exc).__name__}: {exc}"[:200]
