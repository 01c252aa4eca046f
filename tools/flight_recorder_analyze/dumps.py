"""Reading flight-recorder dumps (private to flight_recorder_analyze: no SPEC).

Any torch version's pickle or JSON dump becomes one RankDump per rank: its collectives as Op records
per process group, the fields looked up by every name they have had. Each file is loaded by
shared/flight_recorder.py, which lets only plain data through.
"""

import glob
import itertools
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.spec import ToolFailure
from ..shared.flight_recorder import DEFAULT_PREFIX_ENV, TORCH_DEFAULT_PREFIX, load_dump
from ..shared.safe_read import kind_of, owner_problem

MAX_FILES = 4096
RANK_IN_NAME = re.compile(r"(?<!\d)(\d+)(?:\.(?:json|pkl|pickle))?$")   # from a digit run's start: linear


@dataclass(slots=True)
class Op:
    seq: int
    op: str
    in_sizes: list
    in_dtypes: list
    out_sizes: list
    done: bool
    state: str
    called_from: str
    timeout_ms: int | None

    def describe(self) -> str:
        sizes = ",".join("x".join(map(str, s)) or "scalar" for s in self.in_sizes) or "-"
        dtypes = ",".join(dict.fromkeys(map(str, self.in_dtypes))) or "-"
        where = f" from {self.called_from}" if self.called_from else ""
        return f"{self.op} #{self.seq} (sizes {sizes}, dtype {dtypes}){where}"


@dataclass
class RankDump:
    rank: int
    path: str
    version: str
    pg_config: dict
    groups: dict = field(default_factory=lambda: defaultdict(list))     # (name, desc) -> [Op]
    backend: str = ""
    p2p_ops: int = 0


def rank_of(name: str, prefix: str) -> int | None:
    if prefix and not name.startswith(prefix):
        return None
    m = RANK_IN_NAME.search(name[len(prefix):] if prefix else name)
    return int(m.group(1)) if m else None


def _called_from(frames: list) -> str:
    """The innermost frame outside torch: the user's line that issued the collective."""
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        fname = str(fr.get("filename", ""))
        if "/torch/" in fname or fname.startswith("<"):
            continue
        return f"{fr.get('name', '?')} ({'/'.join(fname.rsplit('/', 2)[-2:])}:{fr.get('line', '?')})"
    return ""


def _list(e: dict, i: int, key: str) -> list:
    """entries[i][key] as a list ([] when absent); ValueError naming the field when it is something else."""
    value = e.get(key)
    if value is None or value == "":
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"field 'entries[{i}].{key}' is {type(value).__name__}, not a list")
    return list(value)


def _seq(e: dict, i: int) -> int | None:
    seq = e.get("collective_seq_id", e.get("seq_id"))
    if seq is None:
        return None
    if isinstance(seq, bool) or not (isinstance(seq, int) or (isinstance(seq, str) and seq.isdigit() and len(seq) < 20)):
        raise ValueError(f"field 'entries[{i}].collective_seq_id' is {str(seq)[:40]!r}, not a sequence number")
    return int(seq)


def _parse(rank: int, path: Path, data: dict, shared: dict) -> RankDump:
    """Entries -> Ops per process group. `shared` interns the values thousands of entries repeat
    (sizes, dtypes, call sites): a 256-rank x 2000-entry job fits in a few hundred MB. The loader checked
    that entries are dicts and pg_config a dict of dicts; a field of the wrong type is a ValueError naming it."""
    def one(value):
        return shared.setdefault(repr(value), value)

    dump = RankDump(rank=rank, path=str(path), version=str(data.get("version", ""))[:40],
                    pg_config=parse_pg_config(data.get("pg_config") or {}))
    for i, e in enumerate(data.get("entries") or []):
        if e.get("is_p2p"):
            dump.p2p_ops += 1              # send/recv are paired differently; collectives name hangs
            continue
        seq = _seq(e, i)
        if seq is None:
            continue
        backend, _, op = str(e.get("profiling_name", "?"))[:200].rpartition(":")
        dump.backend = dump.backend or backend
        pg = _list(e, i, "process_group") or [str(e.get("pg_id", "?")), ""]
        state = str(e.get("state", ""))[:40]
        timeout = e.get("timeout_ms")
        dump.groups[(str(pg[0])[:200], str(pg[1])[:200] if len(pg) > 1 else "")].append(Op(
            seq=seq, op=one(op or "?"), in_sizes=one(_list(e, i, "input_sizes")),
            in_dtypes=one(_list(e, i, "input_dtypes")), out_sizes=one(_list(e, i, "output_sizes")),
            done=state == "completed" or bool(e.get("retired")), state=one(state),
            called_from=one(_called_from(_list(e, i, "frames"))),
            timeout_ms=timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else None))
    return dump


MAX_RANKS_CHARS = 1 << 20       # "[0, 1, ..., 99999]" is ~600 KB


