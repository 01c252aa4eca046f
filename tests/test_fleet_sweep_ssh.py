"""fleet_sweep over SSH (hosts=[...] without SLURM, engine/transport.py).

First against one sshd of our own on 127.0.0.1 answering for several names (no cluster needed): rows
credited per connection, a dead host named and drained alone, a changed host key named. Then on the
namespace cluster (scripts/cluster-local.sh sshd: one sshd per node, on the node's own address and in
its cpu cgroup), faults injected from outside as in tests/test_fleet_sweep.py: healthy control, a
CPU-capped node, a node whose sshd is dead; and the same nodes swept by srun and by ssh in one run.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (fixture)
from tests.ssh_helpers import keygen, local_sshd, why_no_sshd
from tests.test_fleet_sweep import CPU_CHECKS, sweep, wait_clean
from tools.engine.store import query
from tools.engine.transport import SSH_CONFIG_ENV, TRANSPORT_ENV

pytestmark = pytest.mark.skipif(bool(why_no_sshd()), reason=why_no_sshd() or "")


@pytest.fixture
def over_ssh(monkeypatch):
    """hosts= goes over SSH even where the cluster's SLURM_CONF is set."""
    monkeypatch.setenv(TRANSPORT_ENV, "ssh")
    return lambda config: monkeypatch.setenv(SSH_CONFIG_ENV, str(config))


@pytest.mark.slow
def test_local_healthy_hosts_answer_and_a_dead_one_is_named_alone(over_ssh):
    with local_sshd(["n1", "n2", "n3"], dead=["n4"]) as ssh:
        over_ssh(ssh.config)
        result = sweep(hosts=["n[1-4]"], checks=["env_report"], deadline_s=60, plot=False)
    assert result.target == "ssh (4 nodes)" and result.nodes_complete == 3, result.findings
    assert sorted(r.node for r in result.rows) == ["n1", "n2", "n3"]   # each row under the name ssh reached
    [dead] = result.not_answering
    assert dead.node == "n4" and dead.reason.startswith("ssh could not start its task: sshd not answering"), dead
    assert [d.node for d in result.drain] == ["n4"] and "no SLURM" in result.drain[0].command
    assert not result.refused


def test_local_changed_host_key_is_named_and_nothing_runs(over_ssh):
    with local_sshd(["n1", "n2"]) as ssh:
        over_ssh(ssh.config)
        ssh.known_hosts.write_text(f"{ssh.alias} {keygen(ssh.folder / 'other', 'other')}\n")
        result = sweep(hosts=["n1", "n2"], checks=["env_report"], deadline_s=60, plot=False)
    assert result.rows == [] and result.verdict == "fail"
    assert {m.node for m in result.not_answering} == {"n1", "n2"}
    assert all("host key is not the one in known_hosts" in m.reason for m in result.not_answering), result.not_answering


# --- the namespace cluster -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ssh_cluster(multinode_cluster):  # noqa: F811
    multinode_cluster.script("sshd")
    return multinode_cluster


@pytest.fixture
def cluster_over_ssh(ssh_cluster, over_ssh):
    from tools.evals.drills.cluster import CLUSTER_DIR

    over_ssh(f"{CLUSTER_DIR}/ssh/config")
    return ssh_cluster


@pytest.mark.slurm
def test_cluster_healthy_nodes_answer_every_check_and_none_is_drained(cluster_over_ssh):
    result = sweep(hosts=["mln[1-4]"], checks=CPU_CHECKS, deadline_s=240, plot=False)
    assert result.target == "ssh (4 nodes)" and result.nodes_complete == 4, result.findings
    assert len(result.rows) == 12 and sorted({r.node for r in result.rows}) == cluster_over_ssh.nodes
    assert result.drain == [] and not [o for o in result.outliers if o.status == "confirmed"], result.findings
    assert sorted(r["host"] for r in query(tool="env_report"))[-4:] == cluster_over_ssh.nodes   # the node's own hostname
    assert not result.refused
    assert wait_clean(cluster_over_ssh) == []


