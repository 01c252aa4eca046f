"""A flight-recorder dump, loaded safely: any torch version's pickle or JSON as plain Python data.

PyTorch's flight recorder (TORCH_FR_BUFFER_SIZE, dumps via TORCH_FR_DUMP_TEMP_FILE or
TORCH_NCCL_DEBUG_INFO_TEMP_FILE) writes one file per rank. Those files come from the job: untrusted. Pickles go
through an unpickler that refuses every class, so a hostile file cannot run code, and whose shared references
are counted before use, so a few bytes cannot unfold into gigabytes. Readers: flight_recorder_analyze (which
rank a hang waits on), straggler_find (which rank issues its collectives last).
"""

import json
import os
import pickle
from pathlib import Path
from typing import BinaryIO

from .safe_read import open_regular

DEFAULT_PREFIX_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
TORCH_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_DEPTH = 32                 # real dumps nest 5-6 levels (entries -> entry -> frames -> frame -> value)
BUDGET_PER_BYTE = 4            # data units per byte of file that plain, unshared data cannot exceed
BUDGET_SLACK = 100_000


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
            data = _PlainData(f).load()
        except UnsafeDump:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, MemoryError, IndexError,
                RecursionError) as e:
            raise ValueError(f"not a complete pickle ({type(e).__name__}: {e}): truncated or corrupt") from None
    elif head in (b"{", b" ", b"\n"):
        try:
            data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"not valid JSON ({e}): truncated or corrupt") from None
    else:
        raise ValueError("neither a pickle nor a JSON flight-recorder dump")
    if not isinstance(data, dict) or "version" not in data or not ({"entries", "pg_config", "pg_status"} & set(data)):
        raise ValueError("readable, but not a flight-recorder dump (no version/entries/pg_config keys)")
    expanded_units(data, BUDGET_PER_BYTE * size + BUDGET_SLACK)
    return data
