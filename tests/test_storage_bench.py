"""storage_bench on temp dirs: figures positive with both engines, nothing left behind after success,
failure, cancellation or a killed child; refusals; space and inode verdicts."""

import os
import shutil
import socket
import threading

import pytest

from tools.storage_bench import storage_io as sio
from tools import storage_bench as sb
from tools.engine.spec import ToolFailure
from tools.engine.runner import Cancelled, execute

SMALL = dict(size_mib=8, random_read_s=0.3, small_files=200, time_budget_s=30)
HAS_FIO = shutil.which("fio") is not None


def bench(path, **kw):
    return sb.run(sb.StorageParams(path=str(path), **{**SMALL, **kw}), lambda f, m: None)


def assert_positive_figures(r):
    for name in ("seq_write_mbps", "seq_read_mbps", "rand_read_iops", "rand_read_latency_us",
                 "file_create_per_s", "file_stat_per_s", "file_delete_per_s"):
        assert getattr(r, name) > 0, name
    assert r.bytes_written == 8 * 2**20
    assert 0 <= r.used_pct <= 100 and r.free_gib > 0


def test_python_engine_measures_and_leaves_nothing(tmp_path):
    r = bench(tmp_path, engine="python")
    assert r.engine == "python" and r.engine_note == "engine=python requested"
    assert_positive_figures(r)
    assert r.cleaned_up is True and os.listdir(tmp_path) == []
    assert r.verdict in ("ok", "warn") and "MB/s" in r.findings[0]


@pytest.mark.skipif(not HAS_FIO, reason="fio is not installed (apt-get install fio)")
def test_fio_engine_measures_and_leaves_nothing(tmp_path):
    r = bench(tmp_path, engine="fio")
    assert r.engine == "fio"
    assert_positive_figures(r)
    assert os.listdir(tmp_path) == []


def test_auto_without_fio_uses_python_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(sb.shutil, "which", lambda name: None)
    r = bench(tmp_path)
    assert r.engine == "python" and r.engine_note == "fio is not installed"
    with pytest.raises(ToolFailure, match="fio is not on PATH"):
        bench(tmp_path, engine="fio")
    assert os.listdir(tmp_path) == []


def test_failing_fio_falls_back_to_python(tmp_path, monkeypatch):
    monkeypatch.setattr(sb.shutil, "which", lambda name: "/usr/bin/fio")

    def broken(*a, **k):
        raise ToolFailure("fio write exited 1: boom")

    monkeypatch.setattr(sb, "_fio", broken)
    r = bench(tmp_path)
    assert r.engine == "python" and "fio failed" in r.engine_note and "boom" in r.engine_note
    assert os.listdir(tmp_path) == []


def test_failure_midway_still_removes_the_temp_dir(tmp_path, monkeypatch):
    def explode(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sio, "small_files", explode)
    with pytest.raises(OSError):
        bench(tmp_path, engine="python")
    assert os.listdir(tmp_path) == []


def test_cancel_through_the_runner_kills_the_child_and_removes_its_files(tmp_path):
    target = tmp_path / "fs"  # tmp_path also holds this test's results store
    target.mkdir()
    cancel = threading.Event()
    seen = []

    def progress(fraction, message):
        seen.append(message)
        if "small files" in message:  # the child is busy creating files inside its temp dir
            threading.Timer(0.3, cancel.set).start()

    params = sb.StorageParams(path=str(target), size_mib=4, random_read_s=0, small_files=1_000_000,
                              time_budget_s=120, engine="python")
    with pytest.raises(Cancelled):
        execute(sb.SPEC, params, progress, cancel=cancel, timeout_s=60)
    assert any("small files" in m for m in seen)
    assert os.listdir(target) == []


def test_directory_of_a_sigkilled_run_is_removed_by_the_next_run(tmp_path):
    dead_pid = 2**22 + 12345  # above the default pid_max: never a live process
    stale = tmp_path / f"{sb.PREFIX}{socket.gethostname()}-{dead_pid}-abc"
    stale.mkdir()
    (stale / "seqfile").write_bytes(b"x" * 4096)
    other_host = tmp_path / f"{sb.PREFIX}another-node-{dead_pid}-abc"  # may be a live run elsewhere
    other_host.mkdir()
    r = bench(tmp_path, engine="python", small_files=10)
    assert not stale.exists() and other_host.exists()
    assert any("left by killed runs" in f for f in r.findings)


@pytest.mark.parametrize("make, match", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: (p / "file").write_text("x") and p / "file", "is not a directory"),
])
def test_refuses_unusable_paths(tmp_path, make, match):
    with pytest.raises(ToolFailure, match=match):
        bench(make(tmp_path))


def test_refuses_a_directory_it_cannot_write(tmp_path):
    if os.getuid() == 0:  # root ignores permission bits: use a filesystem nobody may write into
        target = "/sys"
        match = "cannot create a directory|not writable"
    else:
        target = tmp_path / "ro"
        target.mkdir(mode=0o555)
        match = "not writable"
    with pytest.raises(ToolFailure, match=match):
        bench(target)


def test_refuses_when_space_is_short(tmp_path, monkeypatch):
    monkeypatch.setattr(sio, "space", lambda p: sio.Space(10 * 2**30, 5 * 2**20, 99.9, 1000, 1.0))
    with pytest.raises(ToolFailure, match="only 5 MiB free"):
        bench(tmp_path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("used, inodes, verdict, text", [
    (85.0, 10.0, "warn", "Space 85% used"),
    (95.0, 10.0, "fail", "Space 95% used"),
    (10.0, 92.0, "fail", "Inodes 92% used"),
])
def test_space_and_inode_thresholds(tmp_path, monkeypatch, used, inodes, verdict, text):
    real = sio.space(str(tmp_path))
    monkeypatch.setattr(sio, "space", lambda p: sio.Space(real.total_bytes, real.avail_bytes, used, 1000, inodes))
    r = bench(tmp_path, engine="python", small_files=10)
    assert r.verdict == verdict and r.findings[0].startswith(text)


def test_slow_filesystem_warns(tmp_path):
    r = sb.StorageResult(path="/x", seq_write_mbps=50.0, seq_read_mbps=400.0, file_create_per_s=100.0,
                         used_pct=10.0, direct_io=True, engine="python")
    sb._judge(r)
    assert r.verdict == "warn"
    assert any("under 100 MB/s" in f for f in r.findings) and any("500 file creates" in f for f in r.findings)


def test_block_size_must_suit_direct_io():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="multiple of 4"):
        sb.StorageParams(block_kib=6)


def test_without_direct_io_it_drops_the_cache_and_says_so(tmp_path, monkeypatch):
    r = bench(tmp_path, engine="python", direct_io="off")
    assert r.direct_io is False and r.seq_read_mbps > 0
    assert any("O_DIRECT not used" in f for f in r.findings)
    monkeypatch.setattr(sio, "direct_io_supported", lambda d: False)
    with pytest.raises(ToolFailure, match="O_DIRECT is not supported"):
        bench(tmp_path, direct_io="on")
    assert os.listdir(tmp_path) == []
