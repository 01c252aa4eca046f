"""A real local SLURM cluster for tests (scripts/slurm-local.sh), one per test session.

    from tests.slurm_cluster import slurm_cluster   # noqa: F401  (the fixture)

    @pytest.mark.slurm
    def test_x(slurm_cluster): ...

Two logical nodes n1, n2 on this host (4 CPUs and 1 fake GPU each), partitions debug (default) and
gpu, accounting through slurmdbd + MariaDB unless MLENG_SLURM_ACCOUNTING=0. It starts with the
first module that uses it (installing the Debian packages on a fresh machine, ~30 s; ~4 s when
installed) and stops at the end of the session. Each module finds no job queued or running and both
nodes idle, and its jobs must be gone when it ends. The fixture points SLURM_CONF at it for the
module's tests and every tool they run. Each cluster gets its own directory and free ports, so pytest sessions running
side by side on one machine (CI shards, several engineers) never restart each other's cluster.
Where it cannot start (not root, no apt, packages unavailable, daemons fail) every test using it is
skipped with the reason.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "slurm-local.sh"
START_TIMEOUT_S = 200
TERMINAL = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}


class Cluster:
    def __init__(self, conf: str, accounting: bool, nodes: list[str]):
        self.conf = conf
        self.accounting = accounting
        self.nodes = nodes

    def cmd(self, *argv: str, check: bool = True) -> str:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60,
                              env={**os.environ, "SLURM_CONF": self.conf})
        if check and proc.returncode:
            raise AssertionError(f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def sbatch(self, *args: str, cwd: Path) -> str:
        return self.cmd("sbatch", "--parsable", f"--chdir={cwd}", *args).strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        out = self.cmd("scontrol", "show", "job", "-o", job_id, check=False)
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def wait_state(self, job_id: str, states: set[str] = TERMINAL, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        state = self.job_state(job_id)
        while state not in states and time.monotonic() < deadline:
            time.sleep(0.25)
            state = self.job_state(job_id)
        return state

    def cancel_jobs(self, grace_s: float = 15) -> list[str]:
        """Cancel every job still pending, running or suspended, wait until none is left, and say which there
        were ('ID STATE NAME'). A job just cancelled or ended is 'completing' for a moment: not left."""
        left = self.cmd("squeue", "-h", "-t", "PD,R,S,CF", "-o", "%i %T %j", check=False).splitlines()
        if left:
            self.cmd("scancel", *[row.split()[0] for row in left], check=False)
        deadline = time.monotonic() + grace_s
        while self.cmd("squeue", "-h", "-o", "%i", check=False).strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def wait_nodes_idle(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = set(self.cmd("sinfo", "-h", "-N", "-o", "%T", check=False).split())
            if states == {"idle"}:
                return
            time.sleep(0.2)
        raise AssertionError(f"nodes did not return to idle: {self.cmd('sinfo', '-N', check=False)}")


def _why_not() -> str | None:
    if os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the local SLURM cluster needs root (it starts munged, slurmctld and slurmd)"
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "SLURM is not installed and there is no apt-get to install slurmctld/slurmd/munge"
    return None


def _free_port_base(span: int = 5) -> int:
    """A base port P with P..P+span-1 free on this host (slurmctld, 2 slurmd, slurmdbd, MariaDB)."""
    for _ in range(50):
        base = random.randrange(20000, 40000, 10)
        try:
            socks = []
            for port in range(base, base + span):
                s = socket.socket()
                socks.append(s)
                s.bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range for the local SLURM cluster")


@pytest.fixture(scope="session")
def slurm_cluster_session():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    accounting = os.environ.get("MLENG_SLURM_ACCOUNTING", "1") != "0"
    cluster_dir = tempfile.mkdtemp(prefix="slurm-local-test-")
    env = {**os.environ, "NODES": "2", "CPUS": "4", "GPUS": "1", "ACCOUNTING": "1" if accounting else "0",
           "SLURM_LOCAL_DIR": cluster_dir, "PORT_BASE": str(_free_port_base())}
    env.pop("SLURM_CONF", None)

    def stop():
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(cluster_dir, ignore_errors=True)
        Path(cluster_dir + ".op.lock").unlink(missing_ok=True)

    try:
        proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, env=env,
                              timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop()
        pytest.skip(f"the local SLURM cluster did not start within {START_TIMEOUT_S} s")
    if proc.returncode != 0:
        stop()
        pytest.skip(f"the local SLURM cluster did not start: {proc.stderr.strip()[-800:]}")
    try:
        yield Cluster(f"{cluster_dir}/etc/slurm.conf", accounting, ["n1", "n2"])
    finally:
        stop()


@pytest.fixture(scope="module")
def slurm_cluster(slurm_cluster_session):
    cluster = slurm_cluster_session
    left = cluster.cancel_jobs()
    cluster.wait_nodes_idle()
    assert not left, f"an earlier module left jobs on the local SLURM (cancelled now): {left}"
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.conf  # tools under test (and their child processes) find the cluster
    try:
        yield cluster
        # What a module's tests started, they stop: the next module shares this cluster.
        left = cluster.cancel_jobs()
        assert not left, f"jobs still queued or running after the module's last test (cancelled now): {left}"
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
