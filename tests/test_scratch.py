"""Scratch folders of runs killed with SIGKILL are removed by the next run, and nothing else is
(eleventh session: 78 mleng-ranks-* folders were left in /tmp by runs killed from outside)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tools.shared import slurm as _slurm
from tools.shared.scratch import LockedScratch, sweep_abandoned

HOLD = ("import sys, time\nfrom tools.shared.scratch import LockedScratch\n"
        "s = LockedScratch(sys.argv[1])\nprint(s.path, flush=True)\ntime.sleep(60)\n")


def _holder(tmp_path, prefix="mleng-ranks-"):
    """A process that made a LockedScratch in tmp_path and keeps it: (process, its folder)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, prefix], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)}, cwd=os.getcwd())
    path = proc.stdout.readline().strip()
    assert path.startswith(str(tmp_path / prefix)), path
    return proc, path


def _age(path, seconds=120):
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_killed_holders_folder_is_removed_and_a_living_ones_is_kept(tmp_path):
    dead, dead_path = _holder(tmp_path, "mleng-ranks-ssh-")
    alive, alive_path = _holder(tmp_path)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        (tmp_path / os.path.basename(dead_path) / "torchelastic_x").mkdir()
        for p in (dead_path, alive_path):
            _age(p)
        assert sweep_abandoned(str(tmp_path)) == [dead_path]
        assert os.path.isdir(alive_path)
    finally:
        alive.kill()
        alive.wait()


def test_the_sweep_leaves_young_foreign_and_linked_folders(tmp_path):
    young = tmp_path / "mleng-ranks-young"
    young.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    _age(target)
    (tmp_path / "mleng-ranks-link").symlink_to(target)
    other = tmp_path / "mleng-ranks-other"
    other.mkdir()
    _age(other)
    (tmp_path / "not-ours").mkdir()
    _age(tmp_path / "not-ours")
    if os.geteuid() == 0:
        os.chown(other, 65534, 65534)
        assert sweep_abandoned(str(tmp_path)) == []
    assert young.is_dir() and target.is_dir() and (tmp_path / "not-ours").is_dir()
    with pytest.raises(ValueError, match="must start with"):
        LockedScratch("other-")


def test_a_new_locked_scratch_sweeps_first_and_removes_its_own(tmp_path, monkeypatch):
    stale = tmp_path / "mleng-ranks-run-old"
    stale.mkdir()
    _age(stale)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    s = LockedScratch()
    assert not stale.exists() and os.path.isdir(s.path)
    s.remove()
    assert list(tmp_path.iterdir()) == []


def test_an_srun_task_sweeps_the_nodes_abandoned_folders_and_holds_its_own(tmp_path):
    """The bash per task does what LockedScratch does: the lock one holds is seen by the other."""
    alive, alive_path = _holder(tmp_path)
    stale = tmp_path / "mleng-ranks-abcd1234-x1"
    stale.mkdir()
    young = tmp_path / "mleng-ranks-abcd1234-x2"
    young.mkdir()
    for p in (alive_path, stale):
        _age(p)
    stub = tmp_path / "py"
    # the task's python: its TMPDIR is held, so a sweep from here (another run) must keep it
    stub.write_text(f"#!{sys.executable}\nimport os, sys\nsys.path.insert(0, {os.getcwd()!r})\n"
                    "from tools.shared.scratch import sweep_abandoned\n"
                    "os.utime(os.environ['TMPDIR'], (0, 0))\n"
                    "print(sweep_abandoned(os.path.dirname(os.environ['TMPDIR'])))\n")
    stub.chmod(0o755)
    cmd = _slurm.srun_torchrun_command(["m"], nnodes=1, nproc_per_node=1, rdzv_host="h", python=str(stub),
                                       env={"SLURM_JOB_ID": "42"})
    try:
        out = subprocess.run(["bash", "-c", cmd[-1]], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"], "SLURM_PROCID": "0", "TMPDIR": str(tmp_path)})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[]"       # nothing left to sweep, and its own folder held
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["py", os.path.basename(alive_path), young.name])
    finally:
        alive.kill()
        alive.wait()
