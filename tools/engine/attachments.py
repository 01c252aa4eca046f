"""Files a run wrote that its answer attaches (Result.image_fields), read back from the descriptor the
run wrote them through, never re-opened by name.

Re-opening a path after the child wrote it lets whoever controls the folder swap in a link to any file
the server can read, and the answer would carry that file (review 2026-12-01, F2). So the writer
(shared/safe_write.open_output) hands its descriptor here; in the child, `collect()` keeps a duplicate
of each, and after the run `read()` takes the bytes of the fields' paths from those descriptors. The
bytes travel to the server as one event per image, before the result. Outside a child nothing is
kept (no descriptor leaks in the long-lived server).
"""

import os

# A plot is ~30-300 KB; anything bigger is not attached. 4 MB is 5.4 MB of base64: one event line stays
# under processes.MAX_LINE_BYTES (8 MiB).
IMAGE_LIMIT_BYTES = 4_000_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

_kept: dict[str, int] | None = None   # path -> our duplicate of the descriptor it was written through


def collect() -> None:
    """From now on, keep the descriptor of every file written through safe_write (the child calls this)."""
    global _kept
    _kept = {}


def keep(path, fd: int) -> None:
    """Called by the writer once a file is complete; a no-op unless collect() was called."""
    if _kept is None:
        return
    old = _kept.pop(str(path), None)
    if old is not None:
        os.close(old)
    _kept[str(path)] = os.dup(fd)


def read(path: str) -> bytes | None:
    """The bytes written to `path` through a kept descriptor: None when it was not written by this run,
    is over IMAGE_LIMIT_BYTES, or is not a PNG."""
    fd = (_kept or {}).get(str(path))
    if fd is None or os.fstat(fd).st_size > IMAGE_LIMIT_BYTES:
        return None
    data = os.pread(fd, IMAGE_LIMIT_BYTES + 1, 0)
    return data if data.startswith(PNG_MAGIC) and len(data) <= IMAGE_LIMIT_BYTES else None