@pytest.mark.slurm
def test_cluster_a_cpu_limited_node_is_the_outlier_over_ssh(cluster_over_ssh):
    # As tests/test_fleet_sweep.py's SLURM twin: sshd (and so every session) sits in mln3's cgroup.
    cluster = cluster_over_ssh
    cluster.cpu_limit("mln3", 20)
    seen = []
    try:
        for _ in range(3):
            periods0, throttled0 = cluster.cpu_throttled("mln3")
            result = sweep(hosts=["mln[1-4]"], checks=["cpu_probe"], deadline_s=240, margin_pct=35, plot=False)
            periods, throttled = cluster.cpu_throttled("mln3")
            gflops = {r.node: r.figures["matmul_gflops"] for r in result.rows}
            bound = (throttled - throttled0) / max(1, periods - periods0)
            seen.append((gflops, f"limit bound in {bound:.0%} of periods", f"busy {[b.node for b in result.busy]}"))
            assert result.nodes_complete == 4, result.findings
            if bound >= 0.5:
                break
    finally:
        cluster.heal("mln3")
    if bound < 0.5:
        pytest.skip(f"the 20% CPU limit hardly bound (load {os.getloadavg()[0]:.1f} on 2 cores): {seen}")
    assert {d.node for d in result.drain} == {"mln3"}, (seen, result.findings)
    assert min(gflops, key=gflops.get) == "mln3"
    assert wait_clean(cluster) == []


@pytest.mark.slurm
def test_cluster_a_dead_sshd_is_named_and_no_other_node_is_drained(cluster_over_ssh):
    cluster = cluster_over_ssh
    from tools.evals.drills.cluster import CLUSTER_DIR

    with open(f"{CLUSTER_DIR}/run/sshd-mln2.pid") as f:
        os.kill(int(f.read()), 9)
    try:
        result = sweep(hosts=["mln[1-4]"], checks=["env_report", "gpu_health"], deadline_s=120, plot=False)
    finally:
        cluster.heal("mln2")
    missing = {m.node: m.reason for m in result.not_answering}
    assert list(missing) == ["mln2"] and "sshd not answering" in missing["mln2"], result.findings
    assert sorted({r.node for r in result.rows}) == ["mln1", "mln3", "mln4"] and len(result.rows) == 6
    assert [d.node for d in result.drain] == ["mln2"], result.findings
    assert wait_clean(cluster) == []


@pytest.mark.slurm
def test_cluster_same_nodes_by_srun_and_by_ssh_in_one_run(cluster_over_ssh, monkeypatch, capsys):
    """Both launchers over the same four nodes, alternated, same checks: both complete with no drain, and
    the SSH sweep runs every node at once (its wall time is below the sum of the nodes' check times)."""
    times = {"srun": [], "ssh": []}
    for _ in range(2):
        for launcher in ("srun", "ssh"):
            if launcher == "srun":
                monkeypatch.delenv(TRANSPORT_ENV)
            else:
                monkeypatch.setenv(TRANSPORT_ENV, "ssh")
            t0 = time.monotonic()
            result = sweep(hosts=["mln[1-4]"], checks=CPU_CHECKS, deadline_s=240, plot=False)
            times[launcher].append(round(time.monotonic() - t0, 1))
            assert result.nodes_complete == 4 and result.drain == [], (launcher, result.findings)
            assert result.target.startswith("ssh" if launcher == "ssh" else "hosts"), result.target
            per_node = {n: sum(r.seconds for r in result.rows if r.node == n) for n in cluster_over_ssh.nodes}
            assert times[launcher][-1] < sum(per_node.values()), (launcher, times, per_node)
    with capsys.disabled():
        print(f"\nfleet_sweep {CPU_CHECKS} over mln[1-4], wall seconds: {times}")
    assert wait_clean(cluster_over_ssh) == []
