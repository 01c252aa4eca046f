"""A flight-recorder dump, loaded safely: any torch version's pickle or JSON as plain Python data.

PyTorch's flight recorder (TORCH_FR_BUFFER_SIZE, dumps via TORCH_FR_DUMP_TEMP_FILE or
TORCH_NCCL_DEBUG_INFO_TEMP_FILE) writes one file per rank. Those files come from the job: untrusted. Pickles go
through an unpickler that refuses every class, so a hostile file cannot run code. Before anything is built, the
opcodes are counted (`objects_to_build`, streaming): a file that would create more than MAX_OBJECTS Python
objects is refused, so 10 MB of one-byte EMPTY_LIST opcodes (10 M lists, 1.4 GB) cannot be expanded; shared
references are counted after, so a few bytes cannot unfold into gigabytes either. Fields are checked
(`check_fields`): a malformed dump is an error naming the field, never a crash in a reader. Readers: flight_recorder_analyze (which
rank a hang waits on), straggler_find (which rank issues its collectives last).
"""

import json
import os
import pickle
import pickletools
from pathlib import Path
from typing import BinaryIO

from .safe_read import open_regular

DEFAULT_PREFIX_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
TORCH_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_DEPTH = 32                 # real dumps nest 5-6 levels (entries -> entry -> frames -> frame -> value)
BUDGET_PER_BYTE = 4            # data units per byte of file that plain, unshared data cannot exceed
BUDGET_SLACK = 100_000
# What one dump may make while unpickled. Measured (a dump of 2,000 entries like fr_hung's, each with a 25-frame
# stack, 1.0 MB): 180 k objects from 600 k opcodes; so TORCH_FR_BUFFER_SIZE=20000 makes ~1.8 M objects from 6 M
# opcodes. At ~64 bytes an object and 8 a reference, the caps hold a dump to ~250 + 130 MB whatever the file
# holds: 10 MB of one-byte EMPTY_LIST opcodes asks 10 M objects (1.4 GB), 2-byte BINGETs 5 M references each.
MAX_OBJECTS = 4_000_000
MAX_OPCODES = 16_000_000
# Opcodes that push a reference to an object already built or build nothing; every other opcode creates one
# object or one memo entry (MEMOIZE, PUT: counted, as 10 M one-byte MEMOIZEs fill a 10 M-entry memo).
_NO_NEW_OBJECT = {"GET", "BINGET", "LONG_BINGET", "MARK", "PROTO", "FRAME", "STOP", "POP", "POP_MARK", "DUP",
                  "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"}
# Opcodes whose argument is a memo index: C's unpickler sizes its memo array to the largest index, so one
# LONG_BINPUT of 2**31 would allocate (and zero) 16 GiB.
_MEMO_INDEX = {"GET", "BINGET", "LONG_BINGET", "PUT", "BINPUT", "LONG_BINPUT"}


class UnsafeDump(ValueError):
    """The file asks for something a flight-recorder dump never holds: refused, not corrupt."""


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise UnsafeDump(f"refused (unsafe content): it asks to load {module[:80]}.{name[:80]}, a Python class "
                         "or function; a flight-recorder dump is plain data, so nothing of it was run")


_CONTAINERS = (list, tuple, dict, set, frozenset)


