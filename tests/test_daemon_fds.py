"""The SLURM scripts start daemons with none of their caller's open files.

A munged started by `flock /tmp/mln-cluster.session.lock scripts/cluster-local.sh start` inherited the
locked file as fd 3 and held the cluster session lock after the session ended, so every later session
waited for it. `detached` (scripts/slurm-local.sh) closes every descriptor above 2 before the daemon runs.
"""

import fcntl
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_a_detached_daemon_keeps_no_inherited_descriptor_and_no_lock(tmp_path):
    lock = tmp_path / "session.lock"
    lock.touch()
    # The caller holds the lock on fd 3 (as `flock FILE cmd` passes it) and has another file open on fd 7.
    # Each "daemon" lists its descriptors and leaves a child running past its caller's end, as a daemon that
    # forks away (munged, slurmctld: `detached`) or one kept in the background (mariadbd) does.
    script = (f'. "{SCRIPTS}/slurm-local.sh"; exec 3<"{lock}" 7>/dev/null; flock -x 3; '
              f'detached bash -c \'ls /proc/$$/fd > "{tmp_path}/fds-forked"; sleep 3 &\'; '
              f'( close_inherited_fds; exec bash -c \'ls /proc/$$/fd > "{tmp_path}/fds-bg"; sleep 3\' ) & '
              'sleep 0.5')
    subprocess.run(["bash", "-c", script], check=True, timeout=30)
    for listing in ("fds-forked", "fds-bg"):
        assert sorted(int(fd) for fd in (tmp_path / listing).read_text().split()) == [0, 1, 2], listing
    # The caller is gone and the daemon still runs: the lock must be free.
    with open(lock) as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
