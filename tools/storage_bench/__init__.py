"""storage_bench — is this filesystem fast enough: throughput, random reads, metadata rates, space.

At a given path: sequential write (with fsync) and read with 1 MiB blocks, random 4 KiB reads
(queue depth 1), small-file create / stat / delete rates, free space and inodes (warn at 80%, fail
at 90%). Data phases use fio (JSON output) when it is installed, else Python; both bypass the page
cache with O_DIRECT where the filesystem allows it. Everything is written inside one temporary
directory under the path, within a size and time budget, and removed on success, failure and
cancellation (SIGTERM); a directory left by a SIGKILLed run on this host is removed by the next run.
One stream only: parallel filesystems (Lustre, GPFS, Weka) scale with clients and streams.

How to run by hand (any node, no GPU):
    mleng run storage_bench --path /scratch/$USER
    mleng run storage_bench --path /checkpoints --size-mib 2048 --engine fio --json
    srun --nodes=4 --ntasks-per-node=1 mleng run storage_bench --path /shared/fs --json   # one per node
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Literal

from pydantic import field_validator

from . import storage_io as sio
from ..engine.figures import Figure, Measured, SweepContract
from ..engine.spec import Field, Params, Progress, Result, ToolFailure, ToolSpec

PREFIX = ".mleng-storage-bench-"
MiB = 2**20


class StorageParams(Params):
    path: str = Field("/tmp", min_length=1, max_length=4096, description=(
        "Writable directory (a temp dir in it is removed after)."))
    size_mib: int = Field(256, ge=1, le=65536, description="Sequential test file.")
    block_kib: int = Field(1024, ge=4, le=65536, multiple_of=4, description="Sequential block.")
    random_read_s: float = Field(2.0, ge=0, le=600, description="Random 4 KiB reads (0 skips).")
    small_files: int = Field(1000, ge=0, le=1_000_000, description="4 KiB files created, stat'ed, deleted (0 skips).")
    time_budget_s: float = Field(60.0, ge=1, le=3600, description="Whole run; past ~250 s raise timeout_s.")
    engine: Literal["auto", "fio", "python"] = Field("auto", description="auto: fio if installed.")
    direct_io: Literal["auto", "on", "off"] = Field("auto", description=(
        "O_DIRECT: where supported, required, never."))


    @field_validator("block_kib")
    @classmethod
    def _aligned(cls, v: int) -> int:
        if v % 4:
            raise ValueError(f"block_kib={v} must be a multiple of 4 (direct I/O needs 4 KiB-aligned blocks)")
        return v


class StorageResult(Result):
    path: str | None = Field(None, description="Directory tested.")
    mount_point: str | None = Field(None, description="Mount point holding the path.")
    filesystem: str | None = Field(None, description="Filesystem type (from /proc/mounts).")
    engine: str | None = Field(None, description="fio | python: what measured the data phases.")
    engine_note: str | None = Field(None, description="Why that engine.")
    direct_io: bool | None = Field(None, description="Whether O_DIRECT bypassed the page cache.")
    seq_write_mbps: float | None = Field(None, description="Sequential write incl. fsync (MB/s, decimal).")
    seq_read_mbps: float | None = Field(None, description="Sequential read (MB/s, decimal).")
    rand_read_iops: float | None = Field(None, description="Random 4 KiB reads per second, queue depth 1.")
    rand_read_latency_us: float | None = Field(None, description="Mean random 4 KiB read latency (microseconds).")
    file_create_per_s: float | None = Field(None, description="Small files created (open, write 4 KiB, close) per s.")
    file_stat_per_s: float | None = Field(None, description="stat() calls per second.")
    file_delete_per_s: float | None = Field(None, description="unlink() calls per second.")
    bytes_written: int | None = Field(None, description="Bytes of the sequential file actually written.")
    total_gib: float | None = Field(None, description="Filesystem size (GiB).")
    free_gib: float | None = Field(None, description="Space available to this user (GiB).")
    used_pct: float | None = Field(None, description="Space used, as df reports it (%).")
    inodes_used_pct: float | None = Field(None, description="Inodes used (%); None where the fs has no limit.")
    elapsed_s: float | None = Field(None, description="Wall time of the run (s).")
    cleaned_up: bool | None = Field(None, description="The temporary directory was removed.")


class _Terminated(BaseException):
    """SIGTERM arrived (timeout or cancel): unwind so that the finally clause removes our files."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def check_path(path: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
        raise ToolFailure(f"{path} does not exist: give an existing directory on the filesystem to test")
    if not os.path.isdir(path):
        raise ToolFailure(f"{path} is not a directory: give the directory (mount point or a folder in it)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ToolFailure(f"{path} is not writable by this user (uid {os.getuid()}): pick a directory you own "
                          "on the same filesystem, e.g. a per-user scratch folder")
    return path


