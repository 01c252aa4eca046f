"""A multi-node SLURM cluster on this machine for tests (scripts/cluster-local.sh), one per module.

    from tests.multinode_cluster import multinode_cluster   # noqa: F401  (the fixture)

    @pytest.mark.slurm
    def test_x(multinode_cluster): ...

Four nodes mln1..mln4 (MLENG_CLUSTER_NODES=1..8 changes it), each a network + UTS namespace with
its own hostname and address 10.213.0.K on the bridge mlnbr0, one slurmd per node, slurmctld on the
host. The fixture points SLURM_CONF at it for the module, heals injected faults between tests when
asked (`cluster.heal()`), and stops it after the module's last test. One such cluster per instance
(MLN_CLUSTER_INSTANCE, tools/evals/drills/cluster.py: instance 0 has the names above, instance 1
i1mln1.. on mlnbr1 at 10.213.1.K; tests/conftest.py gives each xdist worker its own): a session holds
the instance's lock (/tmp/mln-cluster.session.lock for instance 0) for the module and a second session
waits for it (up to MLENG_CLUSTER_WAIT_S, default 240 s, under pytest-timeout's 300) or skips. Where the cluster cannot start (not root, no `ip netns`, SLURM not installable) every test
using it skips with why.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

# The cluster's names (folder, lock, ports, addresses) have one home, shared with the fault drills.
from tools.evals.drills.cluster import (BRIDGE, CLUSTER_DIR, CLUSTER_SCRIPT as SCRIPT, HEAD_ADDRESS, NETNS_PREFIX,
                                        NODE_CGROUPS, PORT_BASE, SESSION_LOCK, address, cluster_env, in_node, netns,
                                        slurmd_pid)

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 200


class MultiNodeCluster:
    def __init__(self, conf: str, nodes: list[str], env: dict[str, str]):
        self.conf = conf
        self.nodes = nodes
        self.env = env
        self.slurmd_port = PORT_BASE + 1

    def script(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout)
        if proc.returncode:
            raise AssertionError(f"cluster-local.sh {' '.join(args)} -> {proc.returncode}: {proc.stderr[-800:]}")
        return proc.stdout

    def cmd(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "SLURM_CONF": self.conf})
        if check and proc.returncode:
            raise AssertionError(f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr.strip()[-800:]}")
        return proc

    def on_node(self, node: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside a node's network namespace (fault injection, inspection)."""
        return self.cmd(*in_node(node, *argv), check=check)

    address = staticmethod(address)
    netns = staticmethod(netns)
    slurmd_pid = staticmethod(slurmd_pid)
    head_address = HEAD_ADDRESS      # the host on the cluster's bridge
    bridge = BRIDGE
    netns_prefix = NETNS_PREFIX
    cgroups = NODE_CGROUPS

    def kill_slurmd(self, node: str) -> None:
        os.kill(self.slurmd_pid(node), 9)

    def cpu_limit(self, node: str, percent: int) -> None:
        self.script("cpu", node, str(percent))

    def cpu_throttled(self, node: str) -> tuple[int, int]:
        """(CFS periods, periods throttled) of the node's cgroup so far: whether a CPU limit bound."""
        stat = dict(line.split() for line in (NODE_CGROUPS / node / "cpu.stat").read_text().splitlines())
        return int(stat["nr_periods"]), int(stat["nr_throttled"])

    def heal(self, *nodes: str) -> None:
        self.script("heal", *nodes)

    def node_pids(self, node: str) -> list[int]:
        out = self.cmd("ip", "netns", "pids", self.netns(node), check=False).stdout
        return [int(p) for p in out.split()]

    def connect_rtt_s(self, node: str, samples: int = 5) -> float:
        """Median TCP connect time from the head to the node's slurmd: one round trip each."""
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            with socket.create_connection((self.address(node), self.slurmd_port), timeout=5):
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]


def _why_not() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return "the multi-node cluster needs root (network namespaces, a bridge, SLURM daemons)"
    if not shutil.which("ip") or not shutil.which("nsenter") or not shutil.which("unshare"):
        return "the multi-node cluster needs iproute2 (ip) and util-linux (nsenter, unshare)"
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "SLURM is not installed and there is no apt-get to install slurmctld/slurmd/munge"
    probe = subprocess.run(["ip", "netns", "add", f"{NETNS_PREFIX}probe"], capture_output=True, text=True)
    if probe.returncode:
        return f"cannot create a network namespace here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"{NETNS_PREFIX}probe"], capture_output=True)
    return None


def _session_lock():
    handle = open(SESSION_LOCK, "w")
    if os.environ.get("MLN_CLUSTER_SESSION") == "held":
        # The caller already holds the session lock (`flock -w 900 /tmp/mln-cluster.session.lock env
        # MLN_CLUSTER_SESSION=held python -m pytest ...`, as for manual runs): waiting in the kernel's queue
        # is fairer than polling here, and a second lock on a new descriptor would wait for ourselves.
        return handle
    deadline = time.monotonic() + float(os.environ.get("MLENG_CLUSTER_WAIT_S", "240"))
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                return None
            time.sleep(1)


@pytest.fixture(scope="module")
def multinode_cluster():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    lock = _session_lock()
    if lock is None:
        pytest.skip(f"another test session holds the multi-node cluster ({SESSION_LOCK})")
    count = os.environ.get("MLENG_CLUSTER_NODES", "4")
    env = cluster_env()  # MLN_CLUSTER_SESSION=held: we hold the session lock, the script may start/stop

    def stop():
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(CLUSTER_DIR, ignore_errors=True)
        Path(CLUSTER_DIR + ".op.lock").unlink(missing_ok=True)  # the session lock stays: waiters hold it

    try:
        proc = subprocess.run(["bash", str(SCRIPT), "start", count], capture_output=True, text=True,
                              env=env, timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc = None
    if proc is None or proc.returncode != 0:
        stop()
        lock.close()
        why = "timed out" if proc is None else proc.stderr.strip()[-800:]
        pytest.skip(f"the multi-node cluster did not start: {why}")
    conf = f"{CLUSTER_DIR}/etc/slurm.conf"
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf  # tools under test (and their child processes) find the cluster
    try:
        yield MultiNodeCluster(conf, [f"mln{k}" for k in range(1, int(count) + 1)], env)
    finally:
        stop()
        lock.close()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
