"""The ranks' scratch TMPDIR: a private folder per run that a killed run does not leave behind for good.

torchelastic writes a torchelastic_* folder into TMPDIR per run and never removes it, so every launch
gives its torchrun a folder of its own and removes it at the end. A run killed with SIGKILL (a server
stopped from outside, a task killed after SLURM's KillWait) runs no cleanup: the eleventh session found
78 such folders in /tmp. So the process that makes a folder also holds an flock on it for as long as it
lives (the kernel drops the lock on any death), and each new run first removes the folders with the same
prefix that are this user's, not links, not locked and older than STALE_AFTER_S (the age closes the
moment between another run's mkdtemp and its flock). The srun tasks do the same in bash
(slurm.srun_torchrun_command), with flock(1) on the same folders.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time

RANKS_PREFIX = "mleng-ranks-"
STALE_AFTER_S = 60.0


def sweep_abandoned(base: str | None = None) -> list[str]:
    """Remove folders in `base` (default: the temp dir) named RANKS_PREFIX* that no living process holds.
    Returns the paths removed. Another user's folder, a link or a locked folder is never touched."""
    base = base or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(RANKS_PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or time.time() - st.st_mtime < STALE_AFTER_S:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue    # its owner is alive
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


class LockedScratch:
    """A fresh 0700 folder (mkdtemp) held locked by this process until remove()."""

    def __init__(self, prefix: str = RANKS_PREFIX):
        if not prefix.startswith(RANKS_PREFIX):
            raise ValueError(f"prefix {prefix!r} must start with {RANKS_PREFIX!r}, which the sweep looks for")
        sweep_abandoned()
        self.path = tempfile.mkdtemp(prefix=prefix)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