def parse_ranks(text: str, where: str) -> list[int]:
    """A process group's ranks as torch writes them ("[0, 1, 2]"), read by an explicit bounded parser:
    brackets, decimal numbers, commas, nothing else. ValueError naming `where` otherwise (never eval)."""
    if len(text) > MAX_RANKS_CHARS:
        raise ValueError(f"field '{where}' is {len(text):,} characters, more than any ranks list")
    body = text.strip()
    if body[:1] in "[(" and body[-1:] in "])":
        body = body[1:-1]
    items = [item.strip() for item in body.split(",")] if body.strip() else []
    if items and items[-1] == "":
        items.pop()                 # "(0,)"
    if not all(item.isdigit() and item.isascii() and len(item) <= 9 for item in items):
        bad = next(item for item in items if not (item.isdigit() and item.isascii() and len(item) <= 9))
        raise ValueError(f"field '{where}' holds {bad[:40]!r}: not a list of rank numbers like '[0, 1, 2]'")
    return [int(item) for item in items]


def parse_pg_config(config: dict) -> dict:
    """pg name -> {'ranks': [int] or None, ...the rest as given}, the ranks parsed (a list or its text)."""
    out = {}
    for key, cfg in config.items():
        ranks = cfg.get("ranks")
        where = f"pg_config[{str(key)[:40]!r}].ranks"
        if isinstance(ranks, str):
            ranks = parse_ranks(ranks, where)
        elif isinstance(ranks, (list, tuple)):
            if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
                raise ValueError(f"field '{where}' holds something other than rank numbers")
            ranks = list(ranks)
        elif ranks is not None:
            raise ValueError(f"field '{where}' is {type(ranks).__name__}, not a list of ranks")
        out[str(key)] = {**cfg, "ranks": ranks}
    return out


def find_dump_files(path: str, prefix: str) -> tuple[Path, str]:
    if not path:
        env_prefix = next((os.environ[v] for v in DEFAULT_PREFIX_ENV if os.environ.get(v)), TORCH_DEFAULT_PREFIX)
        path, prefix = str(Path(env_prefix).parent), prefix or Path(env_prefix).name
    root = Path(path).expanduser()
    if not root.exists():
        raise ToolFailure(f"{root} does not exist. Give the directory the ranks dumped into (the directory "
                          f"part of TORCH_FR_DUMP_TEMP_FILE; torch's default prefix is {TORCH_DEFAULT_PREFIX}). "
                          "On several nodes, copy every node's dumps into one directory first.")
    if not root.is_dir() and not root.is_file():   # a FIFO would block the read, a device never ends
        raise ToolFailure(f"path: {root} is {kind_of(root.stat().st_mode)}; give a dump file or the directory "
                          "of per-rank dumps (regular files only).")
    return root, prefix


def _candidates(root: Path, prefix: str, recursive: bool) -> list[Path]:
    """Files that may be dumps, at most MAX_FILES of them, listed lazily and named by prefix first."""
    if root.is_file():
        return [root]
    pattern = f"{glob.escape(prefix)}*"
    walk = root.rglob(pattern) if recursive else root.glob(pattern)
    return sorted(itertools.islice((p for p in walk if p.is_file()), MAX_FILES))


def read_dumps(path: str, prefix: str = "") -> tuple[dict[int, RankDump], list[str], dict[int, int]]:
    """Every readable per-rank dump under `path` (pickle preferred over JSON for the same rank). With no
    path, only the files of torch's dump prefix in its own directory: /tmp is not walked. Returns the dumps,
    the files not read (with why), and {uid: files} of the dumps read that another user owns (a path given)."""
    root, prefix = find_dump_files(path, prefix)
    files = _candidates(root, prefix, recursive=bool(path))
    dumps, unreadable, shared, foreign = {}, [], {}, {}
    for p in files:
        rank = rank_of(p.name, prefix) if root.is_dir() else (rank_of(p.name, "") or 0)
        if rank is None:
            continue
        # torch's default prefix is in /tmp, where anyone can plant a dump: there only ours (or root's) count.
        # lstat: a link another user planted is theirs, whatever it points at. A path given is the caller's.
        planted = "" if path else owner_problem(p.lstat(), {os.geteuid()}, "you")
        if planted:
            unreadable.append(f"{p}: {planted} (torch's default location is shared by every user: another "
                              "user's file there is not evidence)")
            continue
        owner = p.lstat().st_uid
        if owner not in (os.geteuid(), 0):      # a path given: read, and the answer says whose files they are
            foreign[owner] = foreign.get(owner, 0) + 1
        try:
            dump = _parse(rank, p, load_dump(p), shared)
        except (ValueError, OSError) as e:
            unreadable.append(f"{p}: {e}")
            continue
        if rank in dumps and not dumps[rank].path.endswith(".json"):
            continue                       # keep the pickle: it has stacks
        dumps[rank] = dump
    if not dumps:
        why = f"; unreadable: {'; '.join(unreadable[:5])}" if unreadable else ""
        raise ToolFailure(f"no flight-recorder dump found under {root}"
                          f"{' with prefix ' + repr(prefix) if prefix else ''}{why}. Dumps are files named "
                          "<prefix><rank> (pickle) or <prefix><rank>.json, one per rank.")
    return dumps, unreadable, foreign



def configured_ranks(dumps: dict[int, RankDump]) -> dict[str, set[int]]:
    """pg name -> ranks, from pg_config where it is usable (it is broken for gloo: one '' key)."""
    out: dict[str, set[int]] = {}
    for d in dumps.values():
        for key, cfg in d.pg_config.items():
            if cfg["ranks"]:
                out.setdefault(key, set()).update(cfg["ranks"])
    return out
