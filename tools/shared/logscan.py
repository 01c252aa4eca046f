"""Reading logs for log_triage and nccl_log_analyze: paths, globs, directories, .gz, bounded-memory blocks,
byte ranges for parallel scans, and the rank / time stamp conventions of torchrun, srun and mpirun lines."""

import glob
import itertools
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import ConfigDict, model_validator

from ..engine.spec import SELF_EVIDENT, Field, Params, Progress, ToolFailure, present
from .safe_read import kind_of, open_regular

# Lines are matched on their first MAX_MATCH_CHARS characters. Real log lines that matter are far
# shorter (an NCCL ring line of 1,000 ranks is ~5,000); a base64 blob or a progress bar of megabytes is
# not a log line to match, and the cap bounds what any regex can cost on one line.
MAX_MATCH_CHARS = 8192
# Lines of one pasted or tailed text that are matched at most: each line costs a few regex calls in Python, so 1 MB
# of newlines would otherwise cost seconds; a real paste (dcgmi, nvidia-smi, ibstat, ibdiagnet) is thousands.
MAX_LINES = 100_000
CHUNK_BYTES = 4 << 20          # read size; memory stays a small multiple of this whatever the log size
BINARY_EXTENSIONS = {".pt", ".pth", ".bin", ".safetensors", ".pkl", ".pickle", ".npy", ".npz",
                           ".so", ".png", ".jpg", ".zip", ".tar", ".whl"}

# Rank labels at the start of a line: torchrun `[rank3]:` and `[default3]:`, srun --label `3: `,
# mpirun --tag-output `[1,3]<stdout>:`.
_LINE_RANK = re.compile(r"^[ \t]*(?:\[(?:rank|default)(\d+)\]:|(\d{1,6}): |\[\d+,(\d+)\]<std(?:out|err)>:)", re.MULTILINE)
_LINE_RANK_NO_SRUN = re.compile(r"^[ \t]*(?:\[(?:rank|default)(\d+)\]:|(?!)(\d)|\[\d+,(\d+)\]<std(?:out|err)>:)",
                                re.MULTILINE)
_SRUN_LABEL = re.compile(r"^[ \t]*\d{1,6}: ", re.MULTILINE)
# Rank named inside a message when the line has no label: `[Rank 3]`, `[PG ID 0 PG GUID 0(default_pg) Rank 3]`.
_MSG_RANK = re.compile(r"\[(?:PG [^\[\]\n]*?)?Rank (\d+)\]")   # no '[' inside: one scan per bracket
# Rank in a file path: rank3.log, rank_3, log-rank-3.txt, torchelastic .../attempt_0/3/stderr.log
_PATH_RANK = (re.compile(r"rank[_-]?(\d+)", re.IGNORECASE), re.compile(r"attempt_\d+/(\d+)/std(?:out|err)\.log$"))

_MONTHS = {m: i for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)}
_TS_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T _](\d{2}):(\d{2}):(\d{2}(?:[.,]\d+)?)")
_TS_GLOG = re.compile(r"\b[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)")
_TS_SYSLOG = re.compile(r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2})")


