"""nic_health for real on the namespace cluster: a node whose link flaps during a fleet_sweep is named with
its carrier changes, and healthy nodes are never flagged (repeated). The flap is injected from outside the
node, on the host end of its veth (`ip link set mlnK-h down/up`), so the node sees its eth0 lose carrier as a
cable pull would show. Inside a node /sys is the host's, so this is also the netlink path of the reader."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import uuid

import pytest

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (fixture)
from tools import fleet_sweep as fs
from tools.evals.drills.cluster import host_link

pytestmark = pytest.mark.slurm


def sweep(**params):
    return fs.SPEC.run(fs.SPEC.Params(partition="debug", checks=["nic_health"], deadline_s=180, **params),
                       lambda f, m: None)


class Flapper:
    """Flap a node's link from the host side until stopped: 0.1 s down every `period_s`."""

    def __init__(self, node: str, period_s: float = 0.7):
        # This instance's veth: a bare f"{node}-h" flapped instance 0's mln3 from a test on instance 1.
        self.link, self.period_s, self.stop_event = host_link(node), period_s, threading.Event()
        self.flaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _ip(self, state: str) -> None:
        subprocess.run(["ip", "link", "set", self.link, state], check=True, capture_output=True, timeout=10)

    def _run(self) -> None:
        while not self.stop_event.wait(self.period_s):
            self._ip("down")
            self.stop_event.wait(0.1)
            self._ip("up")
            self.flaps += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=10)
        self._ip("up")  # whatever happened, the link is left up


def nic_rows(result) -> dict[str, object]:
    return {r.node: r for r in result.rows if r.check == "nic_health"}


def test_healthy_nodes_are_never_flagged(multinode_cluster):  # noqa: F811
    for _ in range(2):
        result = sweep()
        rows = nic_rows(result)
        assert sorted(rows) == multinode_cluster.nodes, result.findings
        assert all(r.verdict == "ok" and not r.problems for r in rows.values()), [r.problems for r in rows.values()]
        assert not result.drain, result.drain


def test_a_flapping_link_names_its_node_with_its_carrier_changes(multinode_cluster):  # noqa: F811
    with Flapper("mln3") as flapper:
        result = sweep()
    assert flapper.flaps >= 3
    rows = nic_rows(result)
    assert sorted(rows) == multinode_cluster.nodes, result.findings
    assert rows["mln3"].verdict == "fail", rows["mln3"].problems
    assert any("eth0:" in p and "carrier changes in the 3" in p and "drain_node" in p for p in rows["mln3"].problems)
    assert [d.node for d in result.drain] == ["mln3"], result.drain
    assert "carrier changes" in " ".join(result.drain[0].reasons)
    assert all(rows[n].verdict == "ok" for n in multinode_cluster.nodes if n != "mln3")


def test_a_net_plugin_on_one_node_only_is_named_as_drift(multinode_cluster, monkeypatch):  # noqa: F811
    """NCCL #1634: a libnccl-net.so found on some nodes only. The plugin folder is on every node's
    LD_LIBRARY_PATH; a tmpfs mounted over it inside mln2's own mount namespace holds the file there only."""
    folder = f"/tmp/mleng-netplugin-{uuid.uuid4().hex[:8]}"
    os.mkdir(folder)
    enter = ["nsenter", "-t", str(multinode_cluster.slurmd_pid("mln2")), "-m"]
    mounted = False
    try:
        subprocess.run([*enter, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", folder], check=True, timeout=10)
        mounted = True
        subprocess.run([*enter, "sh", "-c", f"printf 'not a real plugin' > {folder}/libnccl-net.so"], check=True,
                       timeout=10)
        monkeypatch.setenv("LD_LIBRARY_PATH", folder + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
        result = fs.SPEC.run(fs.SPEC.Params(partition="debug", checks=["env_report"], deadline_s=180),
                             lambda f, m: None)
    finally:
        if mounted:
            subprocess.run([*enter, "umount", folder], timeout=10)
        os.rmdir(folder)
    assert result.nodes_complete == len(multinode_cluster.nodes), result.findings
    drift = {d.field: d for d in result.drift}
    assert "nccl_net_plugin" in drift, result.drift
    assert drift["nccl_net_plugin"].odd_nodes == ["mln2"]
    plugin_value = next(v for v, nodes in drift["nccl_net_plugin"].values.items() if nodes == ["mln2"])
    assert plugin_value.startswith(f"{folder}/libnccl-net.so (sha256 ")
    assert any("nccl_net_plugin" in f and "mln2" in f for f in result.findings), result.findings


def test_pairwise_rdma_without_perftest_or_rdma_names_every_node(multinode_cluster):  # noqa: F811
    """collective_bench transport=rdma on nodes with no RDMA device (and no perftest, where the host has none: the
    namespace nodes share its /usr): each node named with what it lacks, nothing run."""
    proc = multinode_cluster.cmd("salloc", "-N4", "--nodelist=mln[1-4]", "--time=5", sys.executable, "-m",
                                 "tools.collective_bench", "--pattern", "pairwise", "--transport", "rdma",
                                 "--backend", "gloo", "--json", check=False, timeout=300)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "transport: rdma needs perftest and an ACTIVE RDMA port on every node" in said
    lacks = "no RDMA device with an ACTIVE port" + ("" if shutil.which("ib_write_bw") and shutil.which("ib_write_lat")
                                                    else ", perftest not present (ib_write_bw / ib_write_lat not on PATH)")
    for node in multinode_cluster.nodes:
        assert re.search(rf"{node}: {re.escape(lacks)}(;|\. Use transport nccl)", said), said[-1500:]
