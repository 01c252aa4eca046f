"""The namespace cluster for one bench run, and a CPU hog outside its nodes (bench/*_rates.py).

    with cluster_session(8) as cluster:     # session lock taken, 8 nodes up, SLURM_CONF set for this process
        with cpu_hog():                      # one busy-looping process in the head namespace
            ...
        cluster.inject(...)                  # faults die with the cluster: stop removes the namespaces

One session per measured run, not one for the whole bench: the cluster is one per machine and shared by
several engineers' tests, which wait on the same lock (/tmp/mln-cluster.session.lock) and run between two
of our runs. A start costs 10-30 s on 2 shared cores. Root, Debian 12 (scripts/cluster-local.sh).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# the cluster's names (folder, session lock, script) and ways in are the drills' (one place for them)
from tools.evals.drills import cluster as namespace_cluster  # noqa: E402


class Cluster:
    def __init__(self, nodes: int):
        self.nodes = [f"mln{k}" for k in range(1, nodes + 1)]

    @staticmethod
    def script(*args: str) -> str:
        return namespace_cluster.cluster_script(*args).stdout    # we hold the session lock

    def on_node(self, node: str, *argv: str) -> None:
        namespace_cluster.on_node(node, *argv)

    def throttled(self, node: str) -> tuple[int, int]:
        """(CFS periods, periods throttled) of the node's cgroup so far."""
        stat = dict(line.split() for line in (namespace_cluster.NODE_CGROUPS / node / "cpu.stat").read_text().splitlines())
        return int(stat["nr_periods"]), int(stat["nr_throttled"])

    def slurmd_pid(self, node: str) -> int:
        return namespace_cluster.slurmd_pid(node)


@contextmanager
def cluster_session(nodes: int):
    """Hold the session lock, start `nodes` nodes, point SLURM_CONF at them; stop and release after."""
    lock = open(namespace_cluster.SESSION_LOCK, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)   # waits in the kernel's queue behind other sessions
    old = os.environ.get("SLURM_CONF")
    try:
        out = Cluster.script("start", str(nodes))
        os.environ["SLURM_CONF"] = out.split("SLURM_CONF=")[1].split()[0]
        yield Cluster(nodes)
    finally:
        try:
            Cluster.script("stop")
        finally:
            lock.close()
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old


@contextmanager
def cpu_hog(enabled: bool = True):
    """One busy-looping Python process in the head namespace (outside every node's cgroup)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if enabled else None
    try:
        yield hog
    finally:
        if hog:
            hog.kill()
            hog.wait()


def host_load() -> str:
    """The host's 1/5/15-minute load averages and core count, for the record beside every rate."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}/{fifteen:.1f} on {os.cpu_count()} cores"