class LogInputParams(Params):
    """Where logs come from: paths or pasted text (shared by log_triage and nccl_log_analyze)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [present("paths", minItems=1), present("text", minLength=1)]})

    paths: list[str] = Field(default_factory=list, max_length=64, description=(
        "Files, directories, globs (.gz read); or text."))
    text: str | None = Field(None, max_length=50_000_000, description="Pasted log text instead of paths.")
    max_files: int = Field(2000, ge=1, le=100_000, json_schema_extra=SELF_EVIDENT, description="Files read, at most.")

    @model_validator(mode="after")
    def _one_input(self):
        if bool(self.paths) == bool(self.text):
            raise ValueError("give either paths (files, directories, globs) or text (a pasted log), not both "
                             "and not neither")
        return self


class TooManyLines(ValueError):
    """A paste or file holds more lines than MAX_LINES."""


def capped_lines(text: str, *, last: bool = False, max_lines: int = MAX_LINES) -> list[str]:
    """The text's lines, each cut at MAX_MATCH_CHARS: the one way a tool takes lines of outside text to match.

    With the cut, a pattern without nested or adjacent unbounded repeats (tests/test_door_matching.py) costs
    at most milliseconds per line. More than max_lines lines: TooManyLines naming the count, or with
    last=True (the tail of a log, whose end says how it ended) the last max_lines lines.
    """
    lines = text.splitlines()
    if len(lines) > max_lines:
        if not last:
            raise TooManyLines(f"{len(lines):,} lines, more than the {max_lines:,} read from one paste or file; "
                               "give the part that matters (one command's output)")
        lines = lines[-max_lines:]
    return [line[:MAX_MATCH_CHARS] for line in lines]


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
        elif os.path.lexists(path):
            candidates = [Path(path)]
        else:
            raise ToolFailure(f"no such file or directory: {raw!r}; give a log file, a directory of logs, "
                              "or a glob such as 'logs/*.out'")
        for cand in candidates:
            try:
                mode = cand.stat().st_mode
            except OSError as exc:  # one entry we may not read (a link into /proc/1, a name too long): skip it
                skipped.append(f"{cand} (cannot read: {exc.strerror or exc})")
                continue
            if not stat.S_ISREG(mode):
                if not stat.S_ISDIR(mode):  # a FIFO would block the read, a device never ends: say so, never open it
                    skipped.append(f"{cand} ({kind_of(mode)}; only regular files are read)")
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


def _refuse_binary(head: bytes) -> None:
    if looks_binary(head[:65536]):
        raise NotText("binary content (NUL bytes or undecodable), not a text log")


def looks_binary(head: bytes) -> bool:
    if not head:
        return False
    if head.count(0) > len(head) // 100:
        return True
    text = head.decode("utf-8", errors="replace")
    return text.count("\ufffd") > len(text) // 10


def _raw_chunks(path: Path, chunk_bytes: int, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The file's bytes in pieces; gzip (also multi-member or truncated) is decompressed on the way.
    start/end: a byte range of a plain file (parallel scans)."""
    with open_regular(path) as raw:
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
            _refuse_binary(buf)
            checked = True
        cut = buf.rfind(b"\n")
        if cut < 0:
            if len(buf) < 2 * chunk_bytes:
                continue
            cut = len(buf) - 1
        yield buf[:cut + 1].decode("utf-8", errors="replace")
        buf = buf[cut + 1:]
    if buf:
        if not checked:
            _refuse_binary(buf)
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


def ranks_phrase(ranks) -> str:
    ranks = set(ranks)
    return f"rank {format_ranks(ranks)}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def line_ranges(path: Path, parts: int) -> list[tuple[int, int]]:
    """`parts` byte ranges of a plain file, each starting at a line start, for workers that scan one each."""
    size = path.stat().st_size
    cuts = [0]
    with open_regular(path) as f:
        for k in range(1, parts):
            f.seek(k * size // parts)
            f.readline()  # move to the next line start
            cuts.append(f.tell())
    cuts.append(size)
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def head_text(path: Path) -> str:
    """The first MiB as text, for the binary check and the label conventions of the file."""
    head = next(iter(_raw_chunks(path, 1 << 20)), b"")
    _refuse_binary(head)
    return head.decode("utf-8", errors="replace")


def read_each(files: list[Path], skipped: list[str], read_one: Callable[[Path], None], progress: Progress | None,
              refuse_binary: str | None) -> list[str]:
    """Call read_one on each file; files that are binary or unreadable go to `skipped` with the reason.

    refuse_binary: when set, a binary file fails the call with this advice instead (the caller named that one
    file, so skipping it would leave nothing to say). Returns the files read; raises ToolFailure when none was.
    """
    read = []
    for i, path in enumerate(files):
        if progress:
            progress(i / max(1, len(files)), f"reading {path}")
        try:
            read_one(path)
        except NotText as exc:
            if refuse_binary:
                raise ToolFailure(f"{path}: {exc}. {refuse_binary}") from None
            skipped.append(f"{path} ({exc})")
            continue
        except OSError as exc:
            skipped.append(f"{path} (cannot read: {exc.strerror or exc})")
            continue
        read.append(str(path))
    if not read and skipped:
        raise ToolFailure("no readable text log among the paths given: " + "; ".join(skipped[:5]))
    return read