def remove_stale(path: str) -> int:
    """Remove directories left by runs on this host whose process is gone (SIGKILL allows no cleanup)."""
    import psutil

    mine = f"{PREFIX}{socket.gethostname()}-"
    removed = 0
    for name in os.listdir(path):
        pid = name[len(mine):].split("-")[0] if name.startswith(mine) else ""
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(os.path.join(path, name), ignore_errors=True)
            removed += 1
    return removed


def run(params: StorageParams, progress: Progress) -> StorageResult:
    path = check_path(params.path)
    started = time.monotonic()
    deadline = started + params.time_budget_s
    size = params.size_mib * MiB
    res = StorageResult(path=path)
    res.mount_point, res.filesystem = sio.mount_of(path)
    stale = remove_stale(path)
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if on_main else None
    tmp = None
    try:
        try:
            tmp = tempfile.mkdtemp(prefix=f"{PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=path)
        except OSError as e:
            raise ToolFailure(f"cannot create a directory in {path}: {e.strerror}; the filesystem may be "
                              "read-only or full, or the user lacks permission") from None
        _check_space(path, size + params.small_files * 8192 + 64 * MiB, res)
        _measure(params, tmp, size, deadline, progress, res)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
            res.cleaned_up = not os.path.exists(tmp)
        if on_main:
            signal.signal(signal.SIGTERM, previous)
    res.elapsed_s = round(time.monotonic() - started, 2)
    if stale:
        res.findings.append(f"Removed {stale} temporary director{'y' if stale == 1 else 'ies'} left by killed runs.")
    _judge(res)
    return res


def _check_space(path: str, need: int, res: StorageResult) -> None:
    space = sio.space(path)
    res.total_gib, res.free_gib = round(space.total_bytes / 2**30, 2), round(space.avail_bytes / 2**30, 2)
    res.used_pct = round(space.used_pct, 1)
    res.inodes_used_pct = None if space.inodes_used_pct is None else round(space.inodes_used_pct, 1)
    if space.avail_bytes < need:
        raise ToolFailure(f"only {space.avail_bytes / MiB:.0f} MiB free at {path}, the test needs about "
                          f"{need / MiB:.0f} MiB: lower size_mib or free space")


def _measure(params: StorageParams, tmp: str, size: int, deadline: float, progress: Progress,
             res: StorageResult) -> None:
    supported = sio.direct_io_supported(tmp)
    if params.direct_io == "on" and not supported:
        raise ToolFailure(f"O_DIRECT is not supported on this filesystem ({res.filesystem}): use direct_io=auto")
    direct = supported and params.direct_io != "off"
    fio = shutil.which("fio")
    res.engine, res.engine_note = "python", "fio is not installed"
    if params.engine == "fio" and not fio:
        raise ToolFailure("engine=fio but fio is not on PATH: install it (apt-get install fio) or use engine=auto")
    if params.engine == "python":
        res.engine_note = "engine=python requested"
    data_deadline = time.monotonic() + 0.6 * (deadline - time.monotonic())
    fig = None
    if fio and params.engine != "python":
        progress(0.05, f"fio: sequential write and read of {params.size_mib} MiB")
        try:
            fig = fio_data_phases(fio, tmp, size, params.block_kib * 1024, direct, params.random_read_s,
                                  data_deadline, progress)
            res.engine, res.engine_note = "fio", "fio found on PATH"
        except ToolFailure as e:
            if params.engine == "fio":
                raise
            res.engine_note = f"fio failed, Python used instead: {e}"
    if fig is None:
        progress(0.05, f"sequential write and read of {params.size_mib} MiB")
        seqfile = os.path.join(tmp, "seqfile")
        fig = sio.sequential(seqfile, size, params.block_kib * 1024, direct, data_deadline)
        if params.random_read_s > 0:
            progress(0.4, "random 4 KiB reads")
            sio.random_reads(seqfile, fig.bytes_written, direct, params.random_read_s, deadline, fig)
        os.unlink(seqfile)
    for name in ("seq_write_mbps", "seq_read_mbps", "rand_read_iops", "rand_read_latency_us"):
        value = getattr(fig, name)
        setattr(res, name, None if value is None else round(value, 1))
    res.bytes_written, res.direct_io = fig.bytes_written, fig.direct_io
    res.findings.extend(n[0].upper() + n[1:] + "." for n in fig.notes)
    if params.small_files:
        progress(0.7, f"create, stat and delete {params.small_files} small files")
        meta = sio.small_files(os.path.join(tmp, "small"), params.small_files, deadline)
        res.file_create_per_s, res.file_stat_per_s, res.file_delete_per_s = (
            None if v is None else round(v, 1) for v in (meta.create_per_s, meta.stat_per_s, meta.delete_per_s))
        if meta.files < params.small_files:
            res.findings.append(f"Small-file phase stopped at the time budget after {meta.files} files.")
    progress(1.0, "done")


def fio_data_phases(fio: str, tmp: str, size: int, block: int, direct: bool, random_s: float,
                    deadline: float, progress: Progress) -> sio.DataFigures:
    fig = sio.DataFigures(direct_io=direct)
    left = lambda: max(1, int(deadline - time.monotonic()))  # noqa: E731
    write = _fio(fio, tmp, "write", block, size, direct, left())["write"]
    fig.bytes_written = int(write["io_bytes"])
    fig.seq_write_mbps = write["bw_bytes"] / 1e6
    fig.seq_read_mbps = _fio(fio, tmp, "read", block, fig.bytes_written, direct, left())["read"]["bw_bytes"] / 1e6
    if random_s > 0:
        progress(0.4, "fio: random 4 KiB reads")
        rand = _fio(fio, tmp, "randread", 4096, fig.bytes_written, direct, max(1, int(round(random_s))))["read"]
        fig.rand_read_iops = rand["iops"]
        fig.rand_read_latency_us = rand.get("lat_ns", rand.get("clat_ns", {})).get("mean", 0) / 1000 or None
    if fig.bytes_written < size:
        fig.notes.append(f"sequential write stopped at the time budget after {fig.bytes_written / MiB:.0f} MiB")
    return fig


def _fio(fio: str, tmp: str, rw: str, block: int, size: int, direct: bool, runtime_s: int) -> dict:
    cmd = [fio, f"--name={rw}", f"--directory={tmp}", "--filename=seqfile", f"--rw={rw}", f"--bs={block}",
           f"--size={size}", f"--direct={int(direct)}", "--ioengine=psync", "--numjobs=1", "--thread",
           f"--runtime={runtime_s}", "--output-format=json"]
    # No preallocation: checkpoint writers append to a new file, as the Python engine does (fio's default
    # fallocate made writes 2-4x slower than appending on ext4 here).
    cmd += ["--end_fsync=1", "--fallocate=none"] if rw == "write" else ["--time_based"] if rw == "randread" else []
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=runtime_s + 60)
    except subprocess.TimeoutExpired:
        raise ToolFailure(f"fio {rw} did not finish within {runtime_s + 60} s") from None
    text = out.stdout
    if out.returncode != 0 or "{" not in text:
        raise ToolFailure(f"fio {rw} exited {out.returncode}: {(out.stderr or text).strip()[-300:]}")
    try:
        job = json.loads(text[text.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError) as e:
        raise ToolFailure(f"fio {rw} printed JSON this tool cannot read ({e})") from None
    if job.get("error"):
        raise ToolFailure(f"fio {rw} reported error {job['error']}")
    return job


def _judge(res: StorageResult) -> None:
    f, worst = res.findings, "ok"
    fs = f"{res.filesystem or 'unknown filesystem'} at {res.mount_point or res.path}"
    f.insert(0, f"{fs} ({res.engine}, {'O_DIRECT' if res.direct_io else 'page cache dropped with fadvise'}): "
                f"write {res.seq_write_mbps or 0:,.0f} MB/s, read {res.seq_read_mbps or 0:,.0f} MB/s, "
                f"random 4 KiB {res.rand_read_iops or 0:,.0f} IOPS, {res.file_create_per_s or 0:,.0f} file creates/s.")
    for label, pct in (("space", res.used_pct), ("inodes", res.inodes_used_pct)):
        if pct is None:
            continue
        if pct >= 90:
            worst = "fail"
            f.insert(0, f"{label.capitalize()} {pct:.0f}% used ({res.free_gib:.1f} GiB free): checkpoints and logs "
                        "will fail to write soon; free space or move the run.")
        elif pct >= 80:
            worst = "warn" if worst == "ok" else worst
            f.insert(0, f"{label.capitalize()} {pct:.0f}% used: plan cleanup before it reaches 90%.")
    if res.seq_write_mbps:
        f.append(f"At {res.seq_write_mbps:,.0f} MB/s one writer needs {100e3 / res.seq_write_mbps:,.0f} s per 100 GB "
                 "of checkpoint (a 70B model's bf16 weights alone are 141 GB).")
    if res.seq_write_mbps is not None and min(res.seq_write_mbps, res.seq_read_mbps or 0) < 100:
        worst = "warn" if worst == "ok" else worst
        f.append("Sequential throughput under 100 MB/s: too slow for checkpoints or streaming datasets.")
    if res.file_create_per_s is not None and res.file_create_per_s < 500:
        worst = "warn" if worst == "ok" else worst
        f.append("Under 500 file creates/s: datasets of many small files and per-rank logs will stall here.")
    if not res.direct_io:
        f.append("O_DIRECT not used: the read figures may include page-cache hits.")
    res.verdict = worst
    res.next = ["knowledge://storage/storage-benchmarking.md", "knowledge://storage/checkpoint-io.md",
                "knowledge://storage/small-files.md", "knowledge://storage/shared-filesystems.md"]


SEQ_READ = Figure("seq_read_mbps", "MB/s", "higher")
SEQ_WRITE = Figure("seq_write_mbps", "MB/s", "higher")
CREATES = Figure("file_create_per_s", "files/s", "higher")
SWEEP = SweepContract(figures=(SEQ_READ, SEQ_WRITE, CREATES), read=lambda res: [
    Measured(SEQ_READ, res.seq_read_mbps), Measured(SEQ_WRITE, res.seq_write_mbps),
    Measured(CREATES, res.file_create_per_s)])

SPEC = ToolSpec(
    name="storage_bench",
    summary="Filesystem sequential/random throughput, small-file metadata rates, free space and inodes at a path.",
    description=(
        "Use when checkpoints save slowly (torch.save takes minutes), data loading stalls, or to compare "
        "mounts (local NVMe, Lustre, GPFS, Weka, NFS, /scratch): sequential write (fsync) and read, random 4 "
        "KiB reads, small-file create/stat/delete rates, free space and inodes at a path ('No space left on "
        "device'). fio if installed; writes only a temporary directory under the path (~10 s) and removes it. "
        "One stream, not an aggregate benchmark; per-user quotas are not visible to it."),
    Params=StorageParams, Result=StorageResult, run=run, runs="subprocess",
    read_only=False, destructive=False, idempotent=True, open_world=False, timeout_s=300,
    metric="seq_write_mbps", higher_is_better=True, sweep=SWEEP,
)
