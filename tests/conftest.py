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
# plus the worker's number: gw0 -> 0, gw1 -> 1), so the two cluster groups below run at the same time.
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
# `-n 2 --dist loadgroup` sends each group whole to one worker, in file order; xdist's default reordering puts the
# two groups (its largest scopes) first, one on each worker, and the other tests follow on whichever worker is free.
# The modules are split so the two groups take about as long: measured per module (setup + call + teardown) with
# both groups at once on 2 cores, load 17-20 (2026-12-02, instances 1 and 2): isolation_cluster 1,291 s,
# fleet_sweep 501, fleet_sweep_hostile 386 (CLUSTER_B, 2,177 s); fleet_sweep_ssh 476, isolation_ssh_cluster 420,
# dist_across_nodes 249, pair_agent_seat 181, ssh_ranks_cluster 166, straggler_find_cluster 147, slurm_local 118,
# and 10 more, 396 (CLUSTER_A, 2,153 s).
CLUSTER_A, CLUSTER_B = "cluster-a", "cluster-b"
CLUSTER_B_MODULES = {"test_isolation_cluster.py", "test_fleet_sweep_hostile.py", "test_fleet_sweep.py"}
SERIAL_FIXTURES = {"multinode_cluster", "slurm_cluster"}
# These assert on every py-spy of the host, or on which of the host's processes claim a job's ranks: in CLUSTER_A,
# with the cluster modules that run py-spy on the nodes (straggler_find, hang_stack_dump through srun), never
# beside them. The one-node SLURM's modules are in CLUSTER_A too (started once, on one worker).
SERIAL_MODULES = {"test_straggler_find.py", "test_hang_stack_dump.py", "test_security_processes.py"}


# tryfirst: xdist's worker names each item's group (nodeid@group) in its own pytest_collection_modifyitems,
# registered after this conftest and so called before it: marks added after that were never seen, and with
# `-n 2 --dist loadgroup` the cluster tests ran on both workers at once (2026-12-02 clean-clone run; with
# pytest 9 the group is lost as well, see the pin in pyproject.toml).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if (item.get_closest_marker("slurm") or SERIAL_FIXTURES & set(getattr(item, "fixturenames", ()))
                or item.path.name in SERIAL_MODULES):
            item.add_marker(pytest.mark.xdist_group(CLUSTER_B if item.path.name in CLUSTER_B_MODULES else CLUSTER_A))
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