def expanded_units(data, budget: int) -> int:
    """How big `data` is once every shared reference is followed, counted once per distinct object
    (identity-aware), so `x = [x, x]` nested 22 deep costs 22 steps, not 4 million. A string counts
    one unit per 64 characters. Raises UnsafeDump past MAX_DEPTH levels, on a cycle, or past `budget`."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(obj, depth: int) -> int:
        if not isinstance(obj, _CONTAINERS):
            return 1 + len(obj) // 64 if isinstance(obj, (str, bytes)) else 1
        key = id(obj)
        if key in memo:
            return memo[key]
        if depth > MAX_DEPTH:
            raise UnsafeDump(f"refused (unsafe content): nested more than {MAX_DEPTH} levels deep")
        if key in active:
            raise UnsafeDump("refused (unsafe content): a container that contains itself")
        active.add(key)
        total = 1
        for item in (obj.items() if isinstance(obj, dict) else obj):
            total += size(item[0], depth + 1) + size(item[1], depth + 1) if isinstance(obj, dict) else size(item, depth + 1)
            if total > budget:
                raise UnsafeDump(f"refused (unsafe content): its shared references expand to more than {budget} "
                                 "values (a few bytes that unfold into gigabytes); a real dump is plain, unshared data")
        active.discard(key)
        memo[key] = total
        return total

    return size(data, 0)


def load_dump(path: Path) -> dict:
    with open_regular(path) as f:
        return _load_open(f, os.fstat(f.fileno()).st_size)


def _load_open(f: BinaryIO, size: int) -> dict:
    if size == 0:
        raise ValueError("empty file (0 bytes): the rank was killed while writing its dump; the first dump "
                         "with stack traces takes 1-3 s, so give ranks time before SIGKILL")
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{size / 2**20:.0f} MiB is larger than any flight-recorder dump")
    head = f.read(1)
    f.seek(0)
    if head == b"\x80":
        try:
            objects_to_build(f)
            f.seek(0)
            data = _PlainData(f).load()
        except UnsafeDump:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, MemoryError, IndexError,
                RecursionError) as e:
            raise ValueError(f"not a complete pickle ({type(e).__name__}: {e}): truncated or corrupt") from None
    elif head in (b"{", b" ", b"\n"):
        json_values_at_most(f)
        f.seek(0)
        try:
            data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"not valid JSON ({e}): truncated or corrupt") from None
    else:
        raise ValueError("neither a pickle nor a JSON flight-recorder dump")
    if not isinstance(data, dict) or "version" not in data or not ({"entries", "pg_config", "pg_status"} & set(data)):
        raise ValueError("readable, but not a flight-recorder dump (no version/entries/pg_config keys)")
    expanded_units(data, BUDGET_PER_BYTE * size + BUDGET_SLACK)
    check_fields(data)
    return data


def objects_to_build(f: BinaryIO) -> int:
    """How many objects unpickling `f` would create, read opcode by opcode without building any; UnsafeDump
    past MAX_OBJECTS objects or MAX_OPCODES opcodes. pickletools reads one opcode's argument at a time, so memory
    stays at the largest string; ~0.5 M opcodes a second (1.2 s for a 1 MB dump on a loaded 2-core VM)."""
    built = 0
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(f)):
            if count > MAX_OPCODES:
                raise UnsafeDump(f"refused (unsafe content): more than {MAX_OPCODES:,} pickle opcodes (a real dump "
                                 "of 20,000 entries has ~6 M); nothing of it was built")
            if op.name in _MEMO_INDEX and not (isinstance(arg, int) and 0 <= arg <= MAX_OBJECTS):
                raise UnsafeDump(f"refused (unsafe content): memo index {str(arg)[:20]} (at most {MAX_OBJECTS:,} in a "
                                 "dump: a huge index makes the unpickler allocate gigabytes)")
            if op.name not in _NO_NEW_OBJECT:
                built += 1
                if built > MAX_OBJECTS:
                    raise UnsafeDump(f"refused (unsafe content): it would create more than {MAX_OBJECTS:,} Python "
                                     "objects (a real dump of 20,000 entries makes ~1.8 M); nothing of it was built")
    except (ValueError, EOFError) as e:
        if isinstance(e, UnsafeDump):
            raise
        raise ValueError(f"not a complete pickle ({e}): truncated or corrupt") from None
    return built


def json_values_at_most(f: BinaryIO) -> int:
    """An upper bound on the values a JSON text makes (each is opened by [ or {, or follows , or :), read in
    1 MiB chunks; UnsafeDump past 2 x MAX_OBJECTS (`[[],[],...]` makes 20x its bytes in Python objects). Twice:
    every dict key counts here, and json shares repeated keys, so a real dump builds about half of it."""
    values = 1
    while chunk := f.read(1 << 20):
        values += sum(chunk.count(c) for c in (b"[", b"{", b",", b":"))
        if values > 2 * MAX_OBJECTS:
            raise UnsafeDump(f"refused (unsafe content): it would create more than {MAX_OBJECTS:,} Python objects "
                             "(a real dump of 20,000 entries makes ~1.8 M); nothing of it was built")
    return values


def check_fields(data: dict) -> None:
    """The fields readers index into have the shape torch writes; ValueError naming the first one that does not."""
    entries = data.get("entries")
    if entries is not None and not isinstance(entries, list):
        raise ValueError(f"field 'entries' is {type(entries).__name__}, not a list of collective records")
    for i, e in enumerate(entries or []):
        if not isinstance(e, dict):
            raise ValueError(f"field 'entries[{i}]' is {type(e).__name__}, not a dict (one collective's record)")
    config = data.get("pg_config")
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"field 'pg_config' is {type(config).__name__}, not a dict of process groups")
    for name, cfg in (config or {}).items():
        if not isinstance(cfg, dict):
            raise ValueError(f"field 'pg_config[{str(name)[:40]!r}]' is {type(cfg).__name__}, not a dict")
