"""Filesystem measurements for storage_bench in plain Python (no SPEC: not a tool).

Used when fio is missing, and always for the small-file metadata rates and space checks. Data phases
bypass the page cache with O_DIRECT where the filesystem allows it (page-aligned buffers from mmap);
otherwise the file's cached pages are dropped with posix_fadvise(DONTNEED) after an fsync, which
needs no root. Every phase stops at its deadline and reports what it managed.
"""

import dataclasses
import mmap
import os
import random
import time

RAND_BLOCK = 4096


@dataclasses.dataclass
class DataFigures:
    seq_write_mbps: float | None = None
    seq_read_mbps: float | None = None
    rand_read_iops: float | None = None
    rand_read_latency_us: float | None = None
    bytes_written: int = 0
    direct_io: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)


def direct_io_supported(directory: str) -> bool:
    """Whether files here can be opened with O_DIRECT (tmpfs before Linux 6.6, some FUSE mounts: no)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = os.path.join(directory, "direct-probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        if os.path.exists(probe):
            os.unlink(probe)


def _open(path: str, flags: int, direct: bool) -> int:
    return os.open(path, flags | (os.O_DIRECT if direct else 0), 0o600)


def _drop_cache(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def sequential(path: str, size_bytes: int, block_bytes: int, direct: bool, deadline: float) -> DataFigures:
    """Write `size_bytes` in `block_bytes` blocks + fsync, then read it back; MB/s (decimal)."""
    fig = DataFigures(direct_io=direct)
    buf = mmap.mmap(-1, block_bytes)  # page-aligned, as O_DIRECT requires
    buf.write(os.urandom(block_bytes))  # incompressible: compressing filesystems must not flatter us
    fd = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct)
    try:
        t0 = time.perf_counter()
        while fig.bytes_written < size_bytes and time.monotonic() < deadline:
            fig.bytes_written += os.write(fd, buf)
        os.fsync(fd)
        elapsed = time.perf_counter() - t0
        _drop_cache(fd)
    finally:
        os.close(fd)
    if fig.bytes_written < size_bytes:
        fig.notes.append(f"sequential write stopped at the time budget after {fig.bytes_written / 2**20:.0f} MiB")
    fig.seq_write_mbps = fig.bytes_written / elapsed / 1e6
    fd = _open(path, os.O_RDONLY, direct)
    try:
        done, t0 = 0, time.perf_counter()
        while done < fig.bytes_written and time.monotonic() < deadline:
            n = os.readv(fd, [buf])
            if n <= 0:
                break
            done += n
        fig.seq_read_mbps = done / (time.perf_counter() - t0) / 1e6 if done else None
        _drop_cache(fd)
    finally:
        os.close(fd)
    buf.close()
    return fig


def random_reads(path: str, file_bytes: int, direct: bool, seconds: float, deadline: float, fig: DataFigures) -> None:
    """Random 4 KiB reads from the file for `seconds`, one at a time (queue depth 1)."""
    blocks = file_bytes // RAND_BLOCK
    if blocks < 1:
        return
    buf = mmap.mmap(-1, RAND_BLOCK)
    fd = _open(path, os.O_RDONLY, direct)
    rng = random.Random(0)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        ops, stop = 0, min(time.monotonic() + seconds, deadline)
        t0 = time.perf_counter()
        while time.monotonic() < stop:
            for _ in range(64):
                os.preadv(fd, [buf], rng.randrange(blocks) * RAND_BLOCK)
            ops += 64
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        buf.close()
    if ops:
        fig.rand_read_iops = ops / elapsed
        fig.rand_read_latency_us = elapsed / ops * 1e6


@dataclasses.dataclass
class MetadataFigures:
    files: int = 0
    create_per_s: float | None = None
    stat_per_s: float | None = None
    delete_per_s: float | None = None


def small_files(directory: str, count: int, deadline: float, file_bytes: int = 4096) -> MetadataFigures:
    """Create (open + write 4 KiB + close), stat, then delete `count` files in one directory."""
    os.makedirs(directory, exist_ok=True)
    payload = os.urandom(file_bytes)
    names = []
    fig = MetadataFigures()
    t0 = time.perf_counter()
    for i in range(count):
        if i % 64 == 0 and time.monotonic() > deadline:
            break
        name = os.path.join(directory, f"f{i:07d}")
        with open(name, "wb") as f:
            f.write(payload)
        names.append(name)
    if not names:
        return fig
    fig.files = len(names)
    fig.create_per_s = len(names) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for name in names:
        os.stat(name)
    fig.stat_per_s = len(names) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for name in names:
        os.unlink(name)
    fig.delete_per_s = len(names) / (time.perf_counter() - t0)
    return fig


@dataclasses.dataclass
class Space:
    total_bytes: int
    avail_bytes: int
    used_pct: float
    inodes_total: int | None
    inodes_used_pct: float | None


def space(path: str) -> Space:
    """Like df: used % = used / (used + available to unprivileged users)."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    used_pct = 100.0 * used / (used + avail) if used + avail else 0.0
    inodes_pct = None
    if st.f_files:  # some filesystems (btrfs, many network ones) report no inode limit
        inodes_pct = 100.0 * (st.f_files - st.f_ffree) / st.f_files
    return Space(st.f_blocks * st.f_frsize, avail, used_pct, st.f_files or None, inodes_pct)


def mount_of(path: str) -> tuple[str | None, str | None]:
    """(mount point, filesystem type) holding `path`, from /proc/mounts (None where there is none)."""
    real = os.path.realpath(path)
    best = (None, None)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and (best[0] is None or len(point) >= len(best[0])):
                    best = (point, parts[2])
    except OSError:
        pass
    return best
