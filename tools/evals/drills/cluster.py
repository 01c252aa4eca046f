"""The namespace SLURM cluster of scripts/cluster-local.sh, as the drills and the cluster tests reach it.

One place for its names (folder, session lock, ports, node addresses, namespaces, cgroups) and the ways
in: the script, a command inside a node's network namespace, the session lock that keeps one user of the
cluster at a time (tests/multinode_cluster.py takes the same lock for a test module).

Instances: MLN_CLUSTER_INSTANCE=I (0..9, read once at import; default 0, the names below) selects a
cluster that runs beside the others (one per parallel test worker). Each has its own namespaces,
bridge, subnet 10.213.I.0/24, cgroups, folder, ports, job ids and session lock; its SLURM nodes and
hostnames are mln1..mlnN in every instance. scripts/cluster-local.sh derives the same names.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from ...engine.data import PACKAGE_DIR
from .stamps import ProcessStamp, start_detached

CLUSTER_SCRIPT = PACKAGE_DIR.parent / "scripts" / "cluster-local.sh"   # a checkout's; the wheel has none


class DrillError(RuntimeError):
    pass


def _instance() -> int:
    value = os.environ.get("MLN_CLUSTER_INSTANCE", "0")
    if not re.fullmatch(r"[0-9]", value):
        raise DrillError(f"MLN_CLUSTER_INSTANCE must be one digit, 0..9 (which namespace cluster); got {value!r}")
    return int(value)


INSTANCE = _instance()
CLUSTER_DIR = "/tmp/mln-cluster" if INSTANCE == 0 else f"/tmp/i{INSTANCE}mln-cluster"   # neither a prefix of another
SESSION_LOCK = f"{CLUSTER_DIR}.session.lock"       # /tmp/mln-cluster.session.lock for instance 0
NETNS_PREFIX = "mln" if INSTANCE == 0 else f"i{INSTANCE}mln"   # node mlnK's network namespace: NETNS_PREFIX + K
BRIDGE = f"mlnbr{INSTANCE}"
SUBNET = f"10.213.{INSTANCE}"                      # node K at SUBNET.K, the head (host) at SUBNET.254
HEAD_ADDRESS = f"{SUBNET}.254"
NODE_CGROUPS = Path(f"/sys/fs/cgroup/cpu/{NETNS_PREFIX}")   # the script's cpu cgroup per node (cgroup v1): .../mlnK
PORT_BASE = 7817 + 10 * INSTANCE                   # slurmctld's port; each node's slurmd listens on the next
NODE_NAME = re.compile(r"mln[1-8]")               # the script's nodes: mln1..mlnN, N = 1..8


def cluster_env() -> dict[str, str]:
    env = {**os.environ, "CLUSTER_LOCAL_DIR": CLUSTER_DIR, "PORT_BASE": str(PORT_BASE), "MLN_CLUSTER_SESSION": "held",
           "MLN_CLUSTER_INSTANCE": str(INSTANCE), "MLN_SESSION_LOCK": SESSION_LOCK}
    env.pop("SLURM_CONF", None)
    return env


def slurm_env() -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": f"{CLUSTER_DIR}/etc/slurm.conf"}


def run(argv: list[str], env: dict | None = None, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env or slurm_env(), timeout=timeout)
    if check and proc.returncode:
        raise DrillError(f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr.strip()[-600:]}")
    return proc


def cluster_script(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    if not CLUSTER_SCRIPT.is_file():
        raise DrillError("cluster drills need a checkout of mleng (scripts/cluster-local.sh); the wheel does not ship it")
    return run(["bash", str(CLUSTER_SCRIPT), *args], env=cluster_env(), check=check, timeout=timeout)


def cluster_nodes() -> list[str]:
    try:
        return Path(f"{CLUSTER_DIR}/nodes").read_text().split()
    except FileNotFoundError:
        return []


def _known(node: str) -> str:
    if not NODE_NAME.fullmatch(node):
        raise DrillError(f"{node!r} is not a node of the namespace cluster (mln1..mln8)")
    return node


def netns(node: str) -> str:
    """The network namespace of node mlnK in this instance (mlnK itself in instance 0)."""
    return NETNS_PREFIX + _known(node).removeprefix("mln")


def host_link(node: str) -> str:
    """The host's end of the node's veth (on the cluster's bridge): down there, the node's link is down."""
    return f"{netns(node)}-h"


def in_node(node: str, *argv: str) -> list[str]:
    """argv run inside a node's network namespace (and its /etc/hosts), as `ip netns exec` does."""
    return ["ip", "netns", "exec", netns(node), *argv]


def on_node(node: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(in_node(node, *argv), check=check)


def address(node: str) -> str:
    """mlnK's address on the cluster's bridge (cluster-local.sh gives node K SUBNET.K, 10.213.0.K in instance 0)."""
    return f"{SUBNET}.{int(_known(node).removeprefix('mln'))}"


def node_cgroup_tasks(node: str) -> Path:
    """The tasks file of a node's cpu cgroup: a pid written there runs on that node's CPU share."""
    tasks = NODE_CGROUPS / _known(node) / "tasks"
    if not tasks.is_file():
        raise DrillError(f"{tasks} is missing: is the namespace cluster up with {node}?")
    return tasks


def slurmd_pid(node: str) -> int:
    return int(Path(f"{CLUSTER_DIR}/run/slurmd-{_known(node)}.pid").read_text())


def sshd_pid(node: str) -> int:
    return int(Path(f"{CLUSTER_DIR}/run/sshd-{_known(node)}.pid").read_text())


def why_no_cluster() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return "cluster drills need root (network namespaces, a bridge, SLURM daemons)"
    for tool in ("ip", "tc", "nsenter", "flock"):
        if not shutil.which(tool):
            return f"cluster drills need {tool} (iproute2 / util-linux)"
    if not CLUSTER_SCRIPT.is_file():
        return "cluster drills need a checkout of mleng (scripts/cluster-local.sh); the wheel does not ship it"
    return None


def hold_session_lock(wait_s: float, record: Callable[[ProcessStamp], None]) -> ProcessStamp:
    """A detached process that holds the cluster's session lock until `drill stop` ends it; `record` gets
    its stamp before it takes the lock (stamps.start_detached)."""
    # A blocking flock waits in the kernel's queue beside `flock -w` and the test sessions (a poller that
    # sleeps between tries loses the lock to them every time it is released); SIGALRM ends the wait.
    code = ("import fcntl,signal\n"
            f"h=open({SESSION_LOCK!r},'w')\n"
            "signal.signal(signal.SIGALRM,lambda *a: sys.exit(3))\n"
            f"signal.alarm({max(1, int(wait_s))})\n"
            "fcntl.flock(h,fcntl.LOCK_EX)\n"
            "signal.alarm(0)\n"
            "print('held',flush=True)\nsignal.pause()\n")
    stamps = []
    proc, line = start_detached(code, lambda stamp: (stamps.append(stamp), record(stamp)))
    if line != "held":
        proc.wait()
        raise DrillError(f"the namespace cluster is in use ({SESSION_LOCK} held for more than {wait_s:.0f} s); "
                         "a test run or another drill has it")
    return stamps[0]


def lock_is_ours() -> bool:
    """True when our caller already holds the session lock (a test session that says so)."""
    return os.environ.get("MLN_CLUSTER_SESSION") == "held"
