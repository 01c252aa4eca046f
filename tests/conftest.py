"""Shared test setup: every test gets its own results store, GPU tests skip without a GPU, and tests
marked gpu_child run in a pytest process of their own."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `import server` and `import evals` from the tests

# Each xdist worker has a namespace cluster of its own (scripts/cluster-local.sh, instance = the one given, default 0,
# plus the worker's number: gw0 -> 0, gw1 -> 1), so the cluster groups below run at the same time.
# tools/evals/drills/cluster.py reads MLN_CLUSTER_INSTANCE once, at import, which is after this line.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    os.environ["MLN_CLUSTER_INSTANCE"] = str((int(os.environ.get("MLN_CLUSTER_INSTANCE", "0")) + int(_WORKER[2:])) % 10)

# The session's one-node SLURM: every module's `slurm_cluster` fixture draws on it.
from tests.slurm_cluster import slurm_cluster_session  # noqa: E402,F401  (fixture)


@pytest.fixture(autouse=True)
def mleng_home(tmp_path, monkeypatch):
    """Results store, locks and job files of this test live in a temp dir, never the user's."""
    home = tmp_path / "mleng-home"
    monkeypatch.setenv("MLENG_HOME", str(home))
    return home


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _has_nvidia_gpu() -> bool:
    from tools.engine.processes import local_gpu_count

    return local_gpu_count() > 0


# What must not run beside another test of its kind under pytest-xdist: the tests of the namespace cluster (one per
# worker, see above: a module's faults and restarts must not meet another module's tests on the same cluster) and
# of the one-node SLURM (one per worker session), and the modules that check /tmp or the process table around them.
# `--dist loadgroup` sends each group whole to one worker, in file order; xdist's default reordering hands out the
# groups with the most tests first, one per worker, and the other tests follow on whichever worker is free.
# Three cluster groups, so that with `-n 4` they run side by side and the fourth worker takes the rest. A cluster
# costs nothing to start per module (8 nodes: 0.4 s up, 0.6 s down, 2026-12-05), so a module split across two groups
# (the bisect tests of test_isolation_cluster.py) only starts one more cluster. Their tests' seconds under `-n 4` on
# a clean clone (2026-12-05, load 15-17 on 2 cores): cluster-fleet 1,675, cluster-links 1,594, cluster-ranks 1,398,
# the rest 1,477 (docs/benchmarks.md, thirteenth session).
CLUSTER_LINKS, CLUSTER_FLEET, CLUSTER_RANKS = "cluster-links", "cluster-fleet", "cluster-ranks"
# Module, or module::test-name prefix, to its group; a grouped test found in none goes to CLUSTER_RANKS, which
# holds the one-node SLURM (started once, on one worker).
CLUSTER_GROUP_OF = {
    "test_isolation_cluster.py::test_bisect": CLUSTER_FLEET,
    "test_isolation_cluster.py": CLUSTER_LINKS,
    "test_isolation_ssh_cluster.py": CLUSTER_LINKS,
    "test_pair_agent_seat.py": CLUSTER_LINKS,
    "test_nic_health_cluster.py": CLUSTER_LINKS,
    "test_launch_script_cluster.py": CLUSTER_LINKS,
    "test_fleet_sweep.py": CLUSTER_FLEET,
    "test_fleet_sweep_hostile.py": CLUSTER_FLEET,
    "test_fleet_sweep_ssh.py": CLUSTER_LINKS,
    "test_transport_srun.py": CLUSTER_FLEET,
    "test_cluster_local.py": CLUSTER_FLEET,
    "test_on_node.py": CLUSTER_FLEET,
}
SERIAL_FIXTURES = {"multinode_cluster", "slurm_cluster"}
# These assert on every py-spy of the host, or on which of the host's processes claim a job's ranks: in CLUSTER_RANKS,
# with the cluster modules that run py-spy on the nodes (straggler_find, hang_stack_dump through srun, the same over
# ssh), never beside them.
SERIAL_MODULES = {"test_straggler_find.py", "test_hang_stack_dump.py", "test_security_processes.py"}


def cluster_group(item) -> str:
    """The xdist group of a test that needs a cluster or a quiet process table (CLUSTER_GROUP_OF)."""
    name = item.path.name
    for key, group in CLUSTER_GROUP_OF.items():     # the longer, test-name keys come first
        module, _, prefix = key.partition("::")
        if module == name and item.name.startswith(prefix):
            return group
    return CLUSTER_RANKS


# tryfirst: xdist's worker names each item's group (nodeid@group) in its own pytest_collection_modifyitems,
# registered after this conftest and so called before it: marks added after that were never seen, and with
# `-n 2 --dist loadgroup` the cluster tests ran on both workers at once (2026-12-02 clean-clone run; with
# pytest 9 the group is lost as well, see the pin in pyproject.toml).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if (item.get_closest_marker("slurm") or SERIAL_FIXTURES & set(getattr(item, "fixturenames", ()))
                or item.path.name in SERIAL_MODULES):
            item.add_marker(pytest.mark.xdist_group(cluster_group(item)))
    if any(item.get_closest_marker("gpu") for item in items) and not _has_nvidia_gpu():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML finds none); run on the GPU machine with -m gpu")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


# A test that allocates on the GPU in the pytest process leaves the caching allocator's blocks reserved
# after it ends (an H200 run kept ~108 GiB and the next test ran out of memory; alone it passed). Only
# the end of a process returns all of it, so such a test runs in a child pytest of its own.
CHILD_ENV = "MLENG_IN_TEST_CHILD"
CHILD_TIMEOUT_S = 280     # under pytest-timeout's 300 s for the parent test


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if pyfuncitem.get_closest_marker("gpu_child") is None or os.environ.get(CHILD_ENV):
        return None
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", "gpu_child", pyfuncitem.nodeid]
    try:
        proc = subprocess.run(cmd, cwd=pyfuncitem.config.rootpath, env={**os.environ, CHILD_ENV: "1"},
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{pyfuncitem.nodeid} ran past {CHILD_TIMEOUT_S} s in its child pytest:\n"
                    f"{(exc.stdout or b'')[-4000:]!r}", pytrace=False)
    sys.stdout.write(proc.stdout[-20_000:])     # FIGURE lines reach the parent's -s output
    if proc.returncode != 0 or " passed" not in proc.stdout:
        pytest.fail(f"{pyfuncitem.nodeid} in its child pytest: exit {proc.returncode}\n"
                    f"{(proc.stdout + proc.stderr)[-6000:]}", pytrace=False)
    return True
