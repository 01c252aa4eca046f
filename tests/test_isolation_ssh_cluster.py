"""collective_bench pairwise over SSH on the namespace cluster: the SSH twins of test_isolation_cluster.py.

One sshd per node (scripts/cluster-local.sh sshd: in the node's namespaces and cgroup, keys made for the
cluster), hosts=["mln[1-4]"] with MLENG_TRANSPORT=ssh (the cluster's SLURM stays configured, and is used
for the srun runs beside them). Faults injected from outside as the SLURM twins do: a 50 Mbit/s tbf on one
node's link, the same limit between two nodes only (htb), a node whose sshd is dead. gloo on CPU at small sizes, as there.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (fixture)
from tests.test_fleet_sweep import wait_clean
from tests.test_fleet_sweep_ssh import ssh_cluster  # noqa: F401  (fixture: an sshd per node)
from tests.test_isolation_cluster import bench, no_ranks_left, rate_limit, suspects
from tools.collective_bench import SPEC
from tools.engine.transport import SSH_CONFIG_ENV, TRANSPORT_ENV

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(2400)]

SSH_SMALL = dict(backend="gloo", nproc_per_node=1, min_bytes="32K", max_bytes="256K", factor=8, iters=3, warmup=1,
                 pg_timeout_s=30, slow_margin=0.8, slow_latency_factor=12, plot=False)


@pytest.fixture
def over_ssh(ssh_cluster, monkeypatch):
    from tools.evals.drills.cluster import CLUSTER_DIR

    monkeypatch.setenv(TRANSPORT_ENV, "ssh")
    monkeypatch.setenv(SSH_CONFIG_ENV, f"{CLUSTER_DIR}/ssh/config")
    yield ssh_cluster
    ssh_cluster.heal()


def bench_ssh(**params) -> dict:
    """One call from here: the tool starts every rank on the hosts over ssh."""
    result = SPEC.run(SPEC.Params(hosts=["mln[1-4]"], **SSH_SMALL, **params), lambda f, m: None)
    return result.model_dump()


def test_healthy_pairwise_over_ssh_names_nothing_and_srun_on_the_same_nodes_neither(over_ssh, monkeypatch, capsys):
    """Alternated in one run, srun (an allocation of the same 4 nodes) and ssh: both clean; the wall times
    go to docs/benchmarks.md."""
    times: dict[str, list[float]] = {"srun": [], "ssh": []}
    for _ in range(int(os.environ.get("MLENG_SSH_BENCH_REPEATS", "1"))):
        for launcher in ("srun", "ssh"):
            t0 = time.monotonic()
            if launcher == "srun":
                result = bench(over_ssh, "mln[1-4]", "--pattern", "pairwise", "--group-deadline-s", "90")
            else:
                result = bench_ssh(pattern="pairwise", group_deadline_s=90)
            times[launcher].append(round(time.monotonic() - t0, 1))
            iso = result["isolation"]
            assert iso["nodes"] == over_ssh.nodes and iso["rounds"] >= 3, (launcher, result["findings"])
            assert suspects(result) == [] and result["verdict"] in ("ok", "warn"), (launcher, result["findings"])
    with capsys.disabled():
        print(f"\npairwise over mln[1-4], healthy, wall seconds: {times}")
    assert not no_ranks_left(over_ssh) and wait_clean(over_ssh) == []


def test_a_rate_limited_link_is_named_over_ssh(over_ssh):
    rate_limit(over_ssh, "mln3")
    t0 = time.monotonic()
    result = bench_ssh(pattern="pairwise", group_deadline_s=90)
    iso = result["isolation"]
    assert suspects(result) == [("node", ["mln3"])], result["findings"]
    assert "slow again" in iso["suspects"][0]["evidence"] and result["verdict"] == "fail"
    bw = iso["busbw_matrix"]
    assert bw[2][0] < iso["busbw_floor_gbps"] < bw[0][1]
    print(f"pairwise over ssh, 4 nodes, 50 Mbit/s on mln3: {iso['rounds']} rounds, {time.monotonic() - t0:.1f} s")
    assert not no_ranks_left(over_ssh) and wait_clean(over_ssh) == []


def test_a_slow_link_is_named_over_ssh_not_a_node(over_ssh):
    """The twin of test_pairwise_names_a_slow_link_not_a_node: 50 Mbit/s between mln1 and mln2 only (each side
    shapes what it sends to the other); both nodes are fine with their other partners, so the link is named,
    neither node, and no other pair."""
    rate_limit(over_ssh, "mln1", to="mln2")
    rate_limit(over_ssh, "mln2", to="mln1")
    t0 = time.monotonic()
    result = bench_ssh(pattern="pairwise", group_deadline_s=90)
    iso = result["isolation"]
    assert suspects(result) == [("link", ["mln1", "mln2"])], result["findings"]
    assert "fine with their other partners" in iso["suspects"][0]["evidence"] and result["verdict"] == "fail"
    print(f"pairwise over ssh, 4 nodes, 50 Mbit/s mln1-mln2 only: {iso['rounds']} rounds, {time.monotonic() - t0:.1f} s")
    assert not no_ranks_left(over_ssh) and wait_clean(over_ssh) == []


def test_a_host_whose_sshd_is_dead_is_named_alone(over_ssh):
    from tools.evals.drills.cluster import CLUSTER_DIR

    with open(f"{CLUSTER_DIR}/run/sshd-mln2.pid") as f:
        os.kill(int(f.read()), 9)
    result = bench_ssh(pattern="pairwise", group_deadline_s=90)
    iso = result["isolation"]
    assert suspects(result) == [("node", ["mln2"])], result["findings"]
    assert "sshd not answering" in iso["suspects"][0]["evidence"]
    assert all(g["status"] == "ok" for g in iso["groups"] if "mln2" not in g["nodes"]), iso["groups"]
    assert not no_ranks_left(over_ssh) and wait_clean(over_ssh) == []
